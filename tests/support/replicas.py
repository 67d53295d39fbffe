"""The 64 mixed requests the replica tests (data parallel, Ray) compare across engines."""
from nanovllm import SamplingParams
from tests.support.prompts import make_prompts


def mixed_requests(seed: int) -> tuple[list, list[SamplingParams]]:
    """64 prompts (32 texts, then 32 token-id lists from `seed`) and their params: greedy and
    seeded in turn, 6 tokens each."""
    prompts = [f"prompt {i} " * (1 + i % 4) for i in range(32)] + make_prompts(seed, n=32)
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True) if i % 2 else
              SamplingParams(temperature=0.9, seed=i, max_tokens=6, ignore_eos=True)
              for i in range(64)]
    return prompts, params
