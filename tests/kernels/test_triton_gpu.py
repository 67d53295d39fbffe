"""Triton kernels vs the torch reference on GPU: bf16, realistic shapes, CUDA-graph capture."""
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from nanovllm.kernels.torch_ref import (decode_attention_torch, prefill_attention_torch,  # noqa: E402
                                        store_kvcache_torch)
from tests.support.paged import make_paged_case, rel_err  # noqa: E402

TOL = 1e-2
# Tile configs the benchmark may pick from: every one is checked for correctness here.
DECODE_CFGS = [dict(BLOCK_N=64, num_warps=4, num_stages=3), dict(BLOCK_N=128, num_warps=4, num_stages=2),
               dict(BLOCK_N=32, num_warps=4, num_stages=3)]
PREFILL_CFGS = [dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2),  # CONFIG (long)
                dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),    # SHORT_CONFIG
                dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)]


@pytest.fixture(params=range(len(DECODE_CFGS)), ids=lambda i: f"dcfg{i}")
def decode_cfg(request, monkeypatch):
    from nanovllm.kernels import triton_decode
    for key, val in DECODE_CFGS[request.param].items():
        monkeypatch.setitem(triton_decode.CONFIG, key, val)


@pytest.fixture(params=range(len(PREFILL_CFGS)), ids=lambda i: f"pcfg{i}")
def prefill_cfg(request, monkeypatch):
    from nanovllm.kernels import triton_prefill
    monkeypatch.setattr(triton_prefill, "SHORT_Q", -1)  # apply the config to every length
    for key, val in PREFILL_CFGS[request.param].items():
        monkeypatch.setitem(triton_prefill.CONFIG, key, val)


def gpu_case(seqs, block_size, heads, seed):
    """A bf16 paged case on the GPU; heads = (num_heads, num_kv_heads, head_dim)."""
    return make_paged_case(seqs, block_size, *heads, seed=seed, dtype=torch.bfloat16, device="cuda")


@pytest.mark.parametrize("block_size", [16, 256])
def test_store_kvcache_gpu(block_size):
    from nanovllm.kernels.triton_kv import store_kvcache
    hkv, d, t = 8, 128, 300
    num_blocks = t // block_size + 4
    k_cache = torch.randn(num_blocks, block_size, hkv, d, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    qkv = torch.randn(t, 3 * hkv * d, dtype=torch.bfloat16, device="cuda")
    k, v = qkv[:, hkv * d:2 * hkv * d].view(t, hkv, d), qkv[:, 2 * hkv * d:].view(t, hkv, d)
    slots = torch.randperm(num_blocks * block_size, device="cuda")[:t].int()
    slots[::7] = -1
    store_kvcache(k, v, k_cache, v_cache, slots)
    store_kvcache_torch(k, v, ref_k, ref_v, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


PREFILL = {
    "prefill": [(1, 1), (100, 100), (1000, 1000), (257, 257)],
    "long": [(2048, 2048)],
    "prefix_hit": [(50, 2000), (300, 812), (1, 4096)],
    "chunk": [(512, 1536), (512, 512), (77, 3000)],
}


@pytest.mark.parametrize("kind", list(PREFILL))
@pytest.mark.parametrize("block_size,heads", [(256, (16, 8, 128)), (16, (16, 8, 128)),
                                              (256, (16, 16, 64)), (16, (32, 8, 128))])
@pytest.mark.usefixtures("poisoned_empty")
def test_prefill_gpu(kind, block_size, heads, prefill_cfg):
    from nanovllm.kernels.triton_prefill import prefill_attention
    c = gpu_case(PREFILL[kind], block_size, heads, seed=11)
    args = (c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables, c.scale)
    o = prefill_attention(*args, c.max_seqlen_q)
    ref = prefill_attention_torch(*args)
    assert rel_err(o, ref) <= TOL


@pytest.mark.parametrize("batch,max_ctx,block_size,heads,num_splits", [
    (1, 1, 256, (16, 8, 128), None),
    (1, 4096, 256, (16, 8, 128), None),
    (3, 4096, 16, (16, 8, 128), None),
    (7, 700, 16, (8, 8, 64), None),
    (32, 2048, 256, (16, 8, 128), None),
    (32, 1024, 16, (32, 8, 128), 1),
    (64, 300, 256, (16, 4, 128), 8),
    (256, 1024, 256, (16, 8, 128), None),
    (256, 100, 16, (16, 8, 128), 4),
])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_gpu(batch, max_ctx, block_size, heads, num_splits, decode_cfg):
    from nanovllm.kernels.triton_decode import decode_attention
    g = torch.Generator().manual_seed(batch + max_ctx)
    ctxs = torch.randint(1, max_ctx + 1, (batch,), generator=g).tolist()
    ctxs[0] = max_ctx
    c = gpu_case([(1, s) for s in ctxs], block_size, heads, seed=12)
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    o = decode_attention(*args, num_splits=num_splits)
    ref = decode_attention_torch(*args)
    assert rel_err(o, ref) <= TOL


@pytest.mark.parametrize("batch", [4, 64])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_cuda_graph(batch, decode_cfg):
    from nanovllm.kernels.triton_decode import decode_attention
    heads, block_size, max_ctx = (16, 8, 128), 256, 2048
    torch.manual_seed(13)  # the trials below draw from the global generator
    c = gpu_case([(1, max_ctx)] * batch, block_size, heads, seed=13)
    q, ctx = c.q.clone(), c.context_lens.clone()
    k_cache, v_cache = c.k_cache, c.v_cache
    run = lambda: decode_attention(q, k_cache, v_cache, ctx, c.block_tables, c.scale)
    run()  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for trial in range(3):
        q.copy_(torch.randn_like(q))
        ctx.copy_(torch.randint(1, max_ctx + 1, (batch,), device="cuda", dtype=torch.int32))
        k_cache.normal_()
        v_cache.normal_()
        out.fill_(float("nan"))
        graph.replay()
        ref = decode_attention_torch(q, k_cache, v_cache, ctx, c.block_tables, c.scale)
        assert rel_err(out, ref) <= TOL, trial
