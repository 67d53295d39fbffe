"""Building an engine core on this process's device(s): the one module that imports the
device side (create_executor), so engine/ and the front ends above it import no torch."""
import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor

from nanovllm.config import Config
from nanovllm.engine.core import EngineCore
from nanovllm.engine.core_loop import picklable, serve_core
from nanovllm.engine.executor import Executor
from nanovllm.engine.messages import Dead, Tokenizer
from nanovllm.structured.grammars import Grammars
from nanovllm.utils.process import exit_at_once, start_group
from nanovllm.utils.tokenizer import gpu_host, load_tokenizer
from nanovllm.worker import create_executor


def tokenizer_beside_executor(config: Config):
    """(tokenizer, executor): the tokenizer loads on a thread while this one builds the
    executor (weights, KV cache, warm-up). Both take seconds on a fresh machine (importing
    transformers; compiling kernels), and they need nothing from each other."""
    with ThreadPoolExecutor(1, thread_name_prefix="nanovllm-tokenizer") as pool:
        # On a GPU host, a first load's transformers imports go to a child process: here
        # they would hold the GIL against the warm-up's compiles (utils/tokenizer.py).
        in_child = config.device != "cpu" and gpu_host()
        job = pool.submit(load_tokenizer, config.tokenizer, in_child)
        executor = create_executor(config)
        try:
            return job.result(), executor
        except BaseException:
            executor.shutdown()
            raise


def build_core(config: Config, eos_ids: set[int], tokenizer, stream: bool,
               executor: Executor | None = None) -> EngineCore:
    """An EngineCore on this process's device(s) (on `executor` when one was made
    already), with a grammar service for structured output when there is a tokenizer (it
    compiles nothing until a request asks)."""
    executor = executor or create_executor(config)
    grammars = (None if tokenizer is None
                else Grammars(tokenizer, config.hf_config.vocab_size, eos_ids))
    return EngineCore(config, executor, eos_ids, tokenizer, stream, grammars)


def core_process_main(config: Config, eos_ids: set[int] | None, tokenizer, stream: bool,
                      conns: tuple, log_level: int, env: dict, threads: int | None,
                      group: bool) -> None:
    """Entry point of an engine-core process: its GPUs (set before CUDA starts) and CPU
    threads, then the core (a failure to build it is reported as Dead), served until
    stopped. group: a process group of its own, which its tensor-parallel workers join, so
    that if it is killed its parent stops them at once."""
    # Ctrl-C reaches every process of the terminal's group: the front end decides when the
    # engine stops (it finishes or aborts requests first), so the core ignores SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    if group:
        start_group()
    os.environ.update(env)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    inbox, outbox = conns
    try:
        if eos_ids is None:  # they come down the pipe while the model builds
            core = _build_core_then_tokenizer(config, stream, inbox)
            if core is None:
                return  # the front end gave up (its tokenizer failed to load)
        else:
            core = build_core(config, eos_ids, tokenizer, stream)
    except BaseException as e:  # noqa: BLE001 - the front end raises it from its constructor
        outbox.send(Dead(picklable(e)))
        return
    try:
        serve_core(core, inbox, outbox)
    finally:
        core.shutdown()
    exit_at_once()  # stopped cleanly: the front end's shutdown() returns ~0.4 s sooner


def _build_core_then_tokenizer(config: Config, stream: bool, inbox) -> EngineCore | None:
    """The executor (weights, KV cache, warm-up), then the Tokenizer command the front end
    sends once it has loaded its tokenizer, then the core; None if the front end sent Stop or
    went away instead."""
    executor = create_executor(config)
    try:
        msg = inbox.recv()
    except (EOFError, OSError):
        msg = None
    if not isinstance(msg, Tokenizer):
        executor.shutdown()
        return None
    try:
        return build_core(config, msg.eos_ids, msg.tokenizer, stream, executor)
    except BaseException:
        executor.shutdown()
        raise


def serve_and_close(core: EngineCore, inbox, outbox) -> None:
    """Serve the core over its pipes (on a thread), then release it."""
    try:
        serve_core(core, inbox, outbox)
    finally:
        core.shutdown()
