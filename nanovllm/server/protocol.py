"""The OpenAI request bodies the server accepts, and their mapping to SamplingParams.

Fields follow OpenAI's API (plus vLLM's sampling extras: top_k, min_p, repetition_penalty,
min_tokens, ignore_eos, stop_token_ids). Unknown fields are refused with a 400 rather than
ignored, so a client never believes a setting took effect when it did not; the few OpenAI
fields that exist but are not implemented (suffix, best_of > n, logit_bias) are refused by
name. Structured output: OpenAI's response_format (json_object, json_schema) or vLLM's
structured_outputs extra (see structured.py); tools: see tools.py; chat messages: see
messages.py.
"""
import re
from typing import Annotated, Any

from pydantic import BaseModel, Field

from nanovllm.sampling_params import (INT64_MAX, INT64_MIN, MAX_LOGPROBS, MAX_N,
                                      MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, SamplingParams)
from nanovllm.server.errors import APIError, bad_request
from nanovllm.server.messages import STRICT, ChatMessage
from nanovllm.server.structured import structured_outputs_params
from nanovllm.server.tools import ToolPlan, plan_tools
from nanovllm.structured.params import StructuredOutputsParams

# Choices one request may ask for (prompts x n): a guard against one request filling the
# engine with sequences.
MAX_CHOICES = 1024
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]
TokenIds = list[TokenId]
Count = Annotated[int, Field(ge=1, le=INT64_MAX)]


class StreamOptions(BaseModel):
    """stream_options: include_usage adds a last chunk with the token counts."""

    model_config = STRICT
    include_usage: bool | None = False


