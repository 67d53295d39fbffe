"""Async scheduling (the host runs one step ahead of the device; the control plane learns each
token one step late) gives exactly the outputs of the synchronous loop, on CPU too."""
import random

import pytest

from nanovllm import LLM, SamplingParams
from tests.support.prompts import make_prompts
from tests.support.text import STOP_PROMPT, greedy_with_stop

MODEL = "tied_gqa4_d16_l4"
SHARED = range(100, 137)  # two full 16-token blocks and a bit: prefix-cache hits


def params(seed: int, n: int) -> list[SamplingParams]:
    """Greedy and seeded sampling, short and long, some stopping at eos or a stop id."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kw = dict(max_tokens=rng.randrange(1, 40), ignore_eos=i % 3 != 0)
        if i % 2:
            kw.update(temperature=0.8, top_k=rng.choice([-1, 20]), seed=1000 + i)
        else:
            kw.update(temperature=0)
        if i % 5 == 4:
            kw["stop_token_ids"] = [rng.randrange(3, 400) for _ in range(8)]
        out.append(SamplingParams(**kw))
    return out


def outputs(path, async_scheduling, prompts, sps, **engine):
    llm = LLM(path, async_scheduling=async_scheduling, **engine)
    first = llm.generate(prompts, sps, use_tqdm=False)
    second = llm.generate(prompts, sps, use_tqdm=False)  # prefix-cache hits this time
    sched = llm.clients[0].core.scheduler
    stats = (sched.num_preemptions, sched.block_manager.num_hit_tokens)
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks and llm.clients[0].core.scheduler.num_in_flight == 0
    strip = [[{k: v for k, v in o.items() if k != "request_id"} for o in run]
             for run in (first, second)]
    graphs = llm.clients[0].core.executor.runner.graphs is not None
    llm.shutdown()
    return strip, stats, (llm.clients[0].core.async_scheduling, graphs)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", [
    # Twelve 16-token blocks force preemption; a 24-token budget chunks every long prompt.
    dict(kvcache_block_size=16, num_kvcache_blocks=12, max_model_len=512),
    dict(kvcache_block_size=16, num_kvcache_blocks=24, max_model_len=512,
         max_num_batched_tokens=24, max_num_seqs=4),
], ids=["preemption", "chunked"])
def test_same_tokens_as_synchronous(toy_models, engine, device):
    # On a GPU both runs use CUDA graphs for decode; float32 keeps near-ties from flipping
    # between the different batch shapes the two loops produce.
    prompts = make_prompts(3, n=12, shared=SHARED)
    sps = params(3, len(prompts))
    kw = dict(engine, device=device, dtype="float32")
    want, want_stats, _ = outputs(toy_models[MODEL], False, prompts, sps, **kw)
    got, got_stats, (on, graphs) = outputs(toy_models[MODEL], True, prompts, sps, **kw)
    assert graphs == (device == "cuda")
    assert got == want
    assert on
    assert got_stats[1] > 0  # the prefix cache served tokens
    if engine["num_kvcache_blocks"] == 12:
        assert want_stats[0] > 0 and got_stats[0] > 0  # both preempted


@pytest.mark.parametrize("device", DEVICES)
def test_stop_strings_and_the_step_api(toy_models, device):
    kw = dict(device=device, dtype="float32", kvcache_block_size=16, max_model_len=256,
              num_kvcache_blocks=64)
    sync = LLM(toy_models[MODEL], async_scheduling=False, **kw)
    asyn = LLM(toy_models[MODEL], async_scheduling=True, **kw)
    _, stop, sp = greedy_with_stop(sync)
    want = sync.generate([STOP_PROMPT, [5, 6, 7]], sp, use_tqdm=False)
    got = asyn.generate([STOP_PROMPT, [5, 6, 7]], sp, use_tqdm=False)
    assert [(o["text"], o["token_ids"], o["finish_reason"]) for o in got] == \
        [(o["text"], o["token_ids"], o["finish_reason"]) for o in want]
    assert got[0]["finish_reason"] == "stop" and stop not in got[0]["text"]
    rid = asyn.add_request(STOP_PROMPT, sp)
    done = {}
    while not asyn.is_finished():
        finished, _ = asyn.step()
        done.update((o["request_id"], o) for o in finished)
    assert done[rid]["token_ids"] == want[0]["token_ids"]
    sync.shutdown()
    asyn.shutdown()


@pytest.mark.gpu
def test_default_is_on_on_a_gpu(toy_models):
    llm = LLM(toy_models[MODEL], device="cuda", kvcache_block_size=16, max_model_len=64,
              num_kvcache_blocks=16)
    assert llm.clients[0].core.async_scheduling is True
    llm.shutdown()


def test_default_is_off_on_cpu_and_tp_refuses_it(toy_models):
    llm = LLM(toy_models[MODEL], device="cpu", kvcache_block_size=16, max_model_len=64)
    assert llm.clients[0].core.async_scheduling is False
    with pytest.raises(ValueError, match="async_scheduling"):
        LLM(toy_models[MODEL], device="cpu", tensor_parallel_size=2, async_scheduling=True)
