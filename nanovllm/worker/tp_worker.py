"""A tensor-parallel worker process: its own ModelRunner, fed by rank 0 through the channel."""
import gc
import logging
import multiprocessing
import os
import signal
from dataclasses import dataclass

import torch

from nanovllm.config import Config
from nanovllm.distributed.channel import ShmChannel
from nanovllm.distributed.group import ProcessGroup
from nanovllm.distributed.pool import WorkerSpec

logger = logging.getLogger(__name__)

# How often an idle worker checks that rank 0 is still alive (a wake-up costs microseconds;
# an orphaned worker exits within this).
PARENT_POLL_S = 0.25


@dataclass
class RunStep:
    """Run one engine step (the same batch rank 0 runs)."""

    seqs: list
    is_prefill: bool


@dataclass
class Stop:
    """Leave the process group together with rank 0 and exit."""


def worker_main(config: Config, spec: WorkerSpec, request, done) -> None:
    """Body of a worker process: build a ModelRunner, then run every step rank 0 sends."""
    from nanovllm.worker.model_runner import ModelRunner

    # Ctrl-C goes to the whole process group; rank 0 alone decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    done.release()  # "started": rank 0 now knows the spawn itself worked
    channel = ShmChannel.attach(spec.shm_name)
    try:
        device = torch.device(spec.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            # Ranks share the CPU cores; more threads than cores only adds contention.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.tensor_parallel_size))
        group = ProcessGroup(spec.backend, spec.port, config.tensor_parallel_size, spec.rank,
                             device)
        runner = ModelRunner(config, rank=spec.rank, device=device)
        gc.freeze()  # as the engine core does (engine/core.py): full passes skip the model
        done.release()  # "ready"
        while True:
            while not request.acquire(timeout=PARENT_POLL_S):
                # Rank 0 died without shutting us down. (Its pid is no test: under a fork
                # server, that server is our parent.)
                if not multiprocessing.parent_process().is_alive():
                    os._exit(0)
            message = channel.recv()
            if isinstance(message, Stop):
                break
            runner.launch(message.seqs, message.is_prefill).result()
            done.release()
        channel.close()
        runner.release_graphs()
        group.leave(abort=False)  # rank 0 is leaving the group too
        code = 0
    except BaseException:
        # Rank 0 sees the non-zero exit code through its watchdog and raises there.
        logger.exception("tensor-parallel worker rank %d failed", spec.rank)
        code = 1
    # Skip interpreter teardown: CUDA-graph and communicator destructors can block on peers
    # that are already gone. Everything this process owns (the mapping too) goes with it.
    logging.shutdown()
    os._exit(code)
