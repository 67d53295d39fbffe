"""Data parallelism on one host: N engine replicas behind one LLM.generate.

`LLM(model, data_parallel_size=N)` returns a DataParallelLLM. Each replica is an engine core
(engine_core.py) in a process of its own, with its own scheduler, KV cache and (when
tensor_parallel_size > 1) its own tensor-parallel group; on CUDA each sees only its own
GPUs. generate() sends every request to the replica with the fewest pending tokens (prompt
plus max_tokens of the requests it has not finished), collects the whole RequestOutputs the
replicas send back as requests end, and returns them in input order. A replica that dies
raises a RuntimeError naming it, as a dead tensor-parallel worker does. No torch here on
CPU: the replicas import it.
"""
import atexit
import itertools
import os
import queue
from enum import Enum

from tqdm.auto import tqdm

from nanovllm.config import Config
from nanovllm.engine.prompts import generate_args, parse_prompt
from nanovllm.engine.replica import Replica
from nanovllm.engine.tokenizer import load_tokenizer
from nanovllm.llm import LLM
from nanovllm.outputs import RequestOutput
from nanovllm.sampling_params import SamplingParams, check_text
from nanovllm.utils.spawn import GUARD_HINT


class State(Enum):
    """Where the replicas stand as a whole."""

    READY = "ready"    # every replica serving
    FAILED = "failed"  # a replica died: nothing more can be served
    CLOSED = "closed"  # shut down


def request_cost(num_prompt_tokens: int, sp) -> int:
    """The tokens a request will put through its replica: its prompt and every sample's
    output (at most max_tokens)."""
    sp = SamplingParams() if sp is None else sp
    return num_prompt_tokens + getattr(sp, "max_tokens", 0) * getattr(sp, "n", 1)


def balance(costs: list[int], loads: list[int]) -> list[int]:
    """The replica for each request, in order: the one with the fewest pending tokens at the
    time (loads, updated in place)."""
    chosen = []
    for cost in costs:
        r = min(range(len(loads)), key=loads.__getitem__)
        loads[r] += cost
        chosen.append(r)
    return chosen


def encode_prompts(prompts: list, tokenizer) -> list[tuple]:
    """(prompt to send, its token count) per prompt: text is tokenized here, so replicas are
    balanced by tokens and skip tokenizing; a prompt this side cannot read goes as it is
    (its replica raises the error LLM.generate would)."""
    out = []
    for prompt in prompts:
        try:
            text, ids = parse_prompt(prompt)
        except ValueError:
            out.append((prompt, 0))
            continue
        if ids is None and tokenizer is not None:
            check_text("prompt", text)  # the tokenizer's TypeError would not name it
            ids = tokenizer.encode(text)
        if ids is None:
            out.append((prompt, len(text)))
        else:
            out.append(({"prompt": text, "prompt_token_ids": ids} if text is not None else ids,
                        len(ids)))
    return out


