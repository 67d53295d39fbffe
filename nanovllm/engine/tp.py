"""How rank 0 reaches its model runner(s): directly for one rank, or tensor parallelism.

With N > 1 ranks this process is rank 0 and ranks 1..N-1 are spawned worker processes, each
with its own ModelRunner; the layers exchange activations through torch.distributed (NCCL
on GPU, gloo on CPU). Every engine call is pickled once into a shared-memory segment and
each worker is woken through a semaphore; it runs the same method and releases a "done"
semaphore. (Semaphores, not Events: Event.set() waits for every sleeper to wake, so it would
block forever on a worker killed while it waited.)
A watchdog thread notices a dead worker at once, so rank 0 raises instead of hanging.
"""
import atexit
import logging
import os
import pickle
import signal
import socket
import struct
import threading
from datetime import timedelta
from multiprocessing import connection, get_context
from multiprocessing.shared_memory import SharedMemory

import torch
import torch.distributed as dist

from nanovllm.config import Config
from nanovllm.engine.model_runner import ModelRunner, resolve_device
from nanovllm.utils.loader import check_checkpoint

logger = logging.getLogger(__name__)

# First size of the call segment; a bigger message grows it (see ShmChannel.send).
SHM_BYTES = 1 << 20
# Backstop for a collective whose peer hangs without dying (a dead peer is caught at once).
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
# How long shutdown() waits for workers to exit by themselves before terminating them.
JOIN_TIMEOUT_S = 10.0
# How often an idle worker checks that rank 0 is still alive.
PARENT_POLL_S = 1.0
# The longest shutdown waits for the process group's teardown.
GROUP_CLOSE_TIMEOUT_S = 10.0
# How long to wait for an exited worker's status to become readable (normally microseconds).
REAP_TIMEOUT_S = 5.0


class LocalRunner:
    """A single ModelRunner in this process."""

    def __init__(self, config: Config):
        self.runner = ModelRunner(config)

    def call(self, method: str, *args):
        """Invoke a ModelRunner method."""
        return getattr(self.runner, method)(*args)

    def shutdown(self) -> None:
        """Nothing to stop for a single in-process runner."""


