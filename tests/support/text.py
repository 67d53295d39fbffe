"""Stop strings picked from real greedy output, so that a stop test always has a match."""
import pytest

from nanovllm import SamplingParams

STOP_PROMPT = "abc"


def greedy_with_stop(llm, max_tokens: int = 24):
    """(greedy text of STOP_PROMPT, a 2-character stop string from its middle, and sampling
    params that stop there); skips the test when the text is too short to pick one."""
    base = dict(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    text = llm.generate([STOP_PROMPT], SamplingParams(**base), use_tqdm=False)[0]["text"]
    stop = text[len(text) // 2: len(text) // 2 + 2]
    if len(stop.strip()) < 2:
        pytest.skip("greedy text too short to pick a stop string")
    return text, stop, SamplingParams(**base, stop=stop)
