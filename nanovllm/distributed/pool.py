"""Ranks 1..N-1 as spawned processes: start them, wake them, wait for them, notice deaths.

Workers are woken through semaphores, not Events: Event.set() waits for every sleeper to
wake, so it would block forever on a worker killed while it waited.
"""
from dataclasses import dataclass
from multiprocessing import connection

from nanovllm.utils.process import Child, exit_description, start_context

# How long stop() waits for workers to exit by themselves before terminating them.
JOIN_TIMEOUT_S = 10.0


@dataclass
class WorkerSpec:
    """Where a worker runs and how it reaches rank 0."""

    rank: int
    backend: str
    device: str
    port: int
    shm_name: str


class WorkerPool:
    """The spawned worker processes of one tensor-parallel engine, with their semaphores."""

    def __init__(self, target, args: tuple, specs: list[WorkerSpec]):
        """Spawn target(*args, spec, request, done) once per spec (target is the worker's
        body, passed in so that this module stays below the device side)."""
        ctx = start_context("an LLM with tensor_parallel_size > 1")
        self.children: list[Child] = []
        self.requests, self.dones = [], []
        for spec in specs:
            request, done = ctx.Semaphore(0), ctx.Semaphore(0)
            # Not daemonic (a worker may need child processes, e.g. torch.compile's); rank 0
            # stops them in stop() (also at exit) and they exit by themselves if it dies.
            self.children.append(Child(ctx, target, (*args, spec, request, done),
                                       f"nanovllm-tp{spec.rank}"))
            self.requests.append(request)
            self.dones.append(done)

    @property
    def procs(self) -> list:
        """The workers' multiprocessing.Process objects, rank 1 first."""
        return [c.proc for c in self.children]

    def wake(self) -> None:
        """Tell every worker that a message is waiting in the channel."""
        for request in self.requests:
            request.release()

    def wait(self, what: str, known_failure=lambda: None) -> None:
        """Wait for every worker's done signal, raising RuntimeError as soon as one has died
        (known_failure() may report a death the watchdog already recorded)."""
        for done in self.dones:
            while not done.acquire(timeout=0.05):
                failure = known_failure() or self.dead_worker()
                if failure:
                    raise RuntimeError(f"{failure} (while {what})")

    def wait_for_exit(self, timeout_s: float) -> bool:
        """Block until some worker exits (True) or timeout_s passes (False)."""
        return bool(connection.wait([p.sentinel for p in self.procs], timeout=timeout_s))

    def dead_worker(self, wait_s: float = 0.0) -> str | None:
        """A description of the first worker that has exited, waiting up to wait_s for one."""
        sentinels = [c.sentinel for c in self.children]
        ready = set(connection.wait(sentinels, timeout=wait_s)) if sentinels else set()
        for rank, child in enumerate(self.children, 1):
            # Not the sentinel alone: a fork server's goes quiet for a moment once someone
            # has read the status (is_alive also looks at the status itself).
            if child.sentinel in ready or not child.is_alive():
                # Child reads the status one thread at a time (the watchdog, a failed call).
                # None: reaped by someone else, the status is gone.
                return (f"tensor-parallel worker rank {rank} (pid {child.pid}) died "
                        f"({exit_description(child.exitcode())}); shut this LLM down and "
                        f"create a new one")
        return None

    def stop(self, clean: bool) -> None:
        """Join the workers (they were asked to exit if clean), then terminate, then kill."""
        for child in self.children:
            child.join(JOIN_TIMEOUT_S if clean else 0.5)
        for child in self.children:
            child.stop(timeout_s=0.0)


def worker_specs(backend: str, devices: list, port: int, shm_name: str) -> list[WorkerSpec]:
    """One spec per worker rank (1..N-1)."""
    return [WorkerSpec(rank, backend, str(devices[rank]), port, shm_name)
            for rank in range(1, len(devices))]
