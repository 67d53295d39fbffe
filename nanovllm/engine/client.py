"""Engine clients: how a front end reaches one engine core.

One interface, three places for the core: InprocClient (here) steps it on the caller's
thread; PipeClient (pipe_client.py) talks to it over pipes, in a child process or on a thread
(core_loop.py), with one reader thread that hands what the core sends to the front end's
sink; RayClient (ray_client.py) reaches it in a Ray actor. Every client has add(requests),
abort(ids), stats(), shutdown(), `pending` (the front end's load balancing) and
num_kvcache_blocks; those running the core elsewhere name it when it dies. No torch here.
"""
from collections.abc import Callable
from enum import Enum

from nanovllm.engine.core import EngineCore
from nanovllm.engine.messages import Dead, Outputs, Request


class EngineDeadError(RuntimeError):
    """The engine core stopped on an error (or was shut down): no request can be served."""


class RequestFailedError(RuntimeError):
    """The engine step running this request raised: the request ended (its blocks freed),
    the engine goes on serving the others."""


class ClientState(Enum):
    """Where a client's core stands."""

    STARTING = "starting"  # built or spawned, not ready yet
    READY = "ready"        # serving
    DEAD = "dead"          # stopped on its own (an error, a kill): `error` says why
    CLOSED = "closed"      # shut down


# What a front end's sink receives from a client running its core elsewhere: Outputs as
# they come, and Dead (with the error naming the core) once, last.
Sink = Callable[[object, Outputs | Dead], None]


class InprocClient:
    """A core in this process, stepped by the caller: the offline LLM's default."""

    def __init__(self, core: EngineCore):
        self.core = core
        self.state = ClientState.READY
        self.num_kvcache_blocks = core.scheduler.block_manager.num_blocks
        self.pending: dict[int, int] = {}  # request id -> its cost (front end's balancing)

    def add(self, requests: list[Request]) -> None:
        """Queue requests (in order)."""
        for request in requests:
            self.core.add(request)

    def abort(self, request_ids: list[int]) -> None:
        """Abort requests; each is reported ended ("abort") by the next step."""
        self.core.abort(request_ids)

    def step(self) -> Outputs:
        """Run one core step."""
        return self.core.step()

    def stats(self, timeout: float | None = None) -> dict:
        """The core's stats (see EngineCore.stats)."""
        return self.core.stats()

    def shutdown(self) -> None:
        """Release the core's executor (idempotent)."""
        if self.state is not ClientState.CLOSED:
            self.state = ClientState.CLOSED
            self.core.shutdown()
