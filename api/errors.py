"""Error bodies in OpenAI's shape ({"error": {message, type, param, code}}) and their handlers."""

import json
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               409: "invalid_request_error", 413: "invalid_request_error",
               422: "invalid_request_error", 503: "service_unavailable"}


class APIError(Exception):
    """An error with an HTTP status and the request field it is about."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def field_path(loc: Sequence[Any]) -> str:
    """`("body", "messages", 0, "role")` -> `messages[0].role`."""
    out = ""
    for part in loc:
        if part in ("body", "query", "path", "header") and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_type_tag(str(part)):
            out += f".{part}" if out else str(part)
    return out


def _is_type_tag(part: str) -> bool:
    """pydantic puts union member names (`str`, `list[int]`, `function-after[...]`) in locs."""
    return part in ("str", "int", "float", "bool") or "[" in part


def describe_errors(errors: Sequence[Any]) -> tuple[str, str | None]:
    """One message naming every bad field, and the first field's name."""
    seen: dict[str, str] = {}
    for err in errors:
        path = field_path(err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "json_invalid":
            where = err.get("loc", ())[-1]
            path = "body"
            msg = f"malformed JSON at character {where} ({err.get('ctx', {}).get('error', msg)})"
        seen.setdefault(path, msg)
    parts = [f"{path}: {msg}" if path else msg for path, msg in seen.items()]
    first = next(iter(seen), None)
    return "; ".join(parts), first or None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_errors(exc.errors())
        return error_response(422, message, param)

    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(json.JSONDecodeError)
    async def _json(_: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return error_response(422, f"malformed JSON body ({exc})")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(503, f"server error: {type(exc).__name__}: {exc}")
