"""Waiting for a server subprocess started by a test."""
import time

import httpx


def wait_healthy(proc, url: str, timeout_s: float = 60) -> None:
    """Return once `url`/health answers 200; fail with the server's output if it exits first
    or does not come up within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the server did not come up"
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
