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
    """The n greedy tokens after `prompt` (no EOS), decoded over transformers' own KV cache
    (a full forward per token cost ~8x more on 300-token prompts, for the same tokens)."""
    model = hf_model(path)
    out, tokens = None, []
    with torch.no_grad():
        step = torch.tensor([list(prompt)])
        for _ in range(n):
            out = model(step, past_key_values=out and out.past_key_values, use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
            step = torch.tensor([tokens[-1:]])
    return tokens


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


def check_teacher_forced_logits(llm, path: str, prompts: list[list[int]],
                                rtol: float = 1e-4, ref_model=None) -> None:
    """Prefill `prompts` as one batch through llm's model runner and compare every position's
    logits with HF's forward pass over the same tokens (relative L2 error below rtol); the
    HF model is hf_model(path) unless ref_model is given."""
    import torch.nn.functional as F

    from nanovllm.engine.sequence import Sequence
    from nanovllm.engine.step_inputs import prefill_inputs
    from nanovllm.utils.context import reset_context

    runner = llm.clients[0].core.executor.runner
    seqs = []
    for p in prompts:
        s = Sequence(p, block_size=llm.config.kvcache_block_size)
        llm.clients[0].core.scheduler.block_manager.allocate(s)
        s.num_scheduled_tokens = len(p)
        seqs.append(s)
    with torch.inference_mode():
        hidden = runner.forward(prefill_inputs(seqs, llm.config.kvcache_block_size,
                                               runner.max_blocks_per_seq))
        reset_context()
        logits = F.linear(hidden, runner.model.lm_head.weight)
    offset = 0
    for p in prompts:
        with torch.no_grad():
            ref = (ref_model or hf_model(path))(torch.tensor([p])).logits[0]
        ours = logits[offset: offset + len(p)]
        offset += len(p)
        assert (ours - ref).norm() / ref.norm() < rtol
