"""Spreading requests over data-parallel cores: each goes to the core with the fewest
pending tokens. No torch here."""
from nanovllm.sampling_params import SamplingParams


def request_cost(num_prompt_tokens: int, sp: SamplingParams) -> int:
    """The tokens a request will put through its core: its prompt and every sample's output
    (at most max_tokens)."""
    return num_prompt_tokens + sp.max_tokens * sp.n


def balance(costs: list[int], loads: list[int]) -> list[int]:
    """The core for each request, in order: the one with the fewest pending tokens at the
    time (loads, updated in place)."""
    chosen = []
    for cost in costs:
        r = min(range(len(loads)), key=loads.__getitem__)
        loads[r] += cost
        chosen.append(r)
    return chosen
