"""Tensor parallelism: spawned worker ranks, the shared-memory call channel, failures, clean-up."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from nanovllm import LLM, SamplingParams
from nanovllm.distributed import channel as channel_module
from nanovllm.distributed.channel import ShmChannel
from nanovllm.worker.multiproc import State
from tests.support.prompts import make_prompts
from tests.support.scripts import tp_workers, user_env

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
# Only rank 0 samples: penalties and min_tokens (end tokens included) are its work alone.
PENALIZED = [SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.5,
                            frequency_penalty=0.5, min_tokens=8),
             SamplingParams(temperature=0.8, seed=7, max_tokens=24, presence_penalty=1.0)]
# 8 heads / 2 kv heads: TP=2 splits every projection.
MODEL = "tied_gqa4_d16_l4"
# Prompt block tables need up to 9 blocks of 16: twelve blocks force decode to preempt.
# Half the prompts share a 37-token prefix (two full blocks), so the prefix cache hits.
SHARED = range(100, 137)
ENGINE = dict(kvcache_block_size=16, num_kvcache_blocks=12, device="cpu", max_model_len=512)


def tokens(llm, prompts, sp=GREEDY):
    return [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)]


def assert_cleaned_up(llm, group_released=True):
    """After shutdown: no worker process, no shared-memory segment, no process group."""
    executor = llm.clients[0].core.executor
    name = executor.channel.name if executor.channel.shm is not None else None
    procs = list(executor.workers.procs)
    t = time.monotonic()
    llm.shutdown()
    llm.shutdown()  # idempotent
    assert time.monotonic() - t < 30
    assert all(not p.is_alive() for p in procs)
    assert tp_workers() == []
    if group_released:
        assert not torch.distributed.is_initialized()
    if name is not None:
        assert not os.path.exists(f"/dev/shm/{name}")
    assert executor.state is State.CLOSED
    with pytest.raises(RuntimeError, match="shut down"):
        executor.launch([], True)


@pytest.fixture(scope="module")
def reference(toy_models):
    """TP=1 greedy tokens: twice the same batch (the second run hits the prefix cache); and
    the tokens with penalties."""
    llm = LLM(toy_models[MODEL], **ENGINE)
    prompts = make_prompts(0, n=6, shared=SHARED)
    out = tokens(llm, prompts), tokens(llm, prompts)
    assert llm.clients[0].core.scheduler.num_preemptions > 0
    return prompts, out, tokens(llm, prompts, PENALIZED * 3)


def test_tp2_matches_tp1_with_preemption_prefix_cache_and_a_growing_segment(
        toy_models, reference, monkeypatch):
    # A 128-byte first segment: prefill batches' pickles outgrow it (several times), and every
    # later step goes through the grown one.
    monkeypatch.setattr(channel_module, "SHM_BYTES", 128)
    prompts, expected, penalized = reference
    llm = LLM(toy_models[MODEL], tensor_parallel_size=2, **ENGINE)
    first = llm.clients[0].core.executor.channel.name
    assert (tokens(llm, prompts), tokens(llm, prompts)) == expected
    assert tokens(llm, prompts, PENALIZED * 3) == penalized
    assert llm.clients[0].core.scheduler.num_preemptions > 0
    assert llm.clients[0].core.scheduler.block_manager.num_hit_tokens > 0
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert llm.clients[0].core.executor.channel.shm.size > 128
    assert not os.path.exists(f"/dev/shm/{first}")  # the outgrown segment is gone
    assert_cleaned_up(llm)


def test_channel_grows_and_cleans_up():
    writer = ShmChannel.create(1 << 20)
    reader = ShmChannel.attach(writer.name)
    first = writer.name
    try:
        writer.send(("run", [1, 2, 3]))
        assert reader.recv() == ("run", [1, 2, 3])
        big = os.urandom(3 << 20)  # 3 MiB: more than the 1 MiB segment
        writer.send(("run", big))
        assert reader.recv() == ("run", big)
        assert writer.shm.size >= 3 << 20 and reader.name == writer.name != first
        assert not os.path.exists(f"/dev/shm/{first}")
        writer.send("small again")
        assert reader.recv() == "small again"
        last = writer.name
    finally:
        reader.close()
        writer.close()
        writer.close()  # idempotent
    assert not os.path.exists(f"/dev/shm/{last}")


@pytest.mark.slow
def test_tp4_matches_tp1(toy_models):
    path = toy_models["tied_mha_d16"]  # 4 heads, 4 kv heads
    prompts = make_prompts(1, n=4, shared=SHARED)
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    expected = tokens(LLM(path, **ENGINE), prompts, sp)
    llm = LLM(path, tensor_parallel_size=4, **ENGINE)
    assert tokens(llm, prompts, sp) == expected
    assert_cleaned_up(llm)


def test_killed_worker_raises_promptly_and_shutdown_cleans_up(toy_models):
    llm = LLM(toy_models[MODEL], tensor_parallel_size=2, kvcache_block_size=16,
              num_kvcache_blocks=256, device="cpu", max_model_len=4096)
    core = llm.clients[0].core
    worker = core.executor.workers.procs[0]
    killed, decoding, step, steps = [], threading.Event(), core.step, []

    def counted_step():
        steps.append(1)
        if len(steps) == 4:  # prefilled, decoding: generation is under way
            decoding.set()
        return step()

    def kill():  # from another thread, so that it lands inside a step, in some collective
        decoding.wait(60)
        killed.append(time.monotonic())
        os.kill(worker.pid, signal.SIGKILL)

    core.step = counted_step
    # Long enough (minutes) that the kill lands mid-generation; the toy model clamps
    # max_model_len to 2,048, and a longer max_tokens is a ValueError.
    long = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)  # < max_model_len
    killer = threading.Thread(target=kill)
    killer.start()
    with pytest.raises(RuntimeError, match="rank 1.*SIGKILL"):
        llm.generate([[5, 6, 7]] * 8, long, use_tqdm=False)
    killer.join()
    assert time.monotonic() - killed[0] < 30
    assert llm.clients[0].core.scheduler.is_finished()
    # The runner stays refused, immediately, instead of touching the broken group.
    t = time.monotonic()
    with pytest.raises(RuntimeError, match="died"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert time.monotonic() - t < 5
    assert_cleaned_up(llm)


def test_waking_a_worker_killed_while_idle_does_not_block(toy_models):
    # A multiprocessing.Event.set() waits for every sleeper to wake: a worker killed while it
    # waited for a call would block rank 0 there forever (seen with NCCL on 2 GPUs).
    llm = LLM(toy_models[MODEL], tensor_parallel_size=2, **ENGINE)
    workers = llm.clients[0].core.executor.workers
    worker = workers.children[0]
    time.sleep(0.5)  # the worker is waiting for its next call
    os.kill(worker.pid, signal.SIGKILL)
    # Through the pool's Child, which reads a status one thread at a time (the watchdog reads
    # it too); a bare Process.join here once raced it and the death went unnamed.
    worker.join(10)
    wake = threading.Thread(target=workers.requests[0].release, daemon=True)
    wake.start()
    wake.join(5)
    assert not wake.is_alive(), "waking a dead worker blocked"
    with pytest.raises(RuntimeError, match="rank 1.*SIGKILL"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert_cleaned_up(llm)


_ORPHAN_SCRIPT = """
import os, signal, sys
from nanovllm import LLM
if __name__ == "__main__":
    llm = LLM(sys.argv[1], tensor_parallel_size=2, kvcache_block_size=16, num_kvcache_blocks=16,
              device="cpu")
    executor = llm.clients[0].core.executor
    print(executor.workers.procs[0].pid, executor.channel.name, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no shutdown()
"""


def test_workers_exit_when_rank0_dies(toy_models, tmp_path):
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN_SCRIPT)
    # The script must import this checkout's nanovllm even where it is not pip-installed.
    env = user_env(PYTHONPATH=os.pathsep.join(
        filter(None, [os.path.dirname(os.path.dirname(os.path.dirname(channel_module.__file__))),
                      os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, str(script), toy_models[MODEL]], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == -signal.SIGKILL, out.stderr
    pid, name = out.stdout.split()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (_alive(int(pid)) or os.path.exists(f"/dev/shm/{name}")):
        time.sleep(0.2)
    assert not _alive(int(pid)), "worker outlived rank 0"
    assert not os.path.exists(f"/dev/shm/{name}"), "segment outlived every process"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("name, size", [("tied_mha_d16", 3), ("untied_gqa4_d64", 4)])
def test_heads_not_divisible_raise_before_spawning(toy_models, name, size):
    with pytest.raises(ValueError, match="divisible by tensor_parallel_size"):
        LLM(toy_models[name], tensor_parallel_size=size, device="cpu")
    assert tp_workers() == []


@pytest.mark.gpu
def test_tp2_matches_tp1_on_gpus_with_nccl(toy_models):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    path = toy_models["untied_gqa4_d64"]
    prompts = make_prompts(2, n=8, shared=SHARED)
    # float32 so that the all-reduce's summation order cannot flip a near-tie.
    kw = dict(kvcache_block_size=16, num_kvcache_blocks=64, dtype="float32", max_model_len=512,
              max_num_seqs=16)
    ref = LLM(path, **kw)
    expected = tokens(ref, prompts)
    ref.shutdown()
    del ref
    llm = LLM(path, tensor_parallel_size=2, **kw)
    assert llm.clients[0].core.executor.backend == "nccl"
    assert tokens(llm, prompts) == expected
    assert_cleaned_up(llm)


@pytest.mark.gpu
def test_killed_worker_raises_promptly_with_nccl(toy_models):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    llm = LLM(toy_models[MODEL], tensor_parallel_size=2, kvcache_block_size=16,
              num_kvcache_blocks=256, max_num_seqs=16, max_model_len=4096)
    worker = llm.clients[0].core.executor.workers.procs[0]
    timer = threading.Timer(2.0, os.kill, (worker.pid, signal.SIGKILL))
    timer.start()
    long = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)  # < max_model_len
    t = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1"):
        llm.generate([[5, 6, 7]] * 8, long, use_tqdm=False)
    timer.join()
    assert time.monotonic() - t < 30
    # Aborting an NCCL communicator whose peer is gone may never return (NVIDIA/nccl#1777);
    # then the processes and the segment are still cleaned up, and this process refuses,
    # clearly, to start another group.
    assert_cleaned_up(llm, group_released=False)
    if torch.distributed.is_initialized():
        with pytest.raises(RuntimeError, match="start a new process"):
            LLM(toy_models[MODEL], tensor_parallel_size=2, num_kvcache_blocks=16)
