"""The Ray backend on a local Ray cluster (CPU): replica actors give DP=1's outputs over a
list and over a Ray Dataset, and a killed actor is reported by name."""
import os
import signal

import pytest

from nanovllm import LLM
from tests.support.replicas import mixed_requests

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

MODEL = "tied_mha_d16"
KW = dict(device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=256,
          num_kvcache_blocks=48)
PROMPTS, PARAMS = mixed_requests(3)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 4 logical CPUs, started and stopped here; its workers import
    this checkout's nanovllm."""
    env = {"PYTHONPATH": ROOT, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "0")}
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": env},
             log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def expected(toy_models):
    with LLM(toy_models[MODEL], **KW) as llm:
        return [(o.prompt, o["token_ids"], o["text"])
                for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


def test_ray_replicas_match_dp1_over_a_list_and_a_killed_actor_is_named(cluster, toy_models,
                                                                       expected):
    llm = LLM(toy_models[MODEL], data_parallel_size=2, distributed_executor_backend="ray", **KW)
    outputs = llm.generate(PROMPTS, PARAMS)
    assert [(o.prompt, o["token_ids"], o["text"]) for o in outputs] == expected
    node, pid = llm.clients[1].where
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"data-parallel replica 1 \(Ray actor, node "
                                           rf"{node}, pid {pid}\) died"):
        llm.generate(PROMPTS, PARAMS)
    llm.shutdown()
    assert all(t["state"] == "REMOVED" for t in ray.util.placement_group_table().values())


def test_more_replicas_than_the_cluster_holds_is_a_value_error(cluster, toy_models):
    with pytest.raises(ValueError, match=r"data_parallel_size=8 needs 8 x \{'CPU': 1\}"):
        LLM(toy_models[MODEL], data_parallel_size=8, distributed_executor_backend="ray", **KW)


def test_ray_dataset_matches_dp1(cluster, toy_models, expected):
    from nanovllm.ray import generate_dataset

    # One sampling setting for the whole dataset: the greedy rows.
    rows = [{"id": i, "prompt": PROMPTS[i]} for i in range(1, 64, 2)]
    ds = ray.data.from_items(rows)
    out = generate_dataset(ds, toy_models[MODEL], PARAMS[1], batch_size=8,
                           data_parallel_size=2, **KW).take_all()
    got = sorted((r["id"], list(r["generated_token_ids"]), r["generated_text"]) for r in out)
    assert got == [(i, expected[i][1], expected[i][2]) for i in range(1, 64, 2)]
