"""Data parallelism on one host: replica processes give DP=1's outputs in input order, a
dead replica is named, and shutdown leaves nothing behind."""
import multiprocessing
import os
import signal
import threading
import time

import pytest
import torch

from nanovllm import LLM, SamplingParams
from nanovllm.engine.load_balance import balance
from nanovllm.engine.pipe_client import PipeClient
from nanovllm.worker import device as device_module
from tests.support.checkpoints import broken_tokenizer_copy
from tests.support.prompts import make_prompts
from tests.support.replicas import mixed_requests

MODEL = "tied_mha_d16"
KW = dict(device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=256,
          num_kvcache_blocks=48)
# 64 prompts: text and token ids, greedy and seeded, the last with logprobs and two samples.
PROMPTS, PARAMS = mixed_requests(1)
PARAMS[-1] = SamplingParams(temperature=0.9, seed=5, max_tokens=6, n=2, logprobs=2)


def without_ids(outputs):
    """The outputs as comparable values, request ids left out (each LLM numbers its own):
    everything but the logprob values, which must be equal, then those values apart. A
    replica's batches differ from DP=1's (its requests arrive while it steps), so fp32 sums
    differ in the last bits: the logprobs may differ by that much, the tokens may not."""
    values = []

    def position(entries):
        values.extend(p.logprob for p in entries.values())
        return {t: (p.rank, p.decoded_token) for t, p in entries.items()}

    exact = [(o.prompt, o.prompt_token_ids, o.finished, [
        (c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason,
         c.logprobs and [position(p) for p in c.logprobs]) for c in o.outputs])
        for o in outputs]
    return exact, values


def assert_same(outputs, expected):
    """outputs are `expected`'s outputs but for their ids, logprobs within fp32 noise."""
    (exact, values), (want, want_values) = without_ids(outputs), without_ids(expected)
    assert exact == want
    assert values == pytest.approx(want_values, rel=0, abs=1e-4)


