"""LLM: the offline front end, `LLM(path, **config).generate(prompts, sampling_params)`.

It drives 1..N engine clients (engine/client.py): one core stepped on this thread (the
default), data_parallel_size replica processes of this host, or replicas in Ray actors
(distributed_executor_backend="ray"). Prompts are processed here once (engine/inputs.py),
spread over the cores by pending tokens, and the cores' outputs become RequestOutputs here
(engine/output_processor.py), returned in input order.
"""
import atexit
import itertools
import queue
from collections.abc import Iterable
from enum import Enum
from time import perf_counter

from nanovllm.config import Config
from nanovllm.engine.client import InprocClient
from nanovllm.engine.inputs import InputProcessor
from nanovllm.engine.load_balance import balance, request_cost
from nanovllm.engine.messages import Dead, Outputs
from nanovllm.engine.output_processor import RequestState, failure
from nanovllm.engine.progress import Progress
from nanovllm.engine.prompts import generate_args, request_id_list
from nanovllm.engine.tokenizer import TextDecoder, resolve_eos_ids
from nanovllm.outputs import RequestOutput
from nanovllm.sampling_params import SamplingParams
from nanovllm.structured import validate as validate_structured
from nanovllm.utils.tokenizer import load_tokenizer


class State(Enum):
    """Where an LLM stands."""

    READY = "ready"    # serving
    FAILED = "failed"  # a core died: nothing more can be served
    CLOSED = "closed"  # shut down


