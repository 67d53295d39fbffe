"""vLLM's penalty and min_tokens rules written out plainly, one row at a time: the reference
the batched device pass is checked against."""
import random
from collections import Counter

import torch

from nanovllm import SamplingParams

# Each penalty alone and together, with values exact in float32 (so the reference rounds as
# the device does) and strong enough to change the toy models' greedy output.
CASES = [
    dict(repetition_penalty=1.5),
    dict(repetition_penalty=0.5),
    dict(frequency_penalty=1.5),
    dict(presence_penalty=2.0),
    dict(frequency_penalty=0.5, presence_penalty=-1.0),
    dict(repetition_penalty=1.25, frequency_penalty=0.5, presence_penalty=0.5),
]


def penalize(logits: torch.Tensor, prompt: list[int], output: list[int], *,
             repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
             presence_penalty: float = 0.0, banned=()) -> torch.Tensor:
    """One row of float32 logits after vLLM's rules, token by token: `banned` ids (min_tokens)
    get -inf; then every token seen in the prompt or output has a positive logit divided by
    the repetition penalty and a negative one multiplied; then each output token loses
    frequency_penalty x its count, and presence_penalty once."""
    x = logits.detach().float().clone()
    one = lambda v: torch.tensor(v, dtype=torch.float32)  # float32 arithmetic, as on the device
    for t in banned:
        x[t] = float("-inf")
    for t in set(prompt) | set(output):
        x[t] = x[t] / one(repetition_penalty) if x[t] > 0 else x[t] * one(repetition_penalty)
    for t, count in Counter(output).items():
        x[t] = x[t] - one(frequency_penalty) * count
        x[t] = x[t] - one(presence_penalty)
    return x


def mixed_params(seed: int, n: int) -> list[SamplingParams]:
    """Greedy and seeded sampling with penalties and min_tokens, some with stop ids, one
    with n=2: the same list for the same arguments."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kw = dict(CASES[i % len(CASES)], max_tokens=rng.randrange(4, 30), ignore_eos=i % 3 != 0,
                  min_tokens=rng.choice([0, 2, 3]))
        if i % 2:
            kw.update(temperature=0.8, top_k=rng.choice([-1, 20]), seed=1000 + i)
        else:
            kw.update(temperature=0)
        if i % 4 == 3:
            kw["stop_token_ids"] = [rng.randrange(3, 400) for _ in range(20)]
        if i == 5:
            kw["n"] = 2
        out.append(SamplingParams(**kw))
    return out
