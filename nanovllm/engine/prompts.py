"""The prompt forms generate() and chat() accept, and generate()'s per-prompt arguments,
checked before anything is queued.

A prompt is a string, a list (or 1-D array) of token ids, or one of vLLM's prompt dicts:
{"prompt": text} or {"prompt_token_ids": ids} (optionally with "prompt": the text those ids
came from, reported back in the output). No torch here.
"""
from collections.abc import Iterable, Mapping
from numbers import Integral

from nanovllm.param_checks import check_text
from nanovllm.sampling_params import INT64_MAX, INT64_MIN

ACCEPTED = ('a string, a list of token ids, {"prompt": str} or {"prompt_token_ids": '
            '[int, ...]} (optionally with "prompt": the text those ids came from)')


def prompt_list(prompts) -> list:
    """generate()'s first argument as a list of prompts: one prompt, or any iterable."""
    if isinstance(prompts, (str, Mapping)):
        return [prompts]  # one prompt, as vLLM accepts it: one output
    if prompts is None or isinstance(prompts, bytes) or not hasattr(prompts, "__iter__"):
        raise ValueError(f"prompts must be one prompt or an iterable of prompts (each {ACCEPTED}"
                         f"), got {type(prompts).__name__}")
    prompts = list(prompts)
    if prompts and isinstance(prompts[0], Integral):
        raise ValueError("prompts is a flat list of token ids: pass a list of prompts, e.g. "
                         "generate([token_ids]) or generate({'prompt_token_ids': token_ids}) "
                         "for one token-id prompt")
    return prompts


def generate_args(prompts, sampling_params, priority) -> tuple[list, list, list]:
    """generate()'s arguments as three lists of one entry per prompt: prompts, sampling
    params (None: the defaults) and priorities."""
    prompts = prompt_list(prompts)
    sps = _per_prompt("sampling_params", sampling_params, len(prompts))
    if priority is not None and (isinstance(priority, (str, bytes, Integral))
                                 or not isinstance(priority, Iterable)):
        raise ValueError(f"priority must be None or a list with one int per prompt, got "
                         f"{type(priority).__name__}")
    priorities = [0] * len(prompts) if priority is None else list(priority)
    if len(priorities) != len(prompts):
        raise ValueError(f"got {len(priorities)} priorities for {len(prompts)} prompts")
    return prompts, sps, priorities


def _per_prompt(name: str, value, n: int) -> list:
    """One value for every prompt, or a list with one per prompt."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"got {len(value)} {name} for {n} prompts: give one, or one per "
                             f"prompt")
        return list(value)
    return [value] * n


def request_id_list(request_id) -> list[int]:
    """abort_request()'s argument (one request id, or an iterable of them) as a list of ints."""
    ids = [request_id] if isinstance(request_id, Integral) else request_id
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise ValueError(f"request_id must be a request id (the int add_request returned) "
                         f"or a list of them, got {type(request_id).__name__}")
    ids = list(ids)
    bad = [i for i in ids if not isinstance(i, Integral) or isinstance(i, bool)]
    if bad:
        raise ValueError(f"request ids are the ints add_request returned; got {bad[:5]!r}")
    return [int(i) for i in ids]


def parse_prompt(prompt) -> tuple[str | None, list | None]:
    """(text, token ids) of one prompt; token ids are None when the text must be tokenized,
    text is None when only ids were given. The ids are not checked here (see check_token_ids)."""
    if isinstance(prompt, str):
        return prompt, None
    if _is_token_ids(prompt):
        return None, list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
    if not isinstance(prompt, Mapping):
        raise ValueError(f"a prompt must be {ACCEPTED}; got {type(prompt).__name__}")
    unknown = sorted(map(str, set(prompt) - {"prompt", "prompt_token_ids"}))
    if unknown:
        raise ValueError(f"prompt dict has unsupported key(s) {unknown}: a prompt must be "
                         f"{ACCEPTED}")
    text = prompt.get("prompt")
    if text is not None and not isinstance(text, str):
        raise ValueError(f'prompt dict: "prompt" must be a string, got {type(text).__name__}')
    if "prompt_token_ids" not in prompt:
        if text is None:
            raise ValueError(f"prompt dict is empty: a prompt must be {ACCEPTED}")
        return text, None
    ids = prompt["prompt_token_ids"]
    if not _is_token_ids(ids):
        raise ValueError(f'prompt dict: "prompt_token_ids" must be a list of token ids, got '
                         f"{type(ids).__name__}")
    return text, list(ids.tolist() if hasattr(ids, "tolist") else ids)


