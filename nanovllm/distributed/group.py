"""The torch.distributed process group of a tensor-parallel engine: joining and leaving it."""
import logging
import os
import socket
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

# Backstop for a collective whose peer hangs without dying (a dead peer is caught at once).
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
# The longest we wait for the process group's teardown.
GROUP_CLOSE_TIMEOUT_S = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now (for the rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProcessGroup:
    """This process's membership of the group: join once, leave once (cleanly or by abort)."""

    # A teardown that never returned leaves the communication library's state behind in this
    # process, whichever engine owned it: a process-wide fact, so a class attribute.
    stuck = False

    def __init__(self, backend: str, port: int, world_size: int, rank: int,
                 device: torch.device):
        self.check_can_create()
        self.backend = backend
        self._lock = threading.Lock()
        self._left = False
        kwargs = {}
        if backend == "nccl":
            kwargs["device_id"] = device
            # A dead peer is handled here (the watchdog aborts the group); torch's own NCCL
            # error handling would instead kill this process on the abort. A user's setting wins.
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}",
                                world_size=world_size, rank=rank, timeout=COLLECTIVE_TIMEOUT,
                                **kwargs)

    @staticmethod
    def check_can_create() -> None:
        """Raise RuntimeError if this process cannot join a new group (checked before spawning)."""
        if ProcessGroup.stuck:
            raise RuntimeError("an earlier tensor-parallel LLM in this process could not "
                               "release its process group; start a new process")
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialised in this process; "
                               "tensor_parallel_size > 1 needs to create its own group")

    def leave(self, abort: bool, timeout_s: float = GROUP_CLOSE_TIMEOUT_S) -> None:
        """Leave once (later calls do nothing), in a daemon thread bounded by timeout_s, so
        that a teardown stuck in the communication library cannot hang shutdown."""
        with self._lock:
            if self._left:
                return
            self._left = True
        t = threading.Thread(target=self._close, args=(abort,), daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            ProcessGroup.stuck = True
            logger.warning("leaving the %s process group did not finish in %.0f s; continuing",
                           self.backend, timeout_s)

    def _close(self, abort: bool) -> None:
        if not dist.is_initialized():
            return
        try:
            if abort and self.backend == "nccl":
                # A peer is dead or out of step: abort the communicators so that a collective
                # stuck on the GPU returns. (destroy would wait for the peer forever.)
                dist.distributed_c10d._abort_process_group()
            else:
                # NCCL's teardown is collective: it finishes only while every rank is in it,
                # which is why rank 0 leaves at the same moment as the workers.
                dist.destroy_process_group()
        except Exception:
            logger.exception("leaving the %s process group failed", self.backend)
