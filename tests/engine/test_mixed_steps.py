"""Mixed steps (decode rows and prompt chunks in one forward) give exactly the outputs of
steps that are all prefill or all decode, with requests arriving while others decode: greedy
and seeded sampling, logprobs and prompt logprobs, penalties, min_tokens, n > 1, stop strings,
structured output (grammar masks; late ones with async scheduling), preemption, with and
without async scheduling (whose decode rows then take their pending
input token from the previous step's samples, on the device)."""
import re

import pytest

from nanovllm import LLM, SamplingParams, StructuredOutputsParams
from nanovllm.engine import step_inputs
from tests.support.prompts import make_prompts
from tests.support.text import greedy_with_stop

MODEL = "tied_gqa4_d16_l4"
REGEX = r"[a-c]{2,5}x(yz)?"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def arrivals(stop: SamplingParams) -> list[tuple[int, list[int] | str, SamplingParams]]:
    """(step at which it is added, prompt, params): a few short requests first, then longer
    prompts (chunked beside the decodes) while those decode."""
    prompts = make_prompts(7, n=9, shared=40, max_len=90)
    greedy = dict(temperature=0, ignore_eos=True)
    sps = [SamplingParams(max_tokens=30, **greedy),
           SamplingParams(max_tokens=25, temperature=0.9, top_k=30, seed=11, ignore_eos=True),
           SamplingParams(max_tokens=20, logprobs=2, **greedy),
           SamplingParams(max_tokens=18, repetition_penalty=1.3, frequency_penalty=0.4,
                          presence_penalty=0.2, **greedy),
           SamplingParams(max_tokens=12, n=2, temperature=0.8, seed=5, ignore_eos=True),
           SamplingParams(max_tokens=10, prompt_logprobs=1, logprobs=1, **greedy),
           SamplingParams(max_tokens=16, min_tokens=8, temperature=0,
                          stop_token_ids=list(range(3, 400, 3))),
           SamplingParams(max_tokens=22, temperature=0.7, top_p=0.8, seed=3, ignore_eos=True),
           SamplingParams(max_tokens=14, **greedy)]
    steps = [0, 0, 2, 3, 5, 6, 8, 9, 12]
    regex = StructuredOutputsParams(regex=REGEX)
    return list(zip(steps, prompts, sps)) + [
        (4, "abc", stop),
        (7, "abc", SamplingParams(max_tokens=60, temperature=0, structured_outputs=regex))]


def summary(out) -> list:
    """What must match: tokens, text, why each completion ended, logprobs (approximately:
    the rows ran in different batches)."""
    rows = []
    for c in out.outputs:
        lps = None if c.logprobs is None else [
            {t: pytest.approx(lp.logprob, abs=1e-4) for t, lp in pos.items()}
            for pos in c.logprobs]
        rows.append((c.token_ids, c.text, c.finish_reason, lps))
    prompt = None if out.prompt_logprobs is None else [
        None if pos is None else {t: pytest.approx(lp.logprob, abs=1e-4)
                                  for t, lp in pos.items()}
        for pos in out.prompt_logprobs]
    return [rows, prompt]


def staggered(path, mixed: bool, async_scheduling: bool, device: str, **engine):
    llm = LLM(path, device=device, dtype="float32", kvcache_block_size=16, max_model_len=256,
              enable_mixed_steps=mixed, async_scheduling=async_scheduling, **engine)
    _, _, stop = greedy_with_stop(llm)
    plan = sorted(enumerate(arrivals(stop)), key=lambda a: a[1][0])
    ids, done, step = {}, {}, 0
    while plan or not llm.is_finished():
        while plan and plan[0][1][0] <= step:
            i, (_, prompt, sp) = plan.pop(0)
            ids[llm.add_request(prompt, sp)] = i  # outputs in arrivals()' order
        for out in llm.step()[0]:
            done[ids[out.request_id]] = summary(out)
        step += 1
        assert step < 2000
    core = llm.clients[0].core
    bm = core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks and core.scheduler.num_in_flight == 0
    stats = (core.scheduler.num_mixed_steps, core.scheduler.num_preemptions)
    llm.shutdown()
    return [done[i] for i in range(len(ids))], stats


@pytest.fixture
def fed(monkeypatch):
    """Counts mixed steps whose decode rows took a pending token from the device."""
    count = [0]
    original = step_inputs.decode_rows

    def decode_rows(*args):
        meta, feed = original(*args)
        count[0] += feed is not None
        return meta, feed

    monkeypatch.setattr(step_inputs, "decode_rows", decode_rows)
    return count


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", [
    # A 16-token prompt budget beside decodes: the later prompts arrive in several chunks.
    dict(num_kvcache_blocks=64, max_num_batched_tokens=64, max_mixed_prefill_tokens=16),
    # Twelve blocks: decodes preempt; mixed steps then admit nobody.
    dict(num_kvcache_blocks=12, max_num_batched_tokens=48),
], ids=["chunked", "preemption"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_mixed_steps_give_the_same_outputs(toy_models, fed, engine, async_scheduling, device):
    pytest.importorskip("xgrammar")  # the structured extra: its last request is constrained
    want, (mixed_off, _) = staggered(toy_models[MODEL], False, async_scheduling, device,
                                     **engine)
    got, (mixed_on, preemptions) = staggered(toy_models[MODEL], True, async_scheduling, device,
                                             **engine)
    assert mixed_off == 0 and mixed_on >= 5
    assert got == want
    (_, text, reason, _), = got[-1][0]  # the structured request (arrivals()' last)
    assert reason == "stop" and re.fullmatch(REGEX, text), (reason, text)
    if async_scheduling:
        assert fed[0] > 0  # some decode row's input token was still on the device
    if engine["num_kvcache_blocks"] == 12:
        assert preemptions > 0
