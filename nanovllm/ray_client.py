"""Engine cores as Ray actors, on one machine or many (`pip install -e ".[ray]"`).

`LLM(model, data_parallel_size=N, distributed_executor_backend="ray")` starts N engine cores,
each (with its own tensor-parallel group) in a Ray actor, and reaches each through a
RayClient. One placement group reserves a bundle per core holding its tensor_parallel_size
GPUs (or CPUs): a core's ranks share memory with each other, so they must sit on one node,
and the SPREAD strategy puts cores on different nodes where it can. LLM balances requests
over the clients by tokens as for replica processes; each client sends its share in one
call, and its reader hands the outputs back; an actor that died raises a RuntimeError
naming it.
"""
import dataclasses
import logging
import os
import queue
import threading

from nanovllm.config import Config
from nanovllm.engine.client import ClientState, EngineDeadError, Sink
from nanovllm.engine.messages import Dead, Outputs, Request
from nanovllm.utils.tokenizer import PickledTokenizer

logger = logging.getLogger(__name__)

# How long to wait for the cluster to grant the replicas' placement group.
PLACEMENT_TIMEOUT_S = 120.0


def ray_module():
    """The ray module, or an ImportError saying how to get it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("the Ray backend needs Ray: pip install -e '.[ray]' (or "
                          "pip install 'ray[data]')") from e
    return ray


class CoreActor:
    """The body of one core actor: an EngineCore on the actor's GPUs (Ray sets
    CUDA_VISIBLE_DEVICES) or CPUs."""

    def __init__(self, config: Config, eos_ids: set[int], tokenizer):
        from nanovllm.core_builder import build_core

        self.core = build_core(config, eos_ids, tokenizer, stream=False)

    def where(self) -> tuple[str, int, int]:
        """(node IP, pid, KV-cache blocks) of this actor."""
        return (ray_module().util.get_node_ip_address(), os.getpid(),
                self.core.scheduler.block_manager.num_blocks)

    def run(self, requests: list[Request]) -> Outputs:
        """Add the requests and step until the core is idle; everything it reported."""
        for request in requests:
            self.core.add(request)
        out = Outputs()
        while not self.core.is_finished():
            out.extend(self.core.step())
        return out

    def abort(self, request_ids: list[int]) -> None:
        """Abort these requests in the core."""
        self.core.abort(request_ids)

    def stats(self) -> dict:
        """The core's counters (see EngineCore.stats)."""
        return self.core.stats()

    def shutdown(self) -> None:
        """Stop the core (its tensor-parallel workers) before the actor goes."""
        self.core.shutdown()


class RayClient:
    """A core in a Ray actor: each add() is one remote call, whose outputs one reader
    thread hands to the sink in order; a dead actor is named."""

    def __init__(self, index: int, actor, where: tuple, sink: Sink, release):
        self.index, self.actor, self.sink, self._release = index, actor, sink, release
        self.name = (f"data-parallel replica {index} (Ray actor, node {where[0]}, "
                     f"pid {where[1]})")
        self.where, self.num_kvcache_blocks = where[:2], where[2]
        self.state = ClientState.READY
        self.error: BaseException | None = None
        self.pending: dict[int, int] = {}  # request id -> its cost (front end's balancing)
        self._calls: queue.Queue = queue.Queue()  # remote calls whose outputs are owed
        self._stopping = None  # the actor's shutdown call, once asked
        self._reader = threading.Thread(target=self._read, name=f"nanovllm-ray{index}-reader",
                                        daemon=True)
        self._reader.start()

    def add(self, requests: list[Request]) -> None:
        """Send requests to the actor (EngineDeadError once it is gone)."""
        if self.state is not ClientState.READY:
            raise self.dead_error()
        self._calls.put(self.actor.run.remote(requests))

    def abort(self, request_ids: list[int]) -> None:
        """Abort these requests in the actor (nothing once it is gone)."""
        if self.state is ClientState.READY:
            self.actor.abort.remote(list(request_ids))

    def stats(self, timeout: float | None = 30.0) -> dict:
        """The actor's core counters (EngineDeadError if it died)."""
        try:
            return ray_module().get(self.actor.stats.remote(), timeout=timeout)
        except ray_module().exceptions.RayActorError as e:
            raise self.dead_error() from e

    def _read(self) -> None:
        ray = ray_module()
        while True:
            ref = self._calls.get()
            if ref is None:
                return
            try:
                out = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a dead actor, or a core that raised
                self.error = e
                self.state = ClientState.DEAD
                self.sink(self, Dead(self.dead_error()))
                return
            self.sink(self, out)

    def dead_error(self) -> EngineDeadError:
        """The error that names this core and why it stopped serving."""
        if self.state is ClientState.CLOSED:
            return EngineDeadError(f"{self.name} has been shut down")
        return EngineDeadError(f"{self.name} died ({type(self.error).__name__}); shut this "
                               "LLM down and create a new one")

    def request_stop(self) -> None:
        """Ask the actor to stop its core, without waiting."""
        if self.state is not ClientState.CLOSED:
            self.state = ClientState.CLOSED
            self._stopping = self.actor.shutdown.remote()
            self._calls.put(None)

    def shutdown(self) -> None:
        """Stop the core and the actor (idempotent)."""
        self.request_stop()
        ray = ray_module()
        stopping, self._stopping = self._stopping, None
        if stopping is not None:
            try:
                ray.get(stopping, timeout=30)
            except Exception:
                logger.debug("replica %d could not stop its core", self.index, exc_info=True)
            ray.kill(self.actor)
            self._release()


