"""One data-parallel replica: an engine-core process with its own GPUs, its two pipes, and
a thread forwarding what it sends to the front end's queue (see data_parallel.py)."""
import logging
import os
import queue
import signal
import threading

from nanovllm.engine.engine_core import core_process_main
from nanovllm.utils.exit_status import exit_description
from nanovllm.utils.spawn import spawn_context

logger = logging.getLogger(__name__)

# How long stop() waits for a replica to stop by itself before terminating it.
STOP_TIMEOUT_S = 30.0


def replica_main(index: int, env: dict, threads: int | None, model: str, kwargs: dict,
                 inbox, outbox, log_level: int) -> None:
    """Entry point of a replica process: its GPUs (set before CUDA starts), its CPU threads,
    then an engine core sending whole outputs."""
    # A process group of its own, which its tensor-parallel workers join: if the replica is
    # killed, the front end can stop them at once (see Replica.stop).
    os.setpgid(0, 0)
    os.environ.update(env)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    core_process_main(model, kwargs, inbox, outbox, log_level, stream=False)


class Replica:
    """One replica process, its pipes, and a thread that forwards what it sends."""

    def __init__(self, index: int, model: str, kwargs: dict, env: dict, threads: int | None,
                 messages: queue.Queue):
        self.index = index
        ctx = spawn_context("DataParallelLLM")
        to_core, self.inbox = ctx.Pipe(duplex=False)
        self.outbox, from_core = ctx.Pipe(duplex=False)
        level = logging.getLogger().getEffectiveLevel()
        self.proc = ctx.Process(target=replica_main, name=f"nanovllm-dp{index}",
                                args=(index, env, threads, model, kwargs, to_core, from_core,
                                      level))
        self.proc.start()
        to_core.close()
        from_core.close()
        self.pending: dict[int, int] = {}  # key -> cost of the requests it has not finished
        # A reader per replica: a replica blocked writing to a full pipe stops reading its
        # commands, so replies must be drained while generate() is still sending.
        self.reader = threading.Thread(target=self._read, args=(messages,),
                                       name=f"nanovllm-dp{index}-reader", daemon=True)
        self.reader.start()

    @property
    def load(self) -> int:
        """Pending tokens: what balance() compares."""
        return sum(self.pending.values())

    def _read(self, messages: queue.Queue) -> None:
        try:
            while True:
                msg = self.outbox.recv()
                messages.put((self.index, msg))
                if msg[0] == "dead":
                    return
        except (EOFError, OSError):
            messages.put((self.index, ("gone",)))

    def send(self, msg: tuple) -> None:
        self.inbox.send(msg)

    def send_quietly(self, msg: tuple) -> None:
        """Send, ignoring a replica that is gone (stopping or aborting: nothing to do)."""
        try:
            self.inbox.send(msg)
        except OSError:
            pass

    def died(self, error: BaseException | None) -> str:
        """Why this replica stopped serving, for the error generate() raises."""
        where = f"data-parallel replica {self.index} (pid {self.proc.pid})"
        if error is not None:
            how = f"stopped on an error: {type(error).__name__}: {error}"
        else:
            self.proc.join(5.0)  # its pipe closes a moment before its status is readable
            how = f"died ({exit_description(self.proc.exitcode)})"
        return f"{where} {how}; shut this LLM down and create a new one"

    def stop(self) -> None:
        """Ask the replica to stop, then wait for it (terminate it if it does not)."""
        self.send_quietly(("stop",))
        self.proc.join(STOP_TIMEOUT_S)
        if self.proc.is_alive():
            logger.warning("data-parallel replica %d did not stop in %.0f s: terminating it",
                           self.index, STOP_TIMEOUT_S)
            self.proc.terminate()
            self.proc.join()
        if self.proc.exitcode != 0:
            # Killed: its tensor-parallel workers would only notice within a second or so.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # none left
        self.reader.join(STOP_TIMEOUT_S)
        self.inbox.close()
        self.outbox.close()
