"""The OpenAI-compatible routes over one AsyncLLM: admission, prompt preparation, handlers."""
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from nanovllm.async_llm import AsyncLLM
from nanovllm.engine.tokenizer import chat_prompt
from nanovllm.server.errors import APIError, bad_request
from nanovllm.server.metrics import CONTENT_TYPE, ServerMetrics
from nanovllm.server.protocol import ChatCompletionRequest, CompletionRequest, check_length
from nanovllm.server.serving import respond
from nanovllm.structured import validate as validate_structured


class OpenAIRoutes:
    """The handlers of /health, /metrics, /v1/models, /v1/completions and
    /v1/chat/completions."""

    def __init__(self, engine: AsyncLLM, served_model_name: str,
                 chat_template: str | None = None):
        self.engine = engine
        self.served_model_name = served_model_name
        self.chat_template = chat_template
        self.max_len = engine.config.max_model_len
        # generation_config.json's values for fields a request leaves out (vLLM's server too).
        self.sampling_defaults = engine.config.generation_defaults.sampling
        self.vocab = engine.config.hf_config.vocab_size
        self.created = int(time.time())
        # Tokenizing a long prompt takes seconds: on the event loop it would stall every
        # stream and /health. One thread: a Rust tokenizer must not be called from two at once.
        self.tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="nanovllm-tokenize")
        self.metrics = ServerMetrics(engine, served_model_name)

    def install(self, app) -> None:
        """Register the routes on a FastAPI app."""
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/metrics", self.prometheus, methods=["GET"])
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        app.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"])

    def close(self) -> None:
        """Stop the tokenizer thread (queued work is dropped)."""
        self.tokenize_pool.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, fn, *args):
        """fn(*args) on the tokenizer thread."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenize_pool, fn, *args)

    def admit(self, req) -> None:
        """404 for another model's name, 400 for unsupported fields, 503 without an engine."""
        if req.model != self.served_model_name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves "
                                f"{self.served_model_name!r}", "model", code="model_not_found")
        req.refuse_unsupported()
        if not self.engine.is_running:
            raise APIError(503, "the engine is not running", code="engine_dead")

    async def check_structured(self, req, sp) -> None:
        """400 naming the field when the request's schema, regex or grammar is invalid;
        parsed here, off the event loop (the first one imports the grammar library)."""
        if sp.structured_outputs is None:
            return
        if self.engine.tokenizer is None:
            raise bad_request("structured output needs a tokenizer, which this server does "
                              "not have", req.structured_field)
        try:
            await self.off_loop(validate_structured, sp.structured_outputs)
        except ValueError as e:
            raise bad_request(str(e), req.structured_field) from e

    async def completion_prompt(self, prompt: str | list[int]) -> dict:
        """A prompt dict with its token ids (counted here for max_tokens and usage)."""
        if not isinstance(prompt, str):
            bad = [t for t in prompt if not 0 <= t < self.vocab]
            if bad:
                raise bad_request(f"prompt token ids must be in [0, {self.vocab}); got "
                                  f"{bad[:5]}", "prompt")
            return {"prompt_token_ids": list(prompt)}
        if self.engine.tokenizer is None:
            raise bad_request("this server has no tokenizer: send prompts as token ids",
                              "prompt")
        ids = await self.off_loop(self.engine.tokenizer.encode, prompt)
        if not ids:
            raise bad_request("the prompt is empty: give at least one token", "prompt")
        return {"prompt": prompt, "prompt_token_ids": ids}

    async def echo_text(self, prompt: dict) -> str:
        """A prompt's text for echo: as sent, or its token ids decoded."""
        if "prompt" in prompt:
            return prompt["prompt"]
        if self.engine.tokenizer is None:
            raise bad_request("echo needs the tokenizer to turn token ids into text, and this "
                              "server has none: leave echo out", "echo")
        return await self.off_loop(self.engine.tokenizer.decode, prompt["prompt_token_ids"])

    async def health(self) -> Response:
        """200 while the engine runs, 503 once it has stopped."""
        if self.engine.is_running:
            return Response(status_code=200)
        error = self.engine.error
        reason = f": {error!r}" if error is not None else ""
        return APIError(503, f"the engine is not running{reason}", code="engine_dead").response()

    async def prometheus(self) -> Response:
        """The Prometheus metrics, in its text format."""
        # Off the loop: reading the engine's stats waits for a round trip to the core.
        body = await asyncio.to_thread(self.metrics.render)
        return Response(body, media_type=CONTENT_TYPE)

    async def models(self) -> JSONResponse:
        """The one model this server serves."""
        card = {"id": self.served_model_name, "object": "model", "created": self.created,
                "owned_by": "nanovllm", "max_model_len": self.max_len}
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(self, req: CompletionRequest, request: Request) -> Response:
        """OpenAI's completions: one prompt or a batch of them, text or token ids."""
        self.admit(req)
        prompts = [await self.completion_prompt(p) for p in req.prompts()]
        room = min(check_length(len(p["prompt_token_ids"]), req.max_tokens, self.max_len,
                                "prompt") for p in prompts)
        sp = req.sampling_params(room, req.logprobs, self.sampling_defaults,
                                 req.prompt_logprobs())
        await self.check_structured(req, sp)
        echo = [await self.echo_text(p) for p in prompts] if req.echo else None
        return await respond(request, self.engine, self.served_model_name, prompts, sp,
                             chat=False, top_logprobs=req.logprobs, stream=bool(req.stream),
                             include_usage=req.include_usage, metrics=self.metrics,
                             echo=echo)

    async def chat_completions(self, req: ChatCompletionRequest, request: Request) -> Response:
        """OpenAI's chat completions: one conversation through the chat template."""
        self.admit(req)
        conversation = [m.as_dict() for m in req.messages]
        tools = req.tool_plan()
        try:
            prompt = await self.off_loop(chat_prompt, self.engine.tokenizer, conversation,
                                         self.chat_template, True,
                                         None if tools is None else tools.tools)
        except ValueError as e:
            raise bad_request(str(e), "messages") from e
        room = check_length(len(prompt["prompt_token_ids"]), req.requested_max_tokens(),
                            self.max_len, "messages")
        logprobs = req.engine_logprobs()
        sp = req.sampling_params(room, logprobs, self.sampling_defaults)
        await self.check_structured(req, sp)
        return await respond(request, self.engine, self.served_model_name, [prompt], sp,
                             chat=True, top_logprobs=logprobs, stream=bool(req.stream),
                             include_usage=req.include_usage, metrics=self.metrics,
                             tools=tools)
