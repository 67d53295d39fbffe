"""Hugging Face transformers as the oracle: the same checkpoint run by the reference library."""
import functools

import torch


@functools.lru_cache(maxsize=None)
def hf_model(path: str):
    """The checkpoint at `path` as a transformers fp32 model (eager attention), loaded once."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                attn_implementation="eager").eval()


@functools.lru_cache(maxsize=None)
def hf_greedy(path: str, prompt: tuple, n: int) -> list[int]:
    """The n greedy tokens after `prompt`, each by a full forward pass (no KV cache, no EOS)."""
    model = hf_model(path)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@functools.lru_cache(maxsize=None)
def hf_greedy_penalized(path: str, prompt: tuple, n: int, stop_ids: tuple = (),
                        min_tokens: int = 0, **penalties) -> list[int]:
    """Greedy after `prompt` with vLLM's penalties applied to HF's logits at each step (see
    tests/support/penalties.py), and `stop_ids` held back until min_tokens tokens; it does
    not stop at them (callers cut where the engine should stop)."""
    from tests.support.penalties import penalize

    model = hf_model(path)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([list(prompt) + out])).logits[0, -1]
            banned = stop_ids if len(out) < min_tokens else ()
            out.append(int(penalize(logits, list(prompt), out, banned=banned,
                                    **penalties).argmax()))
    return out