def check_token_ids(token_ids: list, vocab_size: int) -> list[int]:
    """token_ids as plain ints, or ValueError naming the ones outside [0, vocab_size)."""
    ids = list(token_ids)
    # Fast path for the common case, plain ints in range: the generic check below costs ~0.4 us
    # a token (an ABC isinstance), i.e. tens of ms inside a timed generate of long prompts.
    if all(type(t) is int for t in ids) and (not ids or (min(ids) >= 0 and max(ids) < vocab_size)):
        return ids
    bad = [t for t in token_ids
           if not isinstance(t, Integral) or isinstance(t, bool) or not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids must be integers in [0, {vocab_size}); got {bad[:5]}")
    return [int(t) for t in token_ids]


def check_priority(priority) -> int:
    """A request's priority as an int; ValueError unless it is an integer within int64."""
    if (not isinstance(priority, Integral) or isinstance(priority, bool)
            or not INT64_MIN <= priority <= INT64_MAX):
        raise ValueError(f"priority={priority!r:.80} is invalid: must be an integer in "
                         f"[{INT64_MIN}, {INT64_MAX}] (lower is scheduled first; default 0)")
    return int(priority)


def check_room(prompt_len: int, max_tokens: int, max_model_len: int) -> None:
    """ValueError when the prompt and max_tokens together exceed max_model_len (the server
    answers the same request with a 400)."""
    if prompt_len + max_tokens > max_model_len:
        raise ValueError(f"max_tokens={max_tokens} is too large: the prompt has {prompt_len} "
                         f"tokens and max_model_len={max_model_len} leaves room for at most "
                         f"{max_model_len - prompt_len} more; lower max_tokens")


def conversation_list(messages) -> list[list[dict]]:
    """chat()'s first argument (one conversation, or a list of them) as a list of them."""
    if isinstance(messages, Mapping) or isinstance(messages, (str, bytes)) or \
            not hasattr(messages, "__iter__"):
        raise ValueError(_chat_hint(f"got {type(messages).__name__}"))
    messages = list(messages)
    if not messages:
        raise ValueError(_chat_hint("got an empty list"))
    single = isinstance(messages[0], Mapping)
    conversations = [messages] if single else [_as_list(c) for c in messages]
    for i, conv in enumerate(conversations):
        where = "" if single else f"conversation {i}: "
        if not conv:
            raise ValueError(_chat_hint(f"{where}it has no messages"))
        for j, m in enumerate(conv):
            if not isinstance(m, Mapping):
                raise ValueError(_chat_hint(f"{where}message {j} is a {type(m).__name__}"))
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError(_chat_hint(f'{where}message {j} needs a string "role" and a '
                                            f'string "content" (got {dict(m)!r:.80})'))
            for field, value in m.items():  # role, content, name...: all reach the template
                if isinstance(value, str):
                    check_text(f"{where}message {j} {field}", value)
    return [[dict(m) for m in conv] for conv in conversations]


def _as_list(conv) -> list:
    if isinstance(conv, (str, bytes, Mapping)) or not hasattr(conv, "__iter__"):
        raise ValueError(_chat_hint(f"an item is a {type(conv).__name__}, not a conversation"))
    return list(conv)


def _chat_hint(problem: str) -> str:
    return ('chat() takes one conversation (a list of {"role": ..., "content": ...} dicts) or '
            f"a list of conversations; {problem}")


def _is_token_ids(prompt) -> bool:
    """A list/tuple of ids, or a 1-D integer array (numpy or torch)."""
    if isinstance(prompt, (list, tuple)):
        return True
    return getattr(prompt, "ndim", None) == 1 and hasattr(prompt, "tolist")


def check_fits(num_tokens: int, max_tokens: int, max_model_len: int, block_size: int,
               num_blocks: int) -> None:
    """ValueError unless a prompt of num_tokens tokens could complete within max_model_len
    and a cache of num_blocks blocks."""
    if num_tokens == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if num_tokens + 1 > max_model_len:
        raise ValueError(
            f"the prompt has {num_tokens} tokens but max_model_len={max_model_len} leaves room "
            f"for at most {max_model_len - 1}; shorten it or raise max_model_len")
    longest = min(num_tokens + max_tokens, max_model_len)
    need = -(-longest // block_size)
    if need > num_blocks:
        raise ValueError(
            f"the request needs up to {longest} tokens of KV cache ({need} blocks) but the "
            f"cache has only {num_blocks} blocks; lower max_tokens or give the cache more "
            f"memory (num_kvcache_blocks / gpu_memory_utilization)")
