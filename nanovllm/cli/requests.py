"""`nanovllm generate`'s requests: from --prompt texts or a JSONL file, checked up front.

A JSONL line is {"prompt": text}, {"prompt_token_ids": [...]} (optionally with "prompt"), or
{"messages": [...]} for the chat template, or a bare JSON string; it may carry an "id" (echoed
in the output) and SamplingParams fields ("max_tokens", "temperature", ...) that override the
command line's for that line.
"""
import json
from dataclasses import dataclass, field

from nanovllm.cli.options import SAMPLING_KEYS
from nanovllm.engine.prompts import conversation_list, parse_prompt
from nanovllm.sampling_params import SamplingParams

_PROMPT_KEYS = ("prompt", "prompt_token_ids", "messages")


@dataclass
class Request:
    """One prompt (or conversation) to complete, what to echo back, and its sampling."""

    prompt: str | dict | None  # what LLM.generate() takes; None for a conversation
    messages: list[dict] | None  # the conversation to render through the chat template
    sampling: SamplingParams
    echo: dict = field(default_factory=dict)  # input fields repeated in the output line


def from_texts(texts: list[str], sampling: dict, chat: bool) -> list[Request]:
    """One request per --prompt text (a user message each with --chat)."""
    sp = SamplingParams(**sampling)
    if chat:
        return [Request(None, [{"role": "user", "content": t}], sp, {}) for t in texts]
    return [Request(t, None, sp, {}) for t in texts]


def from_jsonl(lines, source: str, sampling: dict, chat: bool) -> list[Request]:
    """One request per non-blank line; a bad line raises ValueError naming it."""
    requests = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            requests.append(_parse_line(line, sampling, chat))
        except ValueError as e:
            raise ValueError(f"{source} line {number}: {e}") from None
    return requests


def _parse_line(line: str, sampling: dict, chat: bool) -> Request:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    if isinstance(obj, str):
        obj = {"prompt": obj}
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object such as {{\"prompt\": \"...\"}}, got a JSON "
                         f"{type(obj).__name__}")
    unknown = sorted(set(obj) - {"id", *_PROMPT_KEYS, *SAMPLING_KEYS})
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; a line holds one of {list(_PROMPT_KEYS)}, "
                         f"optionally \"id\" and sampling fields {SAMPLING_KEYS}")
    sp = SamplingParams(**{**sampling, **{k: obj[k] for k in SAMPLING_KEYS if k in obj}})
    echo = {"id": obj["id"]} if "id" in obj else {}
    if "messages" in obj:
        if "prompt" in obj or "prompt_token_ids" in obj:
            raise ValueError('give either "messages" or a prompt, not both')
        conversations = conversation_list(obj["messages"])
        if len(conversations) != 1:
            raise ValueError('"messages" must be one conversation (a list of messages)')
        return Request(None, conversations[0], sp, {**echo, "messages": conversations[0]})
    prompt = {k: obj[k] for k in ("prompt", "prompt_token_ids") if k in obj}
    text, ids = parse_prompt(prompt)  # checks the forms; ids against the vocab come later
    if ids is None and chat:
        return Request(None, [{"role": "user", "content": text}], sp, echo)
    if ids is not None:
        echo["prompt_token_ids"] = ids
    return Request(prompt if ids is not None else text, None, sp, echo)
