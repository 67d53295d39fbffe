"""End to end on a GPU: Triton backend against the torch reference, with and without graphs."""
import pytest
import torch

from nanovllm import LLM, SamplingParams
from tests.support.prompts import make_prompts

pytestmark = pytest.mark.gpu
# Every third prompt starts with the same 60 random tokens; the rest are up to 89 tokens long.
PROMPTS = dict(shared=60, every=3, max_len=89)


def greedy(path, ps, **kw):
    llm = LLM(path, device="cuda", dtype="float32", max_num_seqs=16, **kw)
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    a = [o["token_ids"] for o in llm.generate(ps, sp, use_tqdm=False)]
    b = [o["token_ids"] for o in llm.generate(ps, sp, use_tqdm=False)]  # now with prefix hits
    bm = llm.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    llm.shutdown()
    assert a == b
    return a


@pytest.mark.parametrize("block_size", [16, 256])
def test_triton_matches_torch_eager_and_graphs(toy_models, block_size):
    path = toy_models["untied_gqa4_d64"]
    ps = make_prompts(0, 12, **PROMPTS)
    ref = greedy(path, ps, attention_backend="torch", enforce_eager=True,
                 kvcache_block_size=block_size)
    eager = greedy(path, ps, attention_backend="triton", enforce_eager=True,
                   kvcache_block_size=block_size)
    graphs = greedy(path, ps, attention_backend="triton", enforce_eager=False,
                    kvcache_block_size=block_size)
    assert eager == ref
    assert graphs == ref


@pytest.mark.parametrize("orders", [True, False])
def test_triton_launch_orders_match_torch(toy_models, monkeypatch, orders):
    # Decode programs started kv head by kv head and longest row first (the default), or in
    # plain grid order (eager and graphs): the engine's order row reaches the kernel and each
    # row's output lands in its place.
    from nanovllm.kernels import triton_decode

    path = toy_models["untied_gqa4_d64"]
    ps = make_prompts(2, 12, **PROMPTS)
    ref = greedy(path, ps, attention_backend="torch", enforce_eager=True, kvcache_block_size=16)
    monkeypatch.setitem(triton_decode.CONFIG, "HEAD_FAST", orders)
    monkeypatch.setitem(triton_decode.CONFIG, "LPT", orders)
    for eager in (True, False):
        assert greedy(path, ps, attention_backend="triton", enforce_eager=eager,
                      kvcache_block_size=16) == ref


def test_triton_chunked_prefill_and_preemption(toy_models):
    path = toy_models["tied_gqa4_d16_l4"]
    ps = make_prompts(1, 12, **PROMPTS)
    ref = greedy(path, ps, attention_backend="torch", enforce_eager=True, kvcache_block_size=16)
    got = greedy(path, ps, attention_backend="triton", kvcache_block_size=16,
                 max_num_batched_tokens=50, num_kvcache_blocks=24)
    assert got == ref


def test_bf16_graphs_run(toy_models):
    llm = LLM(toy_models["tied_mha_d16"], device="cuda", max_num_seqs=64)
    assert llm.executor.runner.dtype == torch.float32  # the toy checkpoint is fp32
    llm.shutdown()
    llm = LLM(toy_models["tied_mha_d16"], device="cuda", dtype="bfloat16", max_num_seqs=64)
    sp = SamplingParams(temperature=0.6, max_tokens=20, ignore_eos=True)
    out = llm.generate(make_prompts(0, 40, **PROMPTS), sp, use_tqdm=False)
    assert all(len(o["token_ids"]) == 20 for o in out)
    llm.shutdown()
