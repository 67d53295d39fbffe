"""The OpenAI-compatible HTTP app: routes, API key, request parsing, prompt preparation.

build_app wraps an AsyncLLM (and stops it with the server only if told it owns it); run_server
builds one, serves until uvicorn stops on SIGINT/SIGTERM, and the engine stops with it.
"""
import asyncio
import hmac
import json
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from nanovllm.engine.async_llm import AsyncLLM
from nanovllm.engine.tokenizer import chat_prompt
from nanovllm.server.errors import APIError, bad_request, from_validation, install_handlers
from nanovllm.server.protocol import ChatCompletionRequest, CompletionRequest, check_length
from nanovllm.server.serving import respond


def build_app(engine: AsyncLLM, served_model_name: str, api_key: str | None = None,
              chat_template: str | None = None, owns_engine: bool = False) -> FastAPI:
    """A FastAPI app serving `engine` under the model name `served_model_name`; with
    `api_key`, every /v1 route wants `Authorization: Bearer <api_key>`; with `owns_engine`,
    the engine is shut down when the app's server stops."""
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise ValueError(f"api_key must be None (no key) or a non-empty string, got "
                         f"{api_key!r}")

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        if owns_engine:
            # Here, not after uvicorn's run() returns: on SIGTERM uvicorn re-raises the
            # signal once it has stopped, and the process dies before any code after run().
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="nanovllm", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    install_handlers(app)
    created = int(time.time())
    max_len = engine.config.max_model_len
    vocab = engine.config.hf_config.vocab_size

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # compare_digest: the time taken does not tell how much of the key matched
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), api_key.encode()):
            raise APIError(401, "missing or invalid API key: send the header "
                                "'Authorization: Bearer <key>'", code="invalid_api_key")

    async def parse(request: Request, model_cls):
        check_key(request)
        try:
            data = json.loads(await request.body())
        except ValueError as e:
            raise bad_request(f"the request body is not valid JSON ({e})") from e
        if not isinstance(data, dict):
            raise bad_request("the request body must be a JSON object")
        try:
            req = model_cls.model_validate(data)
        except ValidationError as e:
            raise from_validation(e) from e
        if req.model != served_model_name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves "
                                f"{served_model_name!r}", "model", code="model_not_found")
        req.refuse_unsupported()
        if not engine.is_running:
            raise APIError(503, "the engine is not running", code="engine_dead")
        return req

    @app.get("/health")
    async def health() -> Response:
        if engine.is_running:
            return Response(status_code=200)
        reason = f": {engine.error!r}" if engine.error is not None else ""
        return APIError(503, f"the engine is not running{reason}", code="engine_dead").response()

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        check_key(request)
        card = {"id": served_model_name, "object": "model", "created": created,
                "owned_by": "nanovllm", "max_model_len": max_len}
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await parse(request, CompletionRequest)
        prompts = [_completion_prompt(engine, p, vocab) for p in req.prompts()]
        room = min(check_length(len(p["prompt_token_ids"]), req.max_tokens, max_len, "prompt")
                   for p in prompts)
        sp = req.sampling_params(room, req.logprobs)
        return await respond(request, engine, served_model_name, prompts, sp, chat=False,
                             top_logprobs=req.logprobs, stream=bool(req.stream),
                             include_usage=req.include_usage)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = await parse(request, ChatCompletionRequest)
        conversation = [m.as_dict() for m in req.messages]
        try:
            prompt = chat_prompt(engine.tokenizer, conversation, chat_template)
        except ValueError as e:
            raise bad_request(str(e), "messages") from e
        room = check_length(len(prompt["prompt_token_ids"]), req.requested_max_tokens(),
                            max_len, "messages")
        logprobs = req.engine_logprobs()
        sp = req.sampling_params(room, logprobs)
        return await respond(request, engine, served_model_name, [prompt], sp, chat=True,
                             top_logprobs=logprobs, stream=bool(req.stream),
                             include_usage=req.include_usage)

    return app


def _completion_prompt(engine: AsyncLLM, prompt: str | list[int], vocab: int) -> dict:
    """A prompt dict with its token ids (counted here for max_tokens and usage)."""
    if isinstance(prompt, str):
        if engine.tokenizer is None:
            raise bad_request("this server has no tokenizer: send prompts as token ids",
                              "prompt")
        ids = engine.tokenizer.encode(prompt)
        if not ids:
            raise bad_request("the prompt is empty: give at least one token", "prompt")
        return {"prompt": prompt, "prompt_token_ids": ids}
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}", "prompt")
    return {"prompt_token_ids": list(prompt)}


def run_server(model: str, host: str = "127.0.0.1", port: int = 8000,
               api_key: str | None = None, served_model_name: str | None = None,
               chat_template: str | None = None, log_level: str = "info",
               **engine_kwargs) -> None:
    """Serve `model` over HTTP until SIGINT/SIGTERM; engine_kwargs go to AsyncLLM (as to
    LLM). Blocks; the engine is shut down when uvicorn returns."""
    import uvicorn

    engine = AsyncLLM(model, **engine_kwargs)
    try:
        app = build_app(engine, served_model_name or model, api_key, chat_template,
                        owns_engine=True)
        # uvicorn handles SIGINT/SIGTERM: it drains the connections, runs the app's
        # shutdown (which stops the engine), then returns or re-raises the signal.
        uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level)).run()
    finally:
        engine.shutdown()  # idempotent; covers a server that failed to start
