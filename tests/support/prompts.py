"""Seeded random prompts (token ids) for token-for-token comparisons."""
import random
from collections.abc import Sequence


def make_prompts(seed: int = 0, n: int = 8, *, shared: Sequence[int] | int = (), every: int = 2,
                 max_len: int = 69) -> list[list[int]]:
    """n prompts of 1..max_len random ids in [3, 400), the same for the same arguments.

    Prompts 0, every, 2 * every, ... start with the `shared` prefix (so the prefix cache can hit):
    a list of ids, or an int: that many random ids, drawn first from the same seeded stream.
    Ids start at 3, clear of the toy checkpoints' special ids, and stay below every toy vocab.
    """
    rng = random.Random(seed)
    if isinstance(shared, int):
        shared = [rng.randrange(3, 400) for _ in range(shared)]
    prefix = list(shared)
    prompts = []
    for i in range(n):
        p = [rng.randrange(3, 400) for _ in range(rng.randrange(1, max_len + 1))]
        prompts.append(prefix + p if i % every == 0 else p)
    return prompts
