"""Tensor parallelism: this process is rank 0; ranks 1..N-1 are spawned workers.

Every step is pickled once into a shared-memory segment and each worker is woken; it runs the
same step and signals "done". The layers exchange activations through torch.distributed
(NCCL on GPU, gloo on CPU). A watchdog thread notices a dead worker at once, so rank 0 raises
instead of hanging.
"""
import atexit
import logging
import threading
from enum import Enum

import torch

from nanovllm.config import Config
from nanovllm.distributed.channel import ShmChannel
from nanovllm.distributed.group import GROUP_CLOSE_TIMEOUT_S, ProcessGroup, free_port
from nanovllm.distributed.pool import WorkerPool, worker_specs
from nanovllm.engine.sequence import Sequence
from nanovllm.models.loader import check_checkpoint
from nanovllm.utils.process import GUARD_HINT
from nanovllm.worker.device import resolve_device
from nanovllm.worker.kv_cache import hand_back_freed_memory
from nanovllm.worker.model_runner import ModelRunner
from nanovllm.worker.step_output import StepResult
from nanovllm.worker.tp_worker import RunStep, Stop, worker_main

logger = logging.getLogger(__name__)


class State(Enum):
    """Where the ranks stand; every failure or shutdown decision reads this one value."""

    STARTING = "starting"        # spawning workers and loading the model
    READY = "ready"              # every rank idle and in step
    RUNNING = "running"          # a step is in flight on every rank
    OUT_OF_STEP = "out of step"  # a step failed part-way: the ranks disagree where they are
    WORKER_DIED = "worker died"  # a worker exited unasked
    CLOSED = "closed"            # shut down


