"""The OpenAI-compatible HTTP app: the API key and body guard around the routes (routes.py).

build_app wraps an AsyncLLM (and stops it with the server only if told it owns it); run_server
builds one, serves until uvicorn stops on SIGINT/SIGTERM, and the engine stops with it.
"""
import asyncio
import logging
import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI

from nanovllm.async_llm import AsyncLLM, EngineDeadError
from nanovllm.server.errors import install_handlers
from nanovllm.server.guard import GuardedRoute, RequestGuard, default_max_body_bytes
from nanovllm.server.routes import OpenAIRoutes

logger = logging.getLogger(__name__)


def build_app(engine: AsyncLLM, served_model_name: str, api_key: str | None = None,
              chat_template: str | None = None, owns_engine: bool = False,
              max_request_bytes: int | None = None) -> FastAPI:
    """A FastAPI app serving `engine` under the model name `served_model_name`; with
    `api_key`, every /v1 route wants `Authorization: Bearer <api_key>`; with `owns_engine`,
    the engine is shut down when the app's server stops. Request bodies over
    `max_request_bytes` (default: from max_model_len, see guard.default_max_body_bytes) get
    a 413."""
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise ValueError(f"api_key must be None (no key) or a non-empty string, got "
                         f"{api_key!r}")
    if max_request_bytes is None:
        max_request_bytes = default_max_body_bytes(engine.config.max_model_len)
    if isinstance(max_request_bytes, bool) or not isinstance(max_request_bytes, int) \
            or max_request_bytes < 1:
        raise ValueError(f"max_request_bytes must be a positive integer (bytes), got "
                         f"{max_request_bytes!r}")
    routes = OpenAIRoutes(engine, served_model_name, chat_template)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        routes.close()
        if owns_engine:
            # Here, not after uvicorn's run() returns: on SIGTERM uvicorn re-raises the
            # signal once it has stopped, and the process dies before any code after run().
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="nanovllm", summary="OpenAI-compatible completions and chat",
                  lifespan=lifespan)
    app.router.route_class = GuardedRoute
    app.add_middleware(RequestGuard, api_key=api_key, max_body_bytes=max_request_bytes)
    install_handlers(app)
    routes.install(app)
    return app


def run_server(model: str, host: str = "127.0.0.1", port: int = 8000,
               api_key: str | None = None, served_model_name: str | None = None,
               chat_template: str | None = None, log_level: str = "info",
               max_request_bytes: int | None = None, **engine_kwargs) -> None:
    """Serve `model` over HTTP until SIGINT/SIGTERM; engine_kwargs go to AsyncLLM (as to
    LLM). Blocks; the engine is shut down when uvicorn returns. If the engine core dies, the
    server stops and this raises EngineDeadError (`nanovllm serve` then exits with status 1,
    so that a supervisor restarts it, as vLLM's server does)."""
    import uvicorn

    engine = AsyncLLM(model, **engine_kwargs)
    died = threading.Event()
    try:
        app = build_app(engine, served_model_name or model, api_key, chat_template,
                        owns_engine=True, max_request_bytes=max_request_bytes)
        # uvicorn handles SIGINT/SIGTERM: it drains the connections, runs the app's
        # shutdown (which stops the engine), then returns or re-raises the signal.
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))

        def watch() -> None:
            engine.wait_stopped()
            if engine.error is not None:  # not a shutdown: the core died
                logger.error("the engine core died (%s): stopping the server",
                             engine.error)
                died.set()
                server.should_exit = True

        threading.Thread(target=watch, name="nanovllm-engine-watch", daemon=True).start()
        server.run()
    finally:
        engine.shutdown()  # idempotent; covers a server that failed to start
    if died.is_set():
        raise EngineDeadError(f"the engine core died: {engine.error}")
