"""The OpenAI-compatible HTTP app: routes, API key, request parsing, prompt preparation.

build_app wraps an AsyncLLM (and stops it with the server only if told it owns it); run_server
builds one, serves until uvicorn stops on SIGINT/SIGTERM, and the engine stops with it.
"""
import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from nanovllm.async_llm import AsyncLLM, EngineDeadError
from nanovllm.engine.tokenizer import chat_prompt
from nanovllm.server.errors import APIError, bad_request, install_handlers
from nanovllm.server.guard import GuardedRoute, RequestGuard, default_max_body_bytes
from nanovllm.server.protocol import ChatCompletionRequest, CompletionRequest, check_length
from nanovllm.server.serving import respond

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
    max_len = engine.config.max_model_len
    # generation_config.json's values for fields a request leaves out (vLLM's server too).
    sampling_defaults = engine.config.generation_defaults.sampling
    if max_request_bytes is None:
        max_request_bytes = default_max_body_bytes(max_len)
    if isinstance(max_request_bytes, bool) or not isinstance(max_request_bytes, int) \
            or max_request_bytes < 1:
        raise ValueError(f"max_request_bytes must be a positive integer (bytes), got "
                         f"{max_request_bytes!r}")
    # Tokenizing a long prompt takes seconds: on the event loop it would stall every stream
    # and /health. One thread: a Rust tokenizer must not be called from two at once.
    tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="nanovllm-tokenize")

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        tokenize_pool.shutdown(wait=False, cancel_futures=True)
        if owns_engine:
            # Here, not after uvicorn's run() returns: on SIGTERM uvicorn re-raises the
            # signal once it has stopped, and the process dies before any code after run().
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="nanovllm", summary="OpenAI-compatible completions and chat",
                  lifespan=lifespan)
    app.router.route_class = GuardedRoute
    app.add_middleware(RequestGuard, api_key=api_key, max_body_bytes=max_request_bytes)
    install_handlers(app)
    created = int(time.time())
    vocab = engine.config.hf_config.vocab_size

    async def off_loop(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(tokenize_pool, fn, *args)

    def admit(req):
        """404 for another model's name, 400 for unsupported fields, 503 without an engine."""
        if req.model != served_model_name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves "
                                f"{served_model_name!r}", "model", code="model_not_found")
        req.refuse_unsupported()
        if not engine.is_running:
            raise APIError(503, "the engine is not running", code="engine_dead")

    async def completion_prompt(prompt: str | list[int]) -> dict:
        """A prompt dict with its token ids (counted here for max_tokens and usage)."""
        if not isinstance(prompt, str):
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise bad_request(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}",
                                  "prompt")
            return {"prompt_token_ids": list(prompt)}
        if engine.tokenizer is None:
            raise bad_request("this server has no tokenizer: send prompts as token ids",
                              "prompt")
        ids = await off_loop(engine.tokenizer.encode, prompt)
        if not ids:
            raise bad_request("the prompt is empty: give at least one token", "prompt")
        return {"prompt": prompt, "prompt_token_ids": ids}

    @app.get("/health")
    async def health() -> Response:
        """200 while the engine runs, 503 once it has stopped."""
        if engine.is_running:
            return Response(status_code=200)
        reason = f": {engine.error!r}" if engine.error is not None else ""
        return APIError(503, f"the engine is not running{reason}", code="engine_dead").response()

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        """The one model this server serves."""
        card = {"id": served_model_name, "object": "model", "created": created,
                "owned_by": "nanovllm", "max_model_len": max_len}
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        """OpenAI's completions: one prompt or a batch of them, text or token ids."""
        admit(req)
        prompts = [await completion_prompt(p) for p in req.prompts()]
        room = min(check_length(len(p["prompt_token_ids"]), req.max_tokens, max_len, "prompt")
                   for p in prompts)
        sp = req.sampling_params(room, req.logprobs, sampling_defaults)
        return await respond(request, engine, served_model_name, prompts, sp, chat=False,
                             top_logprobs=req.logprobs, stream=bool(req.stream),
                             include_usage=req.include_usage)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        """OpenAI's chat completions: one conversation through the chat template."""
        admit(req)
        conversation = [m.as_dict() for m in req.messages]
        try:
            prompt = await off_loop(chat_prompt, engine.tokenizer, conversation, chat_template)
        except ValueError as e:
            raise bad_request(str(e), "messages") from e
        room = check_length(len(prompt["prompt_token_ids"]), req.requested_max_tokens(),
                            max_len, "messages")
        logprobs = req.engine_logprobs()
        sp = req.sampling_params(room, logprobs, sampling_defaults)
        return await respond(request, engine, served_model_name, [prompt], sp, chat=True,
                             top_logprobs=logprobs, stream=bool(req.stream),
                             include_usage=req.include_usage)

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