class MultiprocExecutor:
    """Rank 0's ModelRunner in this process plus N-1 spawned worker ranks."""

    late_masks = False  # launch runs a step to its end: grammar masks come with its inputs

    def __init__(self, config: Config):
        n = config.tensor_parallel_size
        ProcessGroup.check_can_create()
        if config.load_format != "dummy":
            # Bad weight files fail here, before any worker is spawned.
            check_checkpoint(config.model, config.hf_config)
        devices, self.backend = _devices(config, n)
        self.state = State.STARTING
        self.failure: str | None = None  # why a worker died, once one has
        self._lock = threading.Lock()    # the watchdog changes state too
        self.runner = self.group = self.workers = None
        self.channel = ShmChannel.create()
        atexit.register(self.shutdown)
        try:
            port = free_port()
            specs = worker_specs(self.backend, devices, port, self.channel.name)
            self.workers = WorkerPool(worker_main, (config,), specs)
            self._watchdog = threading.Thread(target=self._watch, name="nanovllm-tp-watchdog",
                                              daemon=True)
            self._watchdog.start()
            # A worker that dies while spawning (e.g. a script without an
            # `if __name__ == "__main__":` guard) would leave the rendezvous below waiting.
            try:
                self.workers.wait("starting", self._known_failure)
            except RuntimeError as e:
                raise RuntimeError(f"{e}; {GUARD_HINT}") from None
            self.group = ProcessGroup(self.backend, port, n, 0, devices[0])
            self.runner = ModelRunner(config, rank=0, device=devices[0])
            self.workers.wait("loading the model", self._known_failure)
        except BaseException:
            self._set(State.OUT_OF_STEP)
            self.shutdown()
            raise
        self._set(State.READY, only_from=State.STARTING)

    @property
    def num_kvcache_blocks(self) -> int:
        """KV blocks every rank allocated (they agree on the minimum)."""
        return self.runner.num_kvcache_blocks

    @property
    def on_gpu(self) -> bool:
        """Whether the ranks run on GPUs (NCCL) rather than CPUs (gloo)."""
        return self.backend == "nccl"

    # -- state ------------------------------------------------------------------------------
    def _set(self, state: State, only_from: State | None = None) -> None:
        with self._lock:
            if self.state is State.CLOSED or (only_from and self.state is not only_from):
                return
            self.state = state

    def _known_failure(self) -> str | None:
        return self.failure

    def _watch(self) -> None:
        """Thread: as soon as a worker exits unasked, record why and unblock rank 0."""
        while self.state is not State.CLOSED:
            if self.workers.wait_for_exit(0.2) and self.state is not State.CLOSED:
                failure = self.workers.dead_worker()
                if failure is None:  # not yet readable: look again (never forget a death)
                    continue
                self.failure = self.failure or failure
                self._set(State.WORKER_DIED)
                # A gloo collective fails by itself when a peer's sockets close; NCCL kernels
                # would wait forever, so abort the communicators.
                if self.backend == "nccl" and self.group is not None:
                    self.group.leave(abort=True)
                return

    def _refuse_unless_ready(self) -> None:
        if self.state is State.CLOSED:
            raise RuntimeError("the tensor-parallel executor has been shut down")
        # A dead worker is the root cause of any other trouble: name it first.
        self.failure = self.failure or self.workers.dead_worker()
        if self.failure:
            self._set(State.WORKER_DIED)
            raise RuntimeError(self.failure)
        if self.state is not State.READY:
            raise RuntimeError("an earlier step failed part-way, leaving the tensor-parallel "
                               "ranks out of step; shut this LLM down and create a new one")

    def set_eos_ids(self, eos_ids: set[int]) -> None:
        """Tell rank 0's runner, the one that samples, the end tokens (for min_tokens)."""
        self.runner.set_eos_ids(eos_ids)

    # -- steps ------------------------------------------------------------------------------
    def launch(self, seqs: list[Sequence], is_prefill: bool) -> StepResult:
        """Run one step on every rank, to the end; returns rank 0's result handle (ids and
        logprobs already on the host)."""
        self._refuse_unless_ready()
        self.channel.send(RunStep(seqs, is_prefill))
        self._set(State.RUNNING)
        try:
            self.workers.wake()
            result = self.runner.launch(seqs, is_prefill)
            result.result()
            self.workers.wait("running a step", self._known_failure)
        except Exception as e:
            self._set(State.OUT_OF_STEP, only_from=State.RUNNING)
            # A collective that failed because a peer died reports it obscurely: say who.
            self.failure = self.failure or self.workers.dead_worker(wait_s=2.0)
            if self.failure:
                self._set(State.WORKER_DIED)
                if self.failure not in str(e):
                    raise RuntimeError(self.failure) from e
            raise
        self._set(State.READY, only_from=State.RUNNING)
        return result

    def shutdown(self) -> None:
        """Stop the workers, leave the process group, remove the segment (idempotent)."""
        with self._lock:
            if self.state is State.CLOSED:
                return
            clean = self.state is State.READY
            self.state = State.CLOSED
        atexit.unregister(self.shutdown)
        clean = clean and self.workers is not None and self.workers.dead_worker() is None
        if clean:
            try:
                self.channel.send(Stop())
                self.workers.wake()
            except Exception:
                logger.exception("could not ask the tensor-parallel workers to exit")
                clean = False
        # The workers leave the group as soon as they read Stop: leave it with them.
        if clean and self.runner is not None:
            try:
                self.runner.release_graphs()
            except Exception:
                logger.exception("releasing the CUDA graphs failed")
        if self.group is not None:
            self.group.leave(abort=not clean)
        if self.workers is not None:
            self.workers.stop(clean)
            self._watchdog.join(GROUP_CLOSE_TIMEOUT_S + 1)  # it may be aborting the group
        self.channel.close()
        on_gpu = self.runner is not None and self.runner.device.type == "cuda"
        self.runner = None  # frees rank 0's weights and KV cache
        if on_gpu:
            hand_back_freed_memory(at_shutdown=True)


def _devices(config: Config, n: int) -> tuple[list[torch.device], str]:
    """One device per rank and the collective backend for them."""
    device = resolve_device(config)
    if device.type != "cuda":
        return [torch.device("cpu")] * n, "gloo"
    first = device.index or 0
    if torch.cuda.device_count() < first + n:
        raise ValueError(f"tensor_parallel_size={n} needs GPUs cuda:{first}..cuda:{first + n - 1} "
                         f"(one per rank); {torch.cuda.device_count()} visible")
    return [torch.device("cuda", first + r) for r in range(n)], "nccl"