def running_in_group(pgid: int) -> list[int]:
    """Pids of the processes of group pgid that still run (a zombie whose parent died waits
    for init, which may not reap it in a container)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(pid))
    return pids


@pytest.fixture(scope="module")
def expected(toy_models):
    with LLM(toy_models[MODEL], **KW) as llm:
        return llm.generate(PROMPTS, PARAMS, use_tqdm=False)


@pytest.fixture(scope="module")
def dp2(toy_models):
    llm = LLM(toy_models[MODEL], data_parallel_size=2, **KW)
    yield llm
    llm.shutdown()


def test_balance_sends_each_request_to_the_least_loaded_replica():
    loads = [0, 5, 0]
    assert balance([4, 4, 3, 10], loads) == [0, 2, 0, 2]
    assert loads == [7, 5, 14]


def test_dp2_matches_dp1_in_input_order(dp2, expected):
    assert [type(c) for c in dp2.clients] == [PipeClient, PipeClient]
    outputs = dp2.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert_same(outputs, expected)
    assert len({o.request_id for o in outputs}) == len(PROMPTS)
    # Both replicas served, and finished with every block free.
    stats = dp2.stats()
    assert len(stats) == 2 and all(s["idle"] and s["num_free_blocks"] == s["num_blocks"]
                                   for s in stats)


def test_a_bad_request_raises_and_leaves_the_replicas_serving(dp2, expected):
    with pytest.raises(ValueError, match="max_model_len"):
        dp2.generate(PROMPTS[:7] + [[5] * 300], PARAMS[:8], use_tqdm=False)
    with pytest.raises(ValueError, match="prompt is not valid UTF-8"):  # not a TypeError
        dp2.generate(PROMPTS[:2] + ["\ud800"], PARAMS[:3], use_tqdm=False)
    assert_same(dp2.generate(PROMPTS[:9], PARAMS[:9], use_tqdm=False), expected[:9])
    chat = dp2.chat([{"role": "user", "content": "hi"}], PARAMS[1], use_tqdm=False)
    assert len(chat) == 1 and chat[0].finished


def test_bad_arguments(toy_models):
    with pytest.raises(ValueError, match="data_parallel_size"):
        LLM(toy_models[MODEL], data_parallel_size=0, **KW)


def test_a_tokenizer_that_fails_to_load_stops_the_replicas(toy_models, tmp_path):
    # The replicas build their models while the tokenizer loads: a broken one raises from
    # the constructor, and every replica process started for it is stopped.
    model = broken_tokenizer_copy(toy_models[MODEL], tmp_path / "broken_tokenizer")
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="could not load a tokenizer"):
        LLM(model, data_parallel_size=2, **KW)
    assert set(multiprocessing.active_children()) <= before


def test_replica_gpus_are_disjoint_and_checked(toy_models, monkeypatch):
    from nanovllm.config import Config

    monkeypatch.setattr(device_module, "resolve_device", lambda config: torch.device("cuda", 0))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    path = toy_models["tied_gqa4_d16_l4"]
    assert device_module.replica_gpus(Config(path, data_parallel_size=2,
                                             tensor_parallel_size=2)) == ["4,5", "6,7"]
    assert device_module.replica_gpus(Config(path, data_parallel_size=3)) == ["4", "5", "6"]
    with pytest.raises(ValueError, match="needs 6 GPUs"):
        device_module.replica_gpus(Config(path, data_parallel_size=3, tensor_parallel_size=2))


def test_a_killed_replica_is_named_and_shutdown_cleans_up(toy_models):
    # Replicas of two tensor-parallel ranks: the killed one leaves a worker behind.
    llm = LLM(toy_models["tied_gqa4_d16_l4"], **{**KW, "max_model_len": 512},
              data_parallel_size=2, tensor_parallel_size=2)
    victim = llm.clients[1].runner.proc
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)

    def kill_once_it_works():  # seconds of work queued on each replica: kill it under way
        while not llm.clients[1].pending:
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(victim.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_once_it_works)
    killer.start()
    with pytest.raises(RuntimeError, match=rf"data-parallel replica 1 \(pid {victim.pid}\) "
                                           r"died \(signal SIGKILL\)"):
        llm.generate(make_prompts(2, n=64), long, use_tqdm=False)
    killer.join()
    with pytest.raises(RuntimeError, match="data-parallel replica 1"):
        llm.generate(["again"], use_tqdm=False)
    procs = [c.runner.proc for c in llm.clients]
    llm.shutdown()
    llm.shutdown()  # idempotent
    assert all(not p.is_alive() for p in procs) and procs[0].exitcode == 0
    assert not set(procs) & set(multiprocessing.active_children())
    # The replica that stopped cleanly waited for its workers and its fork server before it
    # exited (process.stop_helpers): nothing of its group runs once shutdown returns.
    assert running_in_group(procs[0].pid) == []
    # Nor in the killed one's. SIGKILL is delivered asynchronously: on a loaded machine a
    # killed worker can still be exiting (tearing down its memory) a moment after killpg.
    deadline = time.monotonic() + 2
    while running_in_group(procs[1].pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running_in_group(procs[1].pid) == []


def test_shutdown_stops_every_replica(dp2):
    # Last in this module: it shuts the module's replicas down (the fixture's own shutdown
    # then does nothing).
    llm = dp2
    procs = [c.runner.proc for c in llm.clients]
    llm.shutdown()
    assert [p.exitcode for p in procs] == [0, 0]
    assert not set(procs) & set(multiprocessing.active_children())
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate(["x"], use_tqdm=False)


@pytest.mark.gpu
def test_dp2_on_two_gpus_matches_dp1_and_uses_both(toy_models):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    # float32 and small caches: the same tokens whatever the batching, little memory held.
    kw = dict(dtype="float32", kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256)
    path = toy_models[MODEL]
    with LLM(path, **kw) as ref:
        expected = ref.generate(PROMPTS, PARAMS, use_tqdm=False)
    free = [torch.cuda.mem_get_info(i)[0] for i in range(2)]
    with LLM(path, data_parallel_size=2, **kw) as llm:
        assert_same(llm.generate(PROMPTS, PARAMS, use_tqdm=False), expected)
        # Each replica process holds a CUDA context and a KV cache on its own GPU.
        used = [free[i] - torch.cuda.mem_get_info(i)[0] for i in range(2)]
        assert min(used) > 100 * 2 ** 20, used
        assert [s["num_blocks"] for s in llm.stats()] == [64, 64]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_one_replica_process_matches_in_process_and_dies_named(toy_models, device):
    # One replica through the process path (what each of DP=N's replicas runs): one GPU is
    # enough to check the CUDA side of it, the replica's own CUDA context and its failure.
    kw = dict(device=device, dtype="float32", kvcache_block_size=16, num_kvcache_blocks=64,
              max_model_len=256)
    path = toy_models[MODEL]
    with LLM(path, **kw) as ref:
        expected = ref.generate(PROMPTS, PARAMS, use_tqdm=False)
    llm = LLM(path, engine_process=True, **kw)
    try:
        assert_same(llm.generate(PROMPTS, PARAMS, use_tqdm=False), expected)
        assert [s["num_blocks"] for s in llm.stats()] == [64]
        victim = llm.clients[0].runner.proc
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()  # gone before the next request: sending to it fails, named all the same
        with pytest.raises(RuntimeError, match=rf"data-parallel replica 0 \(pid {victim.pid}\) "
                                               r"died \(signal SIGKILL\)"):
            llm.generate(["again"], use_tqdm=False)
        with pytest.raises(RuntimeError, match="data-parallel replica 0"):
            llm.stats()
    finally:
        llm.shutdown()
    assert victim not in multiprocessing.active_children()
