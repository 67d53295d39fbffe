"""Starting the engine clients a front end drives: LLM asks for 1..N (start_clients): one
core stepped in this process, N replica processes of this host (data parallelism), or N Ray
actors; AsyncLLM asks for one core served over pipes by a child process or a thread
(start_pipe_client).
"""
import dataclasses
import logging
import multiprocessing
import os
from collections.abc import Callable

from nanovllm.config import Config
from nanovllm.core_builder import build_core, core_process_main, serve_and_close
from nanovllm.engine.client import InprocClient, Sink
from nanovllm.engine.pipe_client import PipeClient, ThreadRunner
from nanovllm.utils.process import Child, pipes, start_context
from nanovllm.utils.tokenizer import PickledTokenizer


def start_pipe_client(config: Config, eos_ids: set[int] | None, tokenizer, stream: bool,
                      name: str, sink: Sink, what: str, in_process: bool = False,
                      env: dict | None = None, threads: int | None = None,
                      group: bool = False) -> PipeClient:
    """A client whose core runs in a child process (or, in_process, on a thread of this
    one: built here first, so a bad start raises here); wait_ready() before use. what: the
    front end, for the error a missing __main__ guard gets. eos_ids None (a child only): the
    child builds the model while the caller loads its tokenizer, which it then hands over
    with PipeClient.send_tokenizer before wait_ready()."""
    assert eos_ids is not None or not in_process
    ctx = multiprocessing.get_context() if in_process else start_context(what)
    ours, theirs = pipes(ctx)
    thread_name = "nanovllm-" + name.replace(" ", "-")
    if in_process:
        core = build_core(config, eos_ids, tokenizer, stream)
        runner = ThreadRunner(serve_and_close, (core, *theirs), thread_name)
    else:
        level = logging.getLogger().getEffectiveLevel()
        shipped = None if tokenizer is None else PickledTokenizer(tokenizer)
        runner = Child(ctx, core_process_main, (config, eos_ids, shipped, stream, theirs, level,
                                                env or {}, threads, group), thread_name,
                       group=group)
        for conn in theirs:
            conn.close()
    client = PipeClient(name, runner, ours, sink)
    if in_process:
        client.core = core
    return client


def hand_over_tokenizer(clients: list[PipeClient], eos_ids: set[int], tokenizer) -> None:
    """Send cores started with eos_ids None (start_pipe_client) their end ids and tokenizer
    (pickled once for all of them)."""
    shipped = None if tokenizer is None else PickledTokenizer(tokenizer)
    for client in clients:
        client.send_tokenizer(eos_ids, shipped)


def steps_in_process(config: Config, processes: bool = False) -> bool:
    """Whether start_clients steps one core in this process (no Ray, one replica)."""
    return (config.distributed_executor_backend != "ray" and config.data_parallel_size == 1
            and not processes)


def start_clients(config: Config, eos_ids: set[int] | None, tokenizer, sink: Sink,
                  processes: bool = False, executor=None,
                  tokenizer_later: Callable[[], tuple[set[int], object]] | None = None) -> list:
    """LLM's clients: Ray actors (distributed_executor_backend="ray"), replica processes
    (data_parallel_size > 1, or processes), or one core stepped in this process (on
    `executor`, when the caller made it already). Each is ready; if one fails to start,
    those started are stopped and its error raised. tokenizer_later (replica processes
    only; eos_ids and tokenizer then None): called once the replicas are building their
    models, it loads and returns (eos_ids, tokenizer), which they are then sent."""
    assert executor is None or steps_in_process(config, processes)
    assert tokenizer_later is None or (eos_ids is None and not steps_in_process(
        config, processes) and config.distributed_executor_backend != "ray")
    if config.distributed_executor_backend == "ray":
        from nanovllm.ray_client import start_ray_clients

        return start_ray_clients(config, eos_ids, tokenizer, sink)
    dp = config.data_parallel_size
    if steps_in_process(config, processes):
        return [InprocClient(build_core(config, eos_ids, tokenizer, stream=False,
                                        executor=executor))]
    gpus = None
    if config.device != "cpu":
        from nanovllm.worker.device import replica_gpus

        gpus = replica_gpus(config)
    # Replicas on CPU share its cores; more threads than cores only adds contention. A count
    # set in the environment wins, as it does for torch in an engine process of AsyncLLM.
    threads = (None if gpus or "OMP_NUM_THREADS" in os.environ
               else max(1, (os.cpu_count() or 1) // dp))
    if gpus:  # each replica sees only its own GPUs: the first is its cuda:0
        config = dataclasses.replace(config, device="cuda:0")
    clients = []
    try:
        for r in range(dp):
            env = {} if gpus is None else {"CUDA_VISIBLE_DEVICES": gpus[r]}
            clients.append(start_pipe_client(config, eos_ids, tokenizer, False,
                                             f"data-parallel replica {r}", sink,
                                             "an LLM with data_parallel_size > 1", env=env,
                                             threads=threads, group=True))
        if tokenizer_later is not None:
            hand_over_tokenizer(clients, *tokenizer_later())
        for client in clients:
            client.wait_ready()
    except BaseException:
        for client in clients:
            client.request_stop()
        for client in clients:
            client.join()
        raise
    return clients
