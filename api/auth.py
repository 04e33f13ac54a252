"""Bearer-key guard for every endpoint (websockets too) and a request body size limit."""

import hmac
import json
import re
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import error_body

ADMIN_ROUTES = (
    ("PATCH", re.compile(r"/api/knobs")),
    ("PUT", re.compile(r"/api/autopilot")),
    ("POST", re.compile(r"/api/experts/rebalance")),
    ("DELETE", re.compile(r"/api/sessions/[^/]+")),
    ("POST", re.compile(r"/api/sessions/[^/]+/(rerun|label)")),
)


def _token(scope: Scope) -> str | None:
    """The bearer token; websockets may pass it as `?token=` since browsers cannot set headers."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token:
                return token.strip()
    if scope["type"] == "websocket":
        tokens = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
        if tokens:
            return tokens[0]
    return None


def _matches(token: str | None, key: str | None) -> bool:
    return token is not None and key is not None and hmac.compare_digest(token, key)


async def _send_json(send: Send, status: int, body: dict, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _refuse_websocket(receive: Receive, send: Send, status: int, message: str) -> None:
    """Accept, say why in `{"error", "code"}` (as the websockets' other refusals do) and close
    with 1008 and the same reason: a browser sees neither the status nor the body of a
    handshake refused over HTTP, only a message and a close frame."""
    await receive()
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": json.dumps({"error": message, "code": status})})
    await send({"type": "websocket.close", "code": 1008, "reason": message})


class GuardMiddleware:
    """Refuses unauthenticated requests (401), non-admin knob changes (403), big bodies (413)."""

    def __init__(
        self, app: ASGIApp, api_key: str | None, admin_key: str | None, max_body_bytes: int
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.admin_key = admin_key
        self.max_body_bytes = max_body_bytes

    def _allowed(self, scope: Scope) -> tuple[bool, int, str]:
        token = _token(scope)
        method, path = scope.get("method"), scope["path"].rstrip("/")
        admin_route = any(m == method and p.fullmatch(path) for m, p in ADMIN_ROUTES)
        if admin_route and self.admin_key is not None:
            what = "knob changes need" if path == "/api/knobs" else f"{method} {path} needs"
            if _matches(token, self.admin_key):
                return True, 200, ""
            if token is None or not _matches(token, self.api_key):
                return False, 401, f"{what} the admin key (Authorization: Bearer)"
            return False, 403, f"{what} the admin key, not the API key"
        if self.api_key is None or _matches(token, self.api_key) or _matches(token, self.admin_key):
            return True, 200, ""
        return False, 401, "missing or invalid API key (Authorization: Bearer <key>)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        ok, status, message = self._allowed(scope)
        if not ok:
            if scope["type"] == "websocket":
                await _refuse_websocket(receive, send, status, message)
            else:
                await _send_json(
                    send, status, error_body(status, message), [(b"www-authenticate", b"Bearer")]
                )
            return
        if scope["type"] == "http" and self._too_big(scope):
            await _send_json(
                send,
                413,
                error_body(413, f"request body is larger than {self.max_body_bytes} bytes"),
            )
            return
        await self.app(scope, receive, send)

    def _too_big(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    return int(value) > self.max_body_bytes
                except ValueError:
                    return True
        return False
