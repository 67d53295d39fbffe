"""Child processes: how they start (spawn, or forked from a fork server), their status read
by several threads, and a script that creates an engine at top level, without the `__main__`
guard, gets an error that names the guard (from the child and from the parent), not
multiprocessing's generic bootstrapping message alone."""
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from nanovllm.utils.process import START_METHOD_VAR, Child, pipes, start_context
from tests.support.scripts import user_env

GUARD = 'if __name__ == "__main__":'


def test_start_context_refuses_inside_a_child_importing_the_script(monkeypatch):
    # What multiprocessing sets in a spawned child while it re-imports the main script.
    monkeypatch.setattr(mp.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match="AsyncLLM was created while") as info:
        start_context("AsyncLLM")
    assert GUARD in str(info.value)


def test_start_method_is_spawn_unless_the_variable_chooses(monkeypatch):
    monkeypatch.delenv(START_METHOD_VAR, raising=False)
    assert start_context("AsyncLLM").get_start_method() == "spawn"
    monkeypatch.setenv(START_METHOD_VAR, "forkserver")
    assert start_context("AsyncLLM").get_start_method() == "forkserver"
    monkeypatch.setenv(START_METHOD_VAR, "fork")  # CUDA cannot be forked: not offered
    with pytest.raises(ValueError, match=f"{START_METHOD_VAR}='fork'.*spawn, forkserver"):
        start_context("AsyncLLM")


def _report(conns: tuple, name: str) -> None:
    """A child's body: send back one environment variable and whether torch came loaded."""
    inbox, outbox = conns
    outbox.send((os.environ.get(name), "torch" in sys.modules))
    inbox.recv()  # until the parent says


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_child_gets_the_environment_of_its_start(monkeypatch, method):
    monkeypatch.setenv(START_METHOD_VAR, method)
    ctx = start_context("a test")
    # Set after the fork server may have started (other tests start it): still seen.
    monkeypatch.setenv("NANOVLLM_TEST_MARK", f"mark-{method}")
    (send, recv), theirs = pipes(ctx)
    child = Child(ctx, _report, (theirs, "NANOVLLM_TEST_MARK"), "nanovllm-test-child")
    for conn in theirs:
        conn.close()
    value, torch_loaded = recv.recv()
    assert value == f"mark-{method}"
    # The fork server's children start with torch imported; spawned ones do not.
    assert torch_loaded is (method == "forkserver")
    send.send(None)
    child.stop(timeout_s=10)
    assert child.exitcode() == 0


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_threads_reading_a_killed_childs_status_all_see_the_signal(monkeypatch, method):
    monkeypatch.setenv(START_METHOD_VAR, method)
    ctx = start_context("a test")
    (_, recv), theirs = pipes(ctx)
    child = Child(ctx, _report, (theirs, "HOME"), "nanovllm-test-child")
    recv.recv()
    os.kill(child.pid, signal.SIGKILL)
    codes = []
    readers = [threading.Thread(target=lambda: codes.append(child.exitcode(wait_s=10)))
               for _ in range(4)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    assert not child.is_alive()
    assert codes == [-signal.SIGKILL] * 4


def test_an_unguarded_async_llm_script_names_the_guard(toy_models, tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        from nanovllm import AsyncLLM
        engine = AsyncLLM({toy_models["tied_mha_d16"]!r}, device="cpu", dtype="float32",
                          max_model_len=64, num_kvcache_blocks=8, kvcache_block_size=16)
        engine.shutdown()
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=user_env())
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert "EngineDeadError" in last and "exited while starting" in last and GUARD in last
    # The child's own error (printed above the parent's) names the guard too.
    assert "AsyncLLM was created while a spawned nanovllm process" in run.stderr



def _cuda_report(conns: tuple) -> None:
    """A child's body: a CUDA computation's result (or the error it raised)."""
    import torch

    inbox, outbox = conns
    try:
        outbox.send(torch.ones(4, device="cuda").sum().item())
    except Exception as e:  # noqa: BLE001 - sent to the test, which names it
        outbox.send(repr(e))
    inbox.recv()


@pytest.mark.gpu
def test_fork_server_children_initialize_cuda_themselves(monkeypatch):
    # A child forked from a process that initialized CUDA fails its first CUDA call
    # ("initialization error"): the fork server only imported torch, so each child starts
    # CUDA itself, also after this process (pytest, which asked torch for GPUs) and an
    # earlier child used it.
    import torch

    torch.ones(1, device="cuda")
    monkeypatch.setenv(START_METHOD_VAR, "forkserver")
    ctx = start_context("a test")
    for _ in range(2):
        (send, recv), theirs = pipes(ctx)
        child = Child(ctx, _cuda_report, (theirs,), "nanovllm-test-child")
        for conn in theirs:
            conn.close()
        assert recv.recv() == 4.0
        send.send(None)
        child.stop(timeout_s=30)
        assert child.exitcode() == 0
