"""Data-parallel replicas as Ray actors, on one machine or many (`pip install -e ".[ray]"`).

`RayLLM(model, data_parallel_size=N, **LLM options)` (or `LLM(..., distributed_executor_backend=
"ray")`) starts N replicas, each an LLM (with its own tensor-parallel group) in a Ray actor.
One placement group reserves a bundle per replica holding its tensor_parallel_size GPUs (or
CPUs): a replica's ranks share memory with each other, so they must sit on one node, and
the SPREAD strategy puts replicas on different nodes where it can. generate() tokenizes
here, balances the requests by tokens as DataParallelLLM does, sends each replica its
share in one call and returns the outputs in input order; a replica whose actor died raises
a RuntimeError naming it.

For a ray.data.Dataset, `generate_dataset(ds, model, sampling_params, data_parallel_size=N,
...)` maps its batches through N replica actors (Ray Data's actor pool; vLLM's Ray Data
processor works the same way) and returns a Dataset with the generated columns added.
"""
import itertools
import logging
import os

from nanovllm.config import Config
from nanovllm.engine.data_parallel import balance, encode_prompts, request_cost
from nanovllm.engine.prompts import generate_args
from nanovllm.engine.tokenizer import load_tokenizer
from nanovllm.llm import LLM
from nanovllm.outputs import RequestOutput

logger = logging.getLogger(__name__)

# How long to wait for the cluster to grant the replicas' placement group.
PLACEMENT_TIMEOUT_S = 120.0


def _ray():
    """The ray module, or an ImportError saying how to get it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("the Ray backend needs Ray: pip install -e '.[ray]' (or "
                          "pip install 'ray[data]')") from e
    return ray


class Replica:
    """The body of one replica actor: an LLM on the actor's GPUs (Ray sets
    CUDA_VISIBLE_DEVICES) or CPUs."""

    def __init__(self, model: str, kwargs: dict):
        self.llm = LLM(model, **kwargs)

    def where(self) -> tuple[str, int]:
        """(node IP, pid) of this actor: for error messages."""
        return _ray().util.get_node_ip_address(), os.getpid()

    def generate(self, prompts: list, params: list, priorities: list) -> list[RequestOutput]:
        """LLM.generate on this replica."""
        return self.llm.generate(prompts, params, use_tqdm=False, priority=priorities)

    def stats(self) -> dict:
        """The replica's KV blocks (num_blocks, num_free_blocks)."""
        bm = self.llm.scheduler.block_manager
        return dict(num_blocks=bm.num_blocks, num_free_blocks=bm.num_free_blocks)

    def shutdown(self) -> None:
        """Stop the LLM (its tensor-parallel workers) before the actor goes."""
        self.llm.shutdown()


def _bundle(config: Config, ray) -> dict:
    """One replica's resources: its GPUs, or as many CPUs as it has ranks."""
    tp = config.tensor_parallel_size
    gpu = config.device != "cpu" and (config.device is not None
                                     or ray.cluster_resources().get("GPU", 0) >= 1)
    return {"GPU": tp, "CPU": 1} if gpu else {"CPU": tp}


def _replica_kwargs(kwargs: dict, bundle: dict) -> dict:
    """A replica's LLM options: one replica, on the GPUs Ray gave the actor."""
    kwargs = {**kwargs, "data_parallel_size": 1, "distributed_executor_backend": "mp"}
    if "GPU" in bundle:
        kwargs["device"] = "cuda:0"
    return kwargs


def _no_room(dp: int, bundle: dict, have: dict) -> str:
    """The error for replicas the cluster cannot place."""
    have = {k: v for k, v in have.items() if k in bundle}
    return (f"data_parallel_size={dp} needs {dp} x {bundle} (one bundle per replica, each on "
            f"one node); the Ray cluster has {have}: lower data_parallel_size or add nodes")


