"""`python -m nanovllm.server` (run_server) in a process of its own: it serves, and SIGTERM
(to the server) or SIGINT (to its whole process group, as Ctrl-C in a terminal) stops uvicorn
and then the engine (its shutdown runs before the process ends, and its engine process is
gone afterwards)."""
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.server.conftest import ENGINE_KW, MODEL
from tests.support.scripts import user_env
from tests.support.server import wait_healthy

SCRIPT = """
import sys
from nanovllm.async_llm import AsyncLLM
from nanovllm.server.__main__ import main

original = AsyncLLM.shutdown
def shutdown(self):
    print("ENGINE SHUTDOWN", self.client.runner.pid, flush=True)
    original(self)
AsyncLLM.shutdown = shutdown
main(sys.argv[1:])
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_server_and_engine(toy_models, sig):
    port = free_port()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = user_env(PYTHONPATH=root)
    options = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE_KW.items()]
    argv = [toy_models[MODEL], "--port", str(port), "--served-model-name", "toy",
            "--log-level", "warning", "--num-kvcache-blocks", "16", "--max-num-seqs", "2"]
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, *argv, *options], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        resp = httpx.post(f"{url}/v1/completions", timeout=30,
                          json={"model": "toy", "prompt": "Hello", "max_tokens": 3})
        assert resp.status_code == 200
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "ENGINE SHUTDOWN" in out
    engine_pid = int(out.split("ENGINE SHUTDOWN", 1)[1].split()[0])
    deadline = time.monotonic() + 5
    while True:  # the engine process stopped with the server (init reaps it)
        try:
            os.kill(engine_pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the engine process outlived the server"
        time.sleep(0.05)
    assert "Traceback" not in out, out
    # uvicorn re-raises SIGTERM once it has stopped; the CLI ends quietly on Ctrl-C.
    assert proc.returncode == (-signal.SIGTERM if sig == signal.SIGTERM else 0)
