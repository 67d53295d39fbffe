"""OpenAI-shaped errors: one exception type for the handlers, one JSON body for every failure.

Every error the server sends reads {"error": {"message", "type", "param", "code"}}, the shape
the openai client parses into its APIError classes, whatever went wrong (a bad field, a bad
key, an unknown route, a dead engine).
"""
import logging

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from nanovllm.engine.client import EngineDeadError, RequestFailedError

logger = logging.getLogger(__name__)


class APIError(HTTPException):
    """An error to send to the client as OpenAI's JSON error, with its HTTP status (an
    HTTPException, so that the framework passes it through even from body parsing)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(status, message, headers)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _DEFAULT_TYPES.get(status, "invalid_request_error")

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        """The JSON body: {"error": {...}}."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        """The error as a JSON response."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


# OpenAI's error types by status; 4xx not listed are invalid_request_error.
_DEFAULT_TYPES = {401: "authentication_error", 500: "server_error", 503: "server_error"}


def bad_request(message: str, param: str | None = None) -> APIError:
    """A 400 invalid_request_error."""
    return APIError(400, message, param)


def from_validation(error: ValidationError | RequestValidationError) -> APIError:
    """pydantic's first complaint as a 400 naming the field (OpenAI sends 400, not 422)."""
    first = error.errors()[0]
    raw = [str(p) for p in first.get("loc", ()) if p != "body"]
    loc = [p for p in raw if not _is_union_tag(p)]
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        message = f"{param!r} is not a supported field of this request"
    elif len(loc) < len(raw):  # a union: the first member's complaint would mislead
        message = f"{param}: {_short(first.get('input'))} is none of the accepted forms"
    else:
        message = f"{param or 'request body'}: {first.get('msg', 'invalid value')}"
        if "input" in first and param is not None and first.get("type") != "missing":
            message += f" (got {_short(first['input'])})"
    return bad_request(message, param)


def engine_error(error: BaseException) -> APIError:
    """An engine failure: 503 when the engine is gone, 500 for anything else (logged: the
    client sees one line, the operator needs the traceback)."""
    if isinstance(error, EngineDeadError):
        return APIError(503, str(error), code="engine_dead")
    if isinstance(error, RequestFailedError):  # the engine logged the step's traceback
        return APIError(500, str(error), code="request_failed")
    logger.error("request failed", exc_info=error)
    return APIError(500, f"internal error: {type(error).__name__}: {error}")


def install_handlers(app: FastAPI) -> None:
    """Make every error the app can raise come back in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        return from_validation(exc).response()

    # No handler for Exception: Starlette re-raises after such a handler answers, and
    # uvicorn then drops the keep-alive connection; RequestGuard answers a bug's 500 instead.

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        code = "not_found" if exc.status_code == 404 else None
        # headers: a 405 names the allowed methods in Allow
        return APIError(exc.status_code, str(exc.detail), code=code,
                        headers=exc.headers).response()


def _is_union_tag(part: str) -> bool:
    """pydantic names the union member it tried in the error location (str, list[int],
    TextPart): not a field, so not part of the param."""
    return "[" in part or part in ("str", "int", "float", "bool") or part[:1].isupper()


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