class LLM:
    """`LLM(model, **config)`: generate / chat over the whole batch, or add_request / step
    one step at a time; as in vLLM / nano-vLLM."""

    def __init__(self, model: str, engine_process: bool = False, **kwargs):
        """Engine options as Config takes them (see config.py); engine_process: run even a
        single core in a process of its own, as each data-parallel replica runs."""
        # Here, not at the top: building a core brings in the device side (torch), which
        # importing nanovllm must not.
        from nanovllm.core_builder import tokenizer_beside_executor
        from nanovllm.launch import start_clients, steps_in_process

        config = Config.from_kwargs(model, **kwargs)
        self.config = config
        executor = later = None
        self.tokenizer = None
        if config.skip_tokenizer_init:
            pass
        elif steps_in_process(config, engine_process):
            self.tokenizer, executor = tokenizer_beside_executor(config)
        elif config.distributed_executor_backend == "ray":
            self.tokenizer = load_tokenizer(config.tokenizer)
        else:
            def later():  # while the replica processes build their models
                self.tokenizer = load_tokenizer(config.tokenizer)
                return resolve_eos_ids(config, self.tokenizer), self.tokenizer
        self.state, self.failure = State.READY, None
        self._messages: queue.Queue = queue.Queue()  # (client, Outputs | Dead) from cores
        self.clients = start_clients(
            config, None if later else resolve_eos_ids(config, self.tokenizer), self.tokenizer,
            lambda c, m: self._messages.put((c, m)), engine_process, executor, later)
        self.text = TextDecoder(self.tokenizer)
        self._inproc = isinstance(self.clients[0], InprocClient)
        self.inputs = InputProcessor(config, self.tokenizer,
                                     min(c.num_kvcache_blocks for c in self.clients),
                                     validate_structured)
        self._ids = itertools.count()
        self._live: dict[int, tuple[RequestState, object]] = {}  # id -> (state, its client)
        self._samples: dict[int, list] = {}  # id -> sample deltas not yet made an output
        atexit.register(self.shutdown)

    # -- lifecycle --------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the cores (their processes, workers and shared memory); idempotent."""
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        for client in self.clients:  # all at once: they stop in parallel
            getattr(client, "request_stop", client.shutdown)()
        for client in self.clients:
            client.shutdown()
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

    # -- requests ---------------------------------------------------------------------------
    def get_default_sampling_params(self) -> SamplingParams:
        """What a request without sampling_params gets (vLLM's name): SamplingParams' defaults
        overridden by the model's generation_config.json (see Config.generation_config)."""
        return self.inputs.default_params()

    def add_request(self, prompt, sampling_params: SamplingParams | None = None,
                    priority: int = 0) -> int:
        """Queue one request; returns its request id (the `request_id` of its output).
        `prompt` takes any form generate() accepts for one prompt; a lower `priority` is
        scheduled first (ties by arrival)."""
        self._check_serving()
        return self._add([prompt], [sampling_params], [priority])[0]

    def _add(self, prompts: list, sps: list, priorities: list) -> list[int]:
        """Validate every request, then queue them all on the least loaded cores."""
        made = [self.inputs.process(next(self._ids), p, sp, pr)
                for p, sp, pr in zip(prompts, sps, priorities)]
        costs = [request_cost(len(r.prompt_token_ids), r.sampling_params) for r, _ in made]
        loads = [sum(c.pending.values()) for c in self.clients]
        shares: dict[int, list] = {}
        for (request, text), cost, c in zip(made, costs, balance(costs, loads)):
            client = self.clients[c]
            client.pending[request.request_id] = cost
            state = RequestState(request.request_id, text, request.prompt_token_ids,
                                 request.sampling_params, self.text)
            self._live[request.request_id] = (state, client)
            shares.setdefault(c, []).append(request)
        for c, requests in shares.items():
            try:
                self.clients[c].add(requests)
            except RuntimeError as e:  # the core is gone
                raise self._failed(self.clients[c].dead_error()) from e
        return [r.request_id for r, _ in made]

    def abort_request(self, request_id: int | Iterable[int]) -> None:
        """Stop one request id or several now and free their KV blocks; each ends with
        finish_reason "abort", its output returned by the next step(). Ids that are unknown
        or already finished are ignored (as in vLLM)."""
        ids = request_id_list(request_id)
        for client in self.clients:
            mine = [i for i in ids if self._live.get(i, (None, None))[1] is client]
            if mine:
                client.abort(mine)

    def abort_all(self) -> None:
        """Drop every queued and running request, freeing their blocks; unlike
        abort_request, their outputs are dropped too (step() returns none of them)."""
        for client in self.clients:
            mine = [i for i, (_, c) in self._live.items() if c is client]
            if isinstance(client, InprocClient):
                client.core.abort_all()
            elif mine:
                client.abort(mine)
            client.pending.clear()
        self._live.clear()
        self._samples.clear()

    def is_finished(self) -> bool:
        """True when no request is waiting, running or in flight, and step() owes no output."""
        return not self._live and (not self._inproc or self.clients[0].core.is_finished())

    def step(self) -> tuple[list[RequestOutput], int]:
        """Run one step; returns (outputs of the requests that finished in it or were aborted
        since the last step, tokens: > 0 prefill, < 0 decode). Outputs are the RequestOutputs
        `generate` returns; a request with n > 1 comes back once, when its last sample ends.
        With cores in other processes: the next outputs any of them sends."""
        self._check_serving()
        out = self._next()
        return self._finish(out), out.num_tokens

    def _next(self) -> Outputs:
        """The next outputs: one step of the core in this process, or what a core sent."""
        if self._inproc:
            return self.clients[0].step()
        _, msg = self._messages.get()
        if isinstance(msg, Dead):
            if self.state is State.CLOSED:
                raise RuntimeError("this LLM has been shut down; create a new one")
            raise self._failed(msg.error)
        return msg

    def _failed(self, error: BaseException) -> RuntimeError:
        """Mark this LLM failed by a core's death (the first one reported stays)."""
        self.failure = self.failure or str(error)
        self.state = State.FAILED
        return RuntimeError(self.failure)

    def _finish(self, out: Outputs) -> list[RequestOutput]:
        """The RequestOutputs of the requests `out` ended (deltas of others are kept)."""
        for delta in out.samples:
            if delta.request_id in self._live:
                self._samples.setdefault(delta.request_id, []).append(delta)
        outputs = []
        for end in out.ended:
            state, client = self._live.pop(end.request_id, (None, None))
            if state is None:
                continue  # dropped by abort_all, or from an aborted generate()
            client.pending.pop(end.request_id, None)
            outputs.append(state.output(self._samples.pop(end.request_id, []), end))
        return outputs

    # -- batch API --------------------------------------------------------------------------
    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True,
                 priority: list[int] | None = None) -> list[RequestOutput]:
        """Complete every prompt; returns RequestOutputs in input order. `prompts` is one
        prompt or an iterable of them (strings, token-id lists, {"prompt": ...} or
        {"prompt_token_ids": ...} dicts); `sampling_params` is one SamplingParams or a list
        with one per prompt; `priority` is None or a list with one int per prompt."""
        self._check_serving()
        if not self.is_finished():
            raise ValueError(f"{len(self._live)} request(s) queued with add_request() are still "
                             "pending (an aborted one until step() has returned its output): "
                             "finish them with step() until is_finished() (or abort_all()) "
                             "before calling generate(), which would otherwise drop their "
                             "outputs")
        prompts, sps, priorities = generate_args(prompts, sampling_params, priority)
        ids = self._add(prompts, sps, priorities)
        position = {rid: i for i, rid in enumerate(ids)}
        results: list[RequestOutput | None] = [None] * len(ids)
        progress = Progress(len(ids), use_tqdm)
        try:
            while not self.is_finished():
                t = perf_counter()
                out = self._next()
                progress.step(out.num_tokens, perf_counter() - t)
                for output in self._finish(out):
                    why = failure(output)
                    if why is not None:
                        raise RuntimeError(f"a step of this generate() call failed, so it was "
                                           f"stopped: {why}")
                    results[position[output.request_id]] = output
                    progress.done(1)
        except BaseException:
            if self.state is State.READY:
                self.abort_all()
            raise
        finally:
            progress.close()
        return results

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True,
             chat_template: str | None = None,
             add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {"role", "content"} dicts) or a
        list of conversations, through the chat template; one RequestOutput each."""
        prompts = self.inputs.chat_prompts(messages, chat_template, add_generation_prompt)
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def stats(self) -> list[dict]:
        """Each core's stats (KV blocks, live requests, idle...), in core order."""
        self._check_serving()
        return [client.stats() for client in self.clients]
