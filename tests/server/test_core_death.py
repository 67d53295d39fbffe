"""A server whose engine core dies does not live on as a zombie: /health says 503, the
server logs why and exits with a non-zero status, so a supervisor restarts it."""
import os
import signal
import subprocess
import sys
import time

import httpx
import psutil

from tests.server.conftest import ENGINE_KW, MODEL
from tests.server.test_run_server import free_port
from tests.support.scripts import user_env
from tests.support.server import wait_healthy


def test_server_exits_non_zero_when_the_core_dies(toy_models):
    port = free_port()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    options = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE_KW.items()]
    argv = [sys.executable, "-m", "nanovllm.server", toy_models[MODEL], "--port", str(port),
            "--served-model-name", "toy", "--log-level", "warning", *options]
    proc = subprocess.Popen(argv, env=user_env(PYTHONPATH=root), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        # The engine core: the server's spawned child (not multiprocessing's tracker).
        cores = [c for c in psutil.Process(proc.pid).children()
                 if "spawn_main" in " ".join(c.cmdline())]
        assert len(cores) == 1
        os.kill(cores[0].pid, signal.SIGKILL)
        try:
            cores[0].wait(10)  # gone (a zombie until the server reaps it)
        except psutil.NoSuchProcess:
            pass
        deadline = time.monotonic() + 30
        while proc.poll() is None:  # until it exits: 503, never a 200 from a zombie
            try:
                assert httpx.get(f"{url}/health", timeout=1).status_code == 503
            except httpx.TransportError:  # stopped listening: it is on its way out
                pass
            assert time.monotonic() < deadline, "the server outlived its engine"
            time.sleep(0.05)
        out = proc.communicate(timeout=10)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out
    assert "engine core died" in out and "died (signal SIGKILL)" in out, out