class RayLLM:
    """data_parallel_size replicas as Ray actors (any node of the cluster); generate() as
    LLM's."""

    def __init__(self, model: str, **kwargs):
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        kwargs.setdefault("distributed_executor_backend", "ray")
        config = Config.from_kwargs(model, **kwargs)
        self.config = config
        self.tokenizer = None if config.skip_tokenizer_init else load_tokenizer(config.tokenizer)
        if not ray.is_initialized():
            ray.init()  # joins the cluster `ray start` made on this node, else starts one
        dp = config.data_parallel_size
        bundle = _bundle(config, ray)
        self._remove_pg = remove_placement_group
        self.actors: list = []
        self._keys = itertools.count()
        self._closed = False
        have = ray.cluster_resources()
        # Checked first: a placement group that cannot fit would wait for the whole timeout.
        if any(have.get(k, 0) < v * dp for k, v in bundle.items()):
            raise ValueError(_no_room(dp, bundle, have))
        self.pg = placement_group([bundle] * dp, strategy="SPREAD")
        try:
            if not self.pg.wait(PLACEMENT_TIMEOUT_S):
                raise ValueError(_no_room(dp, bundle, ray.cluster_resources()))
            actor = ray.remote(Replica)
            replica_kwargs = _replica_kwargs(kwargs, bundle)
            for r in range(dp):
                strategy = PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=r)
                self.actors.append(actor.options(
                    num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=strategy).remote(config.model, replica_kwargs))
            # The replicas build their engines in parallel; the first error is raised.
            self.where = self._call([a.where.remote() for a in self.actors])
        except BaseException:
            self.shutdown()
            raise

    def _call(self, refs: list) -> list:
        """ray.get of one call per replica: a bad request's error as LLM raises it, a dead
        actor as a RuntimeError naming its replica."""
        ray = _ray()
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return ray.get(refs)
        except RayTaskError as e:
            raise e.cause if isinstance(e.cause, Exception) else e
        except RayActorError as e:
            dead = self._dead_replica(refs)
            where = getattr(self, "where", None)
            place = "" if not where else f", node {where[dead][0]}, pid {where[dead][1]}"
            raise RuntimeError(f"data-parallel replica {dead} (Ray actor{place}) died "
                               f"({type(e).__name__}); shut this LLM down and create a new "
                               "one") from e

    def _dead_replica(self, refs: list) -> int:
        """The first replica whose call failed with a dead actor."""
        ray = _ray()
        for r, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=0)
            except ray.exceptions.RayActorError:
                return r
            except Exception:  # noqa: BLE001 - still running, or failed another way
                logger.debug("replica %d is not the dead one", r, exc_info=True)
        return 0

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = False,
                 priority: list[int] | None = None) -> list[RequestOutput]:
        """LLM.generate over the replica actors: RequestOutputs in input order (request_id:
        an id unique across this LLM). use_tqdm is accepted for LLM's signature."""
        if self._closed:
            raise RuntimeError("this LLM has been shut down; create a new one")
        prompts, sps, priorities = generate_args(prompts, sampling_params, priority)
        encoded = encode_prompts(prompts, self.tokenizer)
        costs = [request_cost(n, sp) for (_, n), sp in zip(encoded, sps)]
        chosen = balance(costs, [0] * len(self.actors))
        shares = [[i for i, r in enumerate(chosen) if r == replica]
                  for replica in range(len(self.actors))]
        refs = [actor.generate.remote([encoded[i][0] for i in share], [sps[i] for i in share],
                                      [priorities[i] for i in share])
                for actor, share in zip(self.actors, shares)]
        results: list[RequestOutput | None] = [None] * len(prompts)
        for share, outputs in zip(shares, self._call(refs)):
            for i, output in zip(share, outputs):
                output.request_id = next(self._keys)
                results[i] = output
        return results

    chat = LLM.chat

    def stats(self) -> list[dict]:
        """Each replica's KV blocks, in replica order."""
        return self._call([a.stats.remote() for a in self.actors])

    def shutdown(self) -> None:
        """Stop the replica actors and free their placement group (idempotent)."""
        if self._closed:
            return
        self._closed = True
        ray = _ray()
        try:
            ray.get([a.shutdown.remote() for a in self.actors], timeout=30)
        except Exception:  # noqa: BLE001 - a dead replica has nothing left to stop
            logger.debug("a replica could not stop its LLM", exc_info=True)
        for actor in self.actors:
            ray.kill(actor)
        self._remove_pg(self.pg)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


class LLMProcessor:
    """A Ray Data map_batches callable: one replica per actor, generating for the batch's
    prompt column; adds generated_text, generated_token_ids and finish_reason."""

    def __init__(self, model: str, sampling_params=None, prompt_column: str = "prompt",
                 **kwargs):
        self.llm = LLM(model, **kwargs)
        self.sampling_params, self.column = sampling_params, prompt_column

    def __call__(self, batch: dict) -> dict:
        prompts = [p.tolist() if hasattr(p, "tolist") else p for p in batch[self.column]]
        outputs = self.llm.generate(prompts, self.sampling_params, use_tqdm=False)
        return {**batch, "generated_text": [o["text"] for o in outputs],
                "generated_token_ids": [o["token_ids"] for o in outputs],
                "finish_reason": [o["finish_reason"] for o in outputs]}


def generate_dataset(ds, model: str, sampling_params=None, prompt_column: str = "prompt",
                     batch_size: int = 256, **kwargs):
    """ds (a ray.data.Dataset with a prompt column: text or token ids) with the generated
    columns added, through data_parallel_size replica actors; lazy, as Ray Data is."""
    ray = _ray()
    config = Config.from_kwargs(model, **kwargs)  # bad options fail here, not in an actor
    bundle = _bundle(config, ray)
    return ds.map_batches(
        LLMProcessor, batch_size=batch_size, concurrency=config.data_parallel_size,
        num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
        fn_constructor_args=(config.model, sampling_params, prompt_column),
        fn_constructor_kwargs=_replica_kwargs(kwargs, bundle))
