"""What stands between the network and the routes: the API key, a body size limit, a JSON
parser with a depth limit and a check for text UTF-8 cannot carry, and a last-resort 500
that leaves the connection usable.

RequestGuard is a plain ASGI middleware (so it answers 401 and 413 before a body is read, and
no framework version changes its behaviour); GuardedRoute makes every route's JSON body go
through parse_body instead of a bare json.loads.
"""
import hmac
import json
import logging

from fastapi import Request
from fastapi.routing import APIRoute

from nanovllm.server.errors import APIError, bad_request

logger = logging.getLogger(__name__)

# Our requests nest four levels (body, messages, message, content part): anything past this
# is an attack on the parser, not a request.
MAX_JSON_DEPTH = 32
# The body size limit when none is given: room for a max_model_len prompt at 64 bytes a
# token (long tokens, JSON escapes), plus 1 MiB for the rest of the request.
BYTES_PER_TOKEN, BASE_BODY_BYTES = 64, 1 << 20
# A body over the limit is still read (and dropped) up to this many times the limit, so its
# 413 reaches the client; past that the connection is closed.
DRAIN_FACTOR = 16


def default_max_body_bytes(max_model_len: int) -> int:
    """The body size limit for a model of this context length."""
    return BASE_BODY_BYTES + BYTES_PER_TOKEN * max_model_len


class RequestGuard:
    """ASGI middleware: API key on /v1 routes (401), body size limit (413, checked on the
    Content-Length header and while the body streams in), a JSON Content-Type where none was
    sent, and a JSON 500 for an exception no handler took (logged, not re-raised, so the
    server keeps the connection open and answers its next request)."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope, receive, send):
        """Check an HTTP request's key, size and type, then run the app (errors as JSON)."""
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            early = self._refuse(scope)
            if early is not None:
                if early.status == 413:
                    early = await self._drained(receive, early)
                return await _send_error(early, send_tracked)
            await self.app(self._with_json_type(scope), self._limited(receive), send_tracked)
        except Exception as e:  # noqa: BLE001 - a bug: answer it, keep serving
            if started:
                raise  # half a response is out: only closing the connection can end it
            logger.error("unhandled error on %s %s", scope.get("method"), scope.get("path"),
                         exc_info=e)
            error = APIError(500, f"internal error: {type(e).__name__}: {e}")
            await _send_error(error, send_tracked)

    def _refuse(self, scope) -> APIError | None:
        """401 for a missing or wrong key on /v1; 413 for a declared length over the limit."""
        headers = {k.lower(): v for k, v in scope["headers"]}
        if self.api_key is not None and scope["path"].startswith("/v1"):
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            # compare_digest: the time taken does not tell how much of the key matched
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                    token.strip(), self.api_key.encode()):
                return APIError(401, "missing or invalid API key: send the header "
                                     "'Authorization: Bearer <key>'", code="invalid_api_key")
        length = headers.get(b"content-length", b"0")
        if not length.isdigit():
            return bad_request("the Content-Length header is not a number")
        if int(length) > self.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than this server's limit of "
                             f"{self.max_body_bytes} bytes (nanovllm serve "
                             f"--max-request-bytes)", code="request_too_large")

    async def _drained(self, receive, error: APIError, received: int = 0) -> APIError:
        """error, once the rest of the body has been read and dropped. Closing a socket with
        unread data resets it, and the reset can destroy the response on its way to the
        client; a body too large even to drop gets Connection: close instead (its client
        may see a reset)."""
        total, more = received, True
        while more and total <= DRAIN_FACTOR * self.max_body_bytes:
            message = await receive()
            if message["type"] != "http.request":
                break
            total += len(message.get("body", b""))
            more = message.get("more_body", False)
        if more:
            error.headers = {"Connection": "close"}
        return error

    def _limited(self, receive):
        """receive(), raising the 413 (the body drained) once the body passes the limit."""
        total = 0

        async def limited():
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > self.max_body_bytes:
                    error = self._too_large()
                    if message.get("more_body", False):
                        error = await self._drained(receive, error, total)
                    raise error
            return message

        return limited

    @staticmethod
    def _with_json_type(scope):
        """A POST without a Content-Type is read as JSON (curl -d, old clients), whatever
        the framework's version defaults to."""
        if scope.get("method") != "POST" or any(k.lower() == b"content-type"
                                                for k, _ in scope["headers"]):
            return scope
        return {**scope, "headers": [*scope["headers"], (b"content-type", b"application/json")]}


async def _send_error(error: APIError, send) -> None:
    response = error.response()
    await response({"type": "http"}, _nothing, send)


async def _nothing():
    return {"type": "http.disconnect"}


class GuardedRequest(Request):
    """A Request whose json() is parse_body's."""

    async def json(self):
        """The body parsed by parse_body (once, then cached)."""
        if not hasattr(self, "_json"):
            self._json = parse_body(await self.body())
        return self._json


class GuardedRoute(APIRoute):
    """An APIRoute that hands its handler a GuardedRequest (FastAPI's documented way to
    change how a route reads its body)."""

    def get_route_handler(self):
        """The route's handler, handed a GuardedRequest."""
        handler = super().get_route_handler()

        async def guarded(request: Request):
            return await handler(GuardedRequest(request.scope, request.receive))

        return guarded


def parse_body(body: bytes):
    """The JSON value of a request body; 400 naming the problem for malformed JSON, nesting
    deeper than MAX_JSON_DEPTH, or a string that is not valid UTF-8 text (a lone surrogate,
    escaped or raw)."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise bad_request(f"the request body is not valid JSON ({e})") from None
    # Iterative, so a deep body cannot exhaust the stack here either.
    stack = [(value, 0, "")]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            _check_text(item, path)
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise _too_deep()
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in pairs:
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str):
                _check_text(key, where)
            stack.append((child, depth + 1, where))
    return value


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_request(f"{path or 'request body'}: not valid UTF-8 text ({e.reason} at "
                          f"character {e.start}); send well-formed Unicode",
                          path or None) from None


def _too_deep() -> APIError:
    return bad_request(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