class _Sampling(BaseModel):
    """The fields completions and chat share."""

    model_config = STRICT
    model: str
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(1, ge=1, le=MAX_N)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(0.0, ge=-2, le=2)
    frequency_penalty: float | None = Field(0.0, ge=-2, le=2)
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extras
    top_k: int | None = Field(None, ge=-1, le=INT64_MAX)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    min_tokens: int | None = Field(0, ge=0, le=INT64_MAX)
    ignore_eos: bool | None = False
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    # Structured output: OpenAI's field, or vLLM's extra ({"json": schema}, {"regex": ...},
    # {"choice": [...]}, {"grammar": ...}, {"json_object": true}).
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        """400 for OpenAI fields that are recognised but not implemented."""
        if self.logit_bias:
            raise bad_request("logit_bias is not supported by this server", "logit_bias")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream=true",
                              "stream_options")

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_tokens: int, logprobs: int | None,
                        defaults: dict | None = None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """The engine's SamplingParams; where a field is null or absent, the model's
        generation_config.json value from `defaults` (as vLLM's server does), else OpenAI's."""
        model = defaults or {}

        def pick(value, default, name=None):
            return model.get(name, default) if value is None else value

        try:
            return SamplingParams(
                temperature=pick(self.temperature, 1.0, "temperature"),
                top_p=pick(self.top_p, 1.0, "top_p"), top_k=pick(self.top_k, -1, "top_k"),
                min_p=pick(self.min_p, 0.0, "min_p"),
                max_tokens=max_tokens, ignore_eos=bool(self.ignore_eos), seed=self.seed,
                stop_token_ids=self.stop_token_ids, stop=self.stop, n=pick(self.n, 1),
                repetition_penalty=pick(self.repetition_penalty, 1.0, "repetition_penalty"),
                presence_penalty=pick(self.presence_penalty, 0.0),
                frequency_penalty=pick(self.frequency_penalty, 0.0),
                min_tokens=pick(self.min_tokens, 0), logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                structured_outputs=self.structured_outputs_params())
        except ValueError as e:
            # SamplingParams names the field as "SamplingParams.<field>..."
            text = str(e)
            field = re.match(r"SamplingParams\.(\w+)", text)
            raise bad_request(text, field.group(1) if field else None) from e

    @property
    def structured_field(self) -> str:
        """The field that asked for structured output (the param of its errors)."""
        return "structured_outputs" if self.structured_outputs else "response_format"

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """response_format / structured_outputs as StructuredOutputsParams; None for text."""
        return structured_outputs_params(self.response_format, self.structured_outputs,
                                         self.structured_field)


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | Annotated[list[str], Field(max_length=MAX_CHOICES)] | list[TokenId] | \
        Annotated[list[TokenIds], Field(max_length=MAX_CHOICES)]
    # 0 only with echo: the prompt is scored (its logprobs), nothing generated.
    max_tokens: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = 16
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        """400 for suffix, best_of != n and max_tokens=0 without echo, besides the shared
        ones."""
        super().refuse_unsupported()
        if self.max_tokens == 0 and not self.echo:
            raise bad_request("max_tokens=0 generates nothing: it is only allowed with "
                              "echo=true (to score the prompt, with logprobs); ask for at "
                              "least 1 token", "max_tokens")
        if self.suffix:
            raise bad_request("suffix is not supported by this server", "suffix")
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise bad_request("best_of is not supported by this server (only best_of == n)",
                              "best_of")

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise bad_request("prompt must not be empty", "prompt")
        if isinstance(p[0], int):
            return [p]
        if any(isinstance(x, list) and not x for x in p):
            raise bad_request("prompt: a token-id prompt must not be empty", "prompt")
        if len(p) * (self.n or 1) > MAX_CHOICES:
            raise bad_request(f"{len(p)} prompts x n={self.n or 1} asks for more than "
                              f"{MAX_CHOICES} completions in one request: split it", "n")
        return list(p)

    def prompt_logprobs(self) -> int | None:
        """SamplingParams.prompt_logprobs: echo with logprobs scores the prompt too."""
        return self.logprobs if self.echo else None


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Any] | None = None
    tool_choice: Any = None

    def refuse_unsupported(self) -> None:
        """400 for malformed tools / tool_choice, besides the shared checks."""
        super().refuse_unsupported()
        plan = self.tool_plan()
        if plan is not None and plan.mode != "auto" and (self.response_format
                                                        or self.structured_outputs):
            raise bad_request("tool_choice 'required' or a named function fixes the reply's "
                              "format: drop response_format / structured_outputs",
                              "tool_choice")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")

    def tool_plan(self) -> ToolPlan | None:
        """The tools and how the reply uses them (None: no tools, or tool_choice "none")."""
        return plan_tools(self.tools, self.tool_choice)

    @property
    def structured_field(self) -> str:
        """The field that asked for structured output (the param of its errors)."""
        plan = self.tool_plan()
        return "tools" if plan is not None and plan.mode != "auto" else super().structured_field

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """tool_choice "required" / named: the calls' grammar; else response_format's."""
        plan = self.tool_plan()
        if plan is not None and plan.mode != "auto":
            return plan.structured_outputs()
        return super().structured_outputs_params()

    def engine_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None when off, else how many top tokens per position."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> int | None:
        """max_completion_tokens (OpenAI's newer name) or max_tokens; None: up to the limit."""
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens


def check_length(prompt_len: int, max_tokens: int | None, max_model_len: int,
                 prompt_param: str) -> int:
    """The max_tokens to run with (room left when None); 400 when the request cannot fit."""
    if prompt_len >= max_model_len:
        raise bad_request(f"the prompt has {prompt_len} tokens but this model's maximum "
                          f"context length is {max_model_len}: shorten it", prompt_param)
    if max_tokens is None:
        return max_model_len - prompt_len
    if prompt_len + max_tokens > max_model_len:
        raise APIError(400, f"this model's maximum context length is {max_model_len} tokens; "
                            f"you asked for {prompt_len + max_tokens} ({prompt_len} in the "
                            f"prompt, {max_tokens} to generate): lower max_tokens",
                       "max_tokens", code="context_length_exceeded")
    return max_tokens