class ShmChannel:
    """One writer (rank 0) broadcasts pickles to readers through a shared-memory segment.

    Layout: header (kind, nbytes), then nbytes of body. kind MESSAGE: the body is the
    pickle. kind MOVED: the body is the name of a new, bigger segment that holds the
    message; readers switch to it for good. The caller makes sure readers are done with
    one message before the next is written (the done semaphores), so no locking is needed.
    """

    HEADER = struct.Struct("<IQ")
    MESSAGE, MOVED = 0, 1

    def __init__(self, shm: SharedMemory, owner: bool):
        self.shm, self.owner = shm, owner

    @classmethod
    def create(cls, size: int = SHM_BYTES) -> "ShmChannel":
        """A new segment owned (and finally unlinked) by this process."""
        return cls(SharedMemory(create=True, size=max(size, cls.HEADER.size)), owner=True)

    @classmethod
    def attach(cls, name: str) -> "ShmChannel":
        """A reader's view of the writer's segment."""
        return cls(SharedMemory(name=name), owner=False)

    @property
    def name(self) -> str:
        return self.shm.name

    def send(self, obj) -> None:
        """Write obj for the readers, growing the segment if it does not fit."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        need = self.HEADER.size + len(data)
        if need <= self.shm.size:
            self._write(self.shm, self.MESSAGE, data)
            return
        size = self.shm.size
        while size < need:
            size *= 2
        new = SharedMemory(create=True, size=size)
        self._write(new, self.MESSAGE, data)
        self._write(self.shm, self.MOVED, new.name.encode())
        # Readers keep the old segment mapped until they have read the redirect, so the
        # name can go now (POSIX shared memory lives until its last mapping is gone).
        old, self.shm = self.shm, new
        old.close()
        old.unlink()
        logger.debug("call segment grown to %d bytes for a %d-byte message", size, len(data))

    def recv(self):
        """Read the current message (following a move to a bigger segment)."""
        kind, n = self.HEADER.unpack_from(self.shm.buf, 0)
        if kind == self.MOVED:
            name = bytes(self.shm.buf[self.HEADER.size: self.HEADER.size + n]).decode()
            self.shm.close()
            self.shm = SharedMemory(name=name)
            kind, n = self.HEADER.unpack_from(self.shm.buf, 0)
        view = self.shm.buf[self.HEADER.size: self.HEADER.size + n]
        try:
            return pickle.loads(view)
        finally:
            view.release()  # an exported view would make close() fail

    def close(self) -> None:
        """Unmap; the owner also removes the segment. Idempotent."""
        if self.shm is None:
            return
        shm, self.shm = self.shm, None
        shm.close()
        if self.owner:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass

    def _write(self, shm: SharedMemory, kind: int, body: bytes) -> None:
        shm.buf[self.HEADER.size: self.HEADER.size + len(body)] = body
        self.HEADER.pack_into(shm.buf, 0, kind, len(body))


# Set when a failed group's teardown never returned: this process cannot start another group.
_stuck_group = False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_group(backend: str, port: int, world_size: int, rank: int,
                device: torch.device) -> None:
    kwargs = {}
    if backend == "nccl":
        kwargs["device_id"] = device
        # A dead peer is handled here (the watchdog aborts the group); torch's own NCCL error
        # handling would instead kill this process on the abort. A user's setting wins.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}",
                            world_size=world_size, rank=rank, timeout=COLLECTIVE_TIMEOUT,
                            **kwargs)


def _close_group_bounded(backend: str, abort: bool,
                         timeout_s: float = GROUP_CLOSE_TIMEOUT_S) -> bool:
    """_close_group in a daemon thread, so that a teardown stuck in the communication library
    cannot hang shutdown (what it would release goes with the process anyway). True if done."""
    t = threading.Thread(target=_close_group, args=(backend, abort), daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        logger.warning("leaving the %s process group did not finish in %.0f s; continuing",
                       backend, timeout_s)
        return False
    return True


def _close_group(backend: str, abort: bool) -> None:
    """Leave the process group: together with every rank, or (abort) alone after a failure."""
    if not dist.is_initialized():
        return
    if abort and backend == "nccl":
        # A peer is dead or out of step: abort the communicators so that a collective stuck
        # on the GPU returns. (destroy would wait for the peer forever.)
        dist.distributed_c10d._abort_process_group()
    else:
        # NCCL's teardown is collective: it finishes only while every rank is in it, which
        # is why rank 0 calls this at the same moment as the workers (see shutdown()).
        dist.destroy_process_group()


def _worker_main(config: Config, rank: int, backend: str, device: str, port: int,
                 shm_name: str, request, done, parent_pid: int) -> None:
    """Body of a worker process: build a ModelRunner, then run every call rank 0 sends."""
    # Ctrl-C goes to the whole process group; rank 0 alone decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    done.release()  # "started": rank 0 now knows the spawn itself worked
    channel = ShmChannel.attach(shm_name)
    try:
        device = torch.device(device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            # Ranks share the CPU cores; more threads than cores only adds contention.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.tensor_parallel_size))
        _init_group(backend, port, config.tensor_parallel_size, rank, device)
        runner = ModelRunner(config, rank=rank, device=device)
        done.release()  # "ready"
        while True:
            while not request.acquire(timeout=PARENT_POLL_S):
                if os.getppid() != parent_pid:  # rank 0 died without shutting us down
                    os._exit(0)
            method, args = channel.recv()
            if method == "exit":
                break
            getattr(runner, method)(*args)
            done.release()
        channel.close()
        runner.release_graphs()
        _close_group_bounded(backend, abort=False)  # rank 0 is leaving the group too
        code = 0
    except BaseException:
        # Rank 0 sees the non-zero exit code through its watchdog and raises there.
        logger.exception("tensor-parallel worker rank %d failed", rank)
        code = 1
    # Skip interpreter teardown: CUDA-graph and communicator destructors can block on peers
    # that are already gone. Everything this process owns (the mapping too) goes with it.
    logging.shutdown()
    os._exit(code)


def _check_divisible(config: Config) -> None:
    hf, n = config.hf_config, config.tensor_parallel_size
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if getattr(hf, name) % n:
            raise ValueError(f"{name}={getattr(hf, name)} is not divisible by "
                             f"tensor_parallel_size={n}")


class TensorParallelRunner:
    """Rank 0's ModelRunner in this process plus N-1 spawned worker ranks."""

    def __init__(self, config: Config):
        _check_divisible(config)
        if config.load_format != "dummy":
            # Bad weight files fail here, before any worker is spawned.
            check_checkpoint(config.model, config.hf_config)
        n = config.tensor_parallel_size
        if _stuck_group:
            raise RuntimeError("an earlier tensor-parallel LLM in this process could not "
                               "release its process group; start a new process")
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialised in this process; "
                               "tensor_parallel_size > 1 needs to create its own group")
        device = resolve_device(config)
        if device.type == "cuda":
            first = device.index or 0
            if torch.cuda.device_count() < first + n:
                raise ValueError(f"tensor_parallel_size={n} needs GPUs cuda:{first}.."
                                 f"cuda:{first + n - 1} (one per rank); "
                                 f"{torch.cuda.device_count()} visible")
            devices = [torch.device("cuda", first + r) for r in range(n)]
            backend = "nccl"
        else:
            devices = [torch.device("cpu")] * n
            backend = "gloo"
        self.backend = backend
        self.runner = None
        self.procs, self.requests, self.dones = [], [], []
        self._closed = False
        self._broken = False  # a call that did not finish on every rank leaves them out of step
        self._failure: str | None = None
        self._stopping = threading.Event()
        self._group_lock = threading.Lock()
        self._group_left = False
        self._reap_lock = threading.Lock()
        self.channel = ShmChannel.create(SHM_BYTES)
        atexit.register(self.shutdown)
        try:
            self._start(config, devices)
        except BaseException:
            self._broken = True
            self.shutdown()
            raise

    def _start(self, config: Config, devices: list[torch.device]) -> None:
        ctx = get_context("spawn")
        port = _free_port()
        for rank in range(1, len(devices)):
            request, done = ctx.Semaphore(0), ctx.Semaphore(0)
            # Not daemonic (a worker may need child processes, e.g. torch.compile's); rank 0
            # stops them in shutdown() (also at exit) and they exit by themselves if it dies.
            p = ctx.Process(target=_worker_main, name=f"nanovllm-tp{rank}",
                            args=(config, rank, self.backend, str(devices[rank]), port,
                                  self.channel.name, request, done, os.getpid()))
            p.start()
            self.procs.append(p)
            self.requests.append(request)
            self.dones.append(done)
        self._watchdog = threading.Thread(target=self._watch, name="nanovllm-tp-watchdog",
                                          daemon=True)
        self._watchdog.start()
        # A worker that dies while spawning (e.g. a script without an
        # `if __name__ == "__main__":` guard) would leave the rendezvous below waiting.
        self._wait_workers("starting")
        _init_group(self.backend, port, len(devices), 0, devices[0])
        self.runner = ModelRunner(config, rank=0, device=devices[0])
        self._wait_workers("loading the model")

    # -- failure detection ----------------------------------------------------------------------
    def _watch(self) -> None:
        """Thread: as soon as a worker exits unasked, record why and unblock rank 0."""
        sentinels = [p.sentinel for p in self.procs]
        while not self._stopping.is_set():
            if connection.wait(sentinels, timeout=0.2) and not self._stopping.is_set():
                self._failure = self._dead_worker()
                # A gloo collective fails by itself when a peer's sockets close; NCCL kernels
                # would wait forever, so abort the communicators.
                if self.backend == "nccl":
                    self._leave_group(abort=True)
                return

    def _dead_worker(self, wait_s: float = 0.0) -> str | None:
        """A description of the first worker that has exited, waiting up to wait_s for one."""
        sentinels = [p.sentinel for p in self.procs]
        ready = set(connection.wait(sentinels, timeout=wait_s)) if sentinels else set()
        # Two races hide a dead worker's status. A sentinel turns ready when the dying process
        # closes its files, a moment before the kernel makes it reapable, so a non-blocking
        # waitpid (Process.exitcode) can still say "running": join() waits for the status.
        # And two threads reaping at once (the watchdog and a failed call) could both miss
        # it, one of them getting ECHILD: the lock makes them take turns.
        with self._reap_lock:
            for rank, p in enumerate(self.procs, 1):
                if p.sentinel in ready:
                    p.join(REAP_TIMEOUT_S)
                code = p.exitcode
                if code is None and p.sentinel not in ready:
                    continue
                if code is None:  # reaped by someone else: the status is gone
                    how = "exit status unknown"
                elif code < 0:
                    how = f"signal {signal.Signals(-code).name}"
                else:
                    how = f"exit code {code}"
                return (f"tensor-parallel worker rank {rank} (pid {p.pid}) died ({how}); "
                        "shut this LLM down and create a new one")
        return None

    def _wait_workers(self, what: str) -> None:
        """Wait for every worker's done signal, raising as soon as one has died."""
        for done in self.dones:
            while not done.acquire(timeout=0.05):
                failure = self._failure or self._dead_worker()
                if failure:
                    raise RuntimeError(f"{failure} (while {what})")

    # -- calls ------------------------------------------------------------------------------------
    def call(self, method: str, *args):
        """Run a ModelRunner method on every rank; returns rank 0's result."""
        if self._closed:
            raise RuntimeError("the tensor-parallel runner has been shut down")
        failure = self._failure or self._dead_worker()
        if failure:
            raise RuntimeError(failure)
        if self._broken:
            raise RuntimeError("an earlier call failed part-way, leaving the tensor-parallel "
                               "ranks out of step; shut this LLM down and create a new one")
        self.channel.send((method, args))
        self._broken = True
        try:
            for request in self.requests:
                request.release()
            result = getattr(self.runner, method)(*args)
            self._wait_workers(f"running {method}")
        except Exception as e:
            # A collective that failed because a peer died reports it obscurely: say who.
            failure = self._failure or self._dead_worker(wait_s=2.0)
            if failure and failure not in str(e):
                raise RuntimeError(failure) from e
            raise
        self._broken = False
        return result

    def shutdown(self) -> None:
        """Stop the workers, leave the process group, remove the segment (idempotent)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        self._stopping.set()
        clean = not self._broken and self._failure is None and self._dead_worker() is None
        if clean:
            try:
                self.channel.send(("exit", ()))
                for request in self.requests:
                    request.release()
            except Exception:
                logger.exception("could not ask the tensor-parallel workers to exit")
                clean = False
        # The workers leave the group as soon as they read "exit": leave it with them.
        if clean and self.runner is not None:
            try:
                self.runner.release_graphs()
            except Exception:
                logger.exception("releasing the CUDA graphs failed")
        self._leave_group(abort=not clean)
        for p in self.procs:
            p.join(JOIN_TIMEOUT_S if clean else 0.5)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join()
        if getattr(self, "_watchdog", None) is not None:
            self._watchdog.join(GROUP_CLOSE_TIMEOUT_S + 1)
        self.channel.close()
        self.runner = None  # frees rank 0's weights and KV cache

    def _leave_group(self, abort: bool) -> None:
        """Leave the process group once (the watchdog or shutdown, whichever comes first)."""
        with self._group_lock:
            if self._group_left:
                return
            self._group_left = True
        try:
            if not _close_group_bounded(self.backend, abort):
                global _stuck_group
                _stuck_group = True
        except Exception:
            logger.exception("leaving the %s process group failed", self.backend)


def create_runner(config: Config):
    """The runner front for config.tensor_parallel_size ranks."""
    if config.tensor_parallel_size == 1:
        return LocalRunner(config)
    return TensorParallelRunner(config)