class DataParallelLLM:
    """data_parallel_size engine replicas, each a process with its own GPUs; generate() and
    chat() as LLM's."""

    def __init__(self, model: str, **kwargs):
        config = Config.from_kwargs(model, **kwargs)
        if config.distributed_executor_backend == "ray":
            raise ValueError("distributed_executor_backend='ray' replicas are started by "
                             "nanovllm.ray.RayLLM (pip install -e '.[ray]')")
        self.config = config
        self.tokenizer = None if config.skip_tokenizer_init else load_tokenizer(config.tokenizer)
        dp = config.data_parallel_size
        if config.device == "cpu":
            gpus = None  # no torch needed to know it
        else:
            from nanovllm.worker.device import replica_gpus

            gpus = replica_gpus(config)
        # Replicas on CPU share its cores; more threads than cores only adds contention.
        threads = None if gpus else max(1, (os.cpu_count() or 1) // dp)
        kwargs = {**kwargs, "data_parallel_size": 1}
        if gpus:
            kwargs["device"] = "cuda:0"  # the first of the replica's own GPUs
        self.state = State.READY
        self.failure: str | None = None
        self._messages: queue.Queue = queue.Queue()
        self._keys = itertools.count()
        self.replicas: list[Replica] = []
        atexit.register(self.shutdown)
        try:
            for r in range(dp):
                env = {} if gpus is None else {"CUDA_VISIBLE_DEVICES": gpus[r]}
                self.replicas.append(Replica(r, config.model, kwargs, env, threads,
                                              self._messages))
            self._wait_ready()
        except BaseException:
            self.shutdown()
            raise

    def _wait_ready(self) -> None:
        """Wait for every replica's engine; the first failure to start is raised."""
        waiting = set(range(len(self.replicas)))
        while waiting:
            index, msg = self._messages.get()
            if msg[0] == "ready":
                waiting.discard(index)
            elif msg[0] in ("dead", "gone"):
                error = msg[1] if msg[0] == "dead" else None
                if error is not None:
                    raise error  # e.g. a bad checkpoint: the error LLM(...) would raise
                raise RuntimeError(self.replicas[index].died(None).replace(
                    " died", " died while starting") + f"; {GUARD_HINT}")

    # -- lifecycle --------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop every replica process (idempotent)."""
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        for replica in self.replicas:
            replica.send_quietly(("stop",))  # all at once: they stop in parallel
        for replica in self.replicas:
            replica.stop()
        atexit.unregister(self.shutdown)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def _check_serving(self) -> None:
        if self.state is State.CLOSED:
            raise RuntimeError("this LLM has been shut down; create a new one")
        if self.state is State.FAILED:
            raise RuntimeError(self.failure)

    # -- batch API --------------------------------------------------------------------------
    def get_default_sampling_params(self) -> SamplingParams:
        """What a request without sampling_params gets (the replicas apply the same)."""
        return SamplingParams(**self.config.generation_defaults.sampling)

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True,
                 priority: list[int] | None = None) -> list[RequestOutput]:
        """LLM.generate over the replicas: RequestOutputs in input order (request_id: an id
        unique across this LLM's replicas)."""
        self._check_serving()
        prompts, sps, priorities = generate_args(prompts, sampling_params, priority)
        encoded = encode_prompts(prompts, self.tokenizer)
        costs = [request_cost(n, sp) for (_, n), sp in zip(encoded, sps)]
        loads = [replica.load for replica in self.replicas]
        keys = [next(self._keys) for _ in prompts]
        position = {key: i for i, key in enumerate(keys)}
        where: dict[int, Replica] = {}
        results: list[RequestOutput | None] = [None] * len(prompts)
        bar = tqdm(total=len(prompts), desc="Generating", dynamic_ncols=True,
                   disable=not use_tqdm)
        try:
            for key, (prompt, _), sp, pr, cost, r in zip(keys, encoded, sps, priorities, costs,
                                                         balance(costs, loads)):
                replica = where[key] = self.replicas[r]
                replica.pending[key] = cost
                self._send(replica, ("add", key, prompt, sp, pr))
            left = len(keys)
            while left:
                for key, output in self._next_outputs():
                    i = position.get(key)
                    if i is None or results[i] is not None:
                        continue  # an aborted request of an earlier call
                    if isinstance(output, BaseException):
                        raise output  # a bad request: the error LLM.generate raises
                    failed = next((c for c in output.outputs if c.finish_reason == "error"),
                                  None)
                    if failed is not None:  # its step raised: as LLM.generate, stop
                        raise RuntimeError(f"a step of this generate() call failed, so it was "
                                           f"stopped: {failed.stop_reason}")
                    output.request_id = key
                    results[i] = output
                    left -= 1
                    bar.update(1)
        except BaseException:
            # Drop what is still running (its outputs, arriving later, are ignored).
            for key, replica in where.items():
                if results[position[key]] is None and self.state is State.READY:
                    replica.send_quietly(("abort", key))
            raise
        finally:
            bar.close()
        return results

    chat = LLM.chat

    def stats(self) -> list[dict]:
        """Each replica's engine stats (KV blocks, live requests, idle...), in replica order."""
        self._check_serving()
        token = next(self._keys)
        for replica in self.replicas:
            self._send(replica, ("stats", token))
        got: dict[int, dict] = {}
        while len(got) < len(self.replicas):
            got.update(self._next_outputs(stats_token=token))
        return [got[r] for r in range(len(self.replicas))]

    def _send(self, replica: Replica, msg: tuple) -> None:
        """Send to a replica; if its pipe is gone it died (maybe before its reader saw it):
        the same named error as a death noticed while waiting."""
        try:
            replica.send(msg)
        except OSError as e:
            raise self._failed(replica, None) from e

    def _failed(self, replica: Replica, error: BaseException | None) -> RuntimeError:
        """Mark this LLM failed by `replica`'s death (the first one reported stays): the error
        to raise."""
        self.failure = self.failure or replica.died(error)
        self.state = State.FAILED
        return RuntimeError(self.failure)

    def _next_outputs(self, stats_token: int | None = None) -> list[tuple[int, object]]:
        """Wait for the next message from any replica: (key, RequestOutput) of each request
        it finished, (key, error) of a request it refused, or (replica index, stats) for a
        reply to stats_token; a dead replica raises RuntimeError naming it."""
        index, msg = self._messages.get()
        replica, kind = self.replicas[index], msg[0]
        if kind == "items":
            outputs = []
            for key, items in msg[1].items():
                replica.pending.pop(key, None)
                outputs.append((key, items[-1][1]))
            return outputs
        if kind == "added":
            _, key, _, error = msg
            if error is not None:
                replica.pending.pop(key, None)
                return [(key, error)]
        elif kind == "stats":
            return [(index, msg[2])] if msg[1] == stats_token else []
        elif kind in ("dead", "gone"):
            error = msg[1] if kind == "dead" else None
            raise self._failed(replica, error) from error
        return []
