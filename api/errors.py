"""Error bodies in OpenAI's shape ({"error": {message, type, param, code}}) and their handlers."""

import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    503: "service_unavailable",
}
# pydantic's errors for a body that is not a JSON object at all (its loc is just ("body",))
NOT_AN_OBJECT = {"missing", "model_type", "model_attributes_type", "dict_type"}
JSON_KINDS = {
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "an array",
}


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


def not_an_object(err: dict[str, Any]) -> str:
    """Why a body that is not a JSON object was refused, saying what it was instead."""
    got = err.get("input")
    if err.get("type") == "missing":
        return "must be a JSON object; the body is empty"
    if isinstance(got, bytes):
        return "must be a JSON object sent with content-type: application/json"
    return f"must be a JSON object, not {JSON_KINDS.get(type(got), type(got).__name__)}"


def describe_errors(errors: Sequence[Any]) -> tuple[str, str | None]:
    """One message naming every bad field, and the first field's name."""
    seen: dict[str, str] = {}
    for err in errors:
        loc = tuple(err.get("loc", ()))
        path = field_path(loc)
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "json_invalid":
            path = "body"
            msg = f"malformed JSON at character {loc[-1]} ({err.get('ctx', {}).get('error', msg)})"
        elif loc == ("body",) and err.get("type") in NOT_AN_OBJECT:
            path, msg = "body", not_an_object(err)
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
        if exc.status_code == 400 and exc.__cause__ is not None:
            return error_response(422, unparsable_body(exc.__cause__), "body")
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(json.JSONDecodeError)
    async def _json(_: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return error_response(422, f"malformed JSON body ({exc})")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(503, f"server error: {type(exc).__name__}: {exc}")


def unparsable_body(cause: BaseException) -> str:
    """What stopped the JSON parser: FastAPI turns these into a bare 400, we name them."""
    if isinstance(cause, UnicodeDecodeError):
        return (
            f"body: not valid UTF-8 (byte {cause.object[cause.start]:#04x} at offset {cause.start})"
        )
    if isinstance(cause, RecursionError):
        return "body: JSON nested too deeply"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return f"body: a number has more than {sys.get_int_max_str_digits()} digits"
    return f"body: could not be parsed as JSON ({type(cause).__name__}: {cause})"