def bundle_for(config: Config, ray) -> dict:
    """One replica's resources: its GPUs, or as many CPUs as it has ranks."""
    tp = config.tensor_parallel_size
    gpu = config.device != "cpu" and (config.device is not None
                                     or ray.cluster_resources().get("GPU", 0) >= 1)
    return {"GPU": tp, "CPU": 1} if gpu else {"CPU": tp}


def _no_room(dp: int, bundle: dict, have: dict) -> str:
    """The error for replicas the cluster cannot place."""
    have = {k: v for k, v in have.items() if k in bundle}
    return (f"data_parallel_size={dp} needs {dp} x {bundle} (one bundle per replica, each on "
            f"one node); the Ray cluster has {have}: lower data_parallel_size or add nodes")


def start_ray_clients(config: Config, eos_ids: set[int], tokenizer, sink: Sink) -> list:
    """data_parallel_size cores as Ray actors (any node of the cluster), one RayClient each;
    they build their engines in parallel, and the first error is raised."""
    ray = ray_module()
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not ray.is_initialized():
        ray.init()  # joins the cluster `ray start` made on this node, else starts one
    dp = config.data_parallel_size
    bundle = bundle_for(config, ray)
    have = ray.cluster_resources()
    # Checked first: a placement group that cannot fit would wait for the whole timeout.
    if any(have.get(k, 0) < v * dp for k, v in bundle.items()):
        raise ValueError(_no_room(dp, bundle, have))
    pg = placement_group([bundle] * dp, strategy="SPREAD")
    left = [dp]

    def release():  # the last client to shut down frees the placement group
        left[0] -= 1
        if left[0] == 0:
            remove_placement_group(pg)

    actors = []
    try:
        if not pg.wait(PLACEMENT_TIMEOUT_S):
            raise ValueError(_no_room(dp, bundle, ray.cluster_resources()))
        if "GPU" in bundle:  # each actor sees only its own GPUs: the first is its cuda:0
            config = dataclasses.replace(config, device="cuda:0")
        remote = ray.remote(CoreActor)
        shipped = None if tokenizer is None else PickledTokenizer(tokenizer)
        for r in range(dp):
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg,
                                                        placement_group_bundle_index=r)
            actors.append(remote.options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                                         scheduling_strategy=strategy
                                         ).remote(config, eos_ids, shipped))
        try:
            wheres = ray.get([a.where.remote() for a in actors])
        except ray.exceptions.RayTaskError as e:  # e.g. a bad checkpoint: LLM(...)'s error
            raise e.cause if isinstance(e.cause, Exception) else e
    except BaseException:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(pg)
        raise
    return [RayClient(r, a, w, sink, release) for r, (a, w) in enumerate(zip(actors, wheres))]


