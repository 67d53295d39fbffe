"""The Triton attention kernels (KV store, paged prefill, split-K decode) vs the torch
reference: under TRITON_INTERPRET=1 on CPU (tiny fp32 shapes), and compiled on a GPU (`gpu`
marker: bf16, realistic shapes, every tile config the benchmark may pick, CUDA-graph capture)."""
import pytest
import torch

from nanovllm.kernels import triton_decode
from nanovllm.kernels.torch_ref import (
    decode_attention_torch,
    prefill_attention_torch,
    store_kvcache_torch,
)
from nanovllm.kernels.triton_decode import decode_attention
from nanovllm.kernels.triton_kv import store_kvcache
from nanovllm.kernels.triton_prefill import prefill_attention
from tests.support.markers import needs_interpreter, on_gpu
from tests.support.paged import make_paged_case, naive_attention, rel_err

TOL = 1e-4  # fp32 end to end; observed ~1e-6


@needs_interpreter
def test_store_kvcache_skips_padding():
    k_cache = torch.full((3, 16, 2, 16), 7.0)
    v_cache = torch.full((3, 16, 2, 16), 7.0)
    k, v = torch.randn(6, 2, 16), torch.randn(6, 2, 16)
    slots = torch.tensor([5, -1, 16, 47, -1, 0], dtype=torch.int32)
    store_kvcache(k, v, k_cache, v_cache, slots)
    ref_k, ref_v = torch.full_like(k_cache, 7.0), torch.full_like(v_cache, 7.0)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            ref_k.view(48, 2, 16)[s] = k[t]
            ref_v.view(48, 2, 16)[s] = v[t]
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


@needs_interpreter
def test_store_kvcache_strided_input():
    # k/v often arrive as views of a fused qkv projection (non-contiguous token stride).
    qkv = torch.randn(4, 3 * 3 * 16)
    k = qkv[:, 48:96].view(4, 3, 16)
    v = qkv[:, 96:].view(4, 3, 16)
    k_cache, v_cache = torch.zeros(2, 16, 3, 16), torch.zeros(2, 16, 3, 16)
    slots = torch.tensor([31, 2, -1, 16], dtype=torch.int32)
    store_kvcache(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache.view(32, 3, 16)[slots[[0, 1, 3]].long()], k[[0, 1, 3]])
    assert torch.equal(v_cache.view(32, 3, 16)[slots[[0, 1, 3]].long()], v[[0, 1, 3]])


PREFILL_CASES = {
    "prefill": [(20, 20), (1, 1), (33, 33)],
    "prefix_hit": [(5, 37), (17, 40)],
    "chunk": [(16, 32), (7, 39), (1, 18)],
}


@needs_interpreter
@pytest.mark.parametrize("kind", list(PREFILL_CASES))
@pytest.mark.parametrize("block_size,heads", [(16, (2, 2)), (16, (4, 2)), (32, (4, 1))])
@pytest.mark.usefixtures("poisoned_empty")
def test_prefill(kind, block_size, heads):
    c = make_paged_case(PREFILL_CASES[kind], block_size, heads[0], heads[1], 16, seed=3)
    ref = prefill_attention_torch(c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k,
                                  c.block_tables, c.scale)
    o = prefill_attention(c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables,
                          c.scale, c.max_seqlen_q)
    assert rel_err(o, ref) < TOL
    assert rel_err(ref, naive_attention(c)) < 1e-5


@needs_interpreter
@pytest.mark.parametrize("num_splits", [1, 2, 4])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (4, 1)])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode(num_splits, heads):
    # ctx 1 and 7 leave most splits empty; 40 spans 3 tiles of 16 keys.
    c = make_paged_case([(1, 1), (1, 40), (1, 7)], 16, heads[0], heads[1], 16, seed=4)
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    o = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale,
                         num_splits=num_splits)
    assert rel_err(o, ref) < TOL


@needs_interpreter
@pytest.mark.parametrize("heads", [(8, 1), (2, 2)])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_combines_splits_in_several_chunks(heads):
    # 16 splits of 16 keys: ctx 200 fills 13 of them, more than one chunk of the combine
    # (reduce_tile at 128-dim heads: 4 splits a load at 8 query heads per kv head, 16 at 2),
    # so the chunks are folded in with the running max; ctx 0 and 16 leave all but one split
    # empty.
    assert triton_decode.reduce_tile(8, 128)[1] == 4
    c = make_paged_case([(1, 200), (1, 16), (1, 0), (1, 130)], 16, heads[0], heads[1], 128,
                        seed=6)
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables,
                                 c.scale)
    o = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale,
                         num_splits=16)
    assert torch.equal(o[2], torch.zeros_like(o[2]))
    assert rel_err(o, ref) < TOL


@needs_interpreter
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_combines_64_dim_heads_in_several_chunks():
    # 64-dim heads take 16 splits a load at 8 query heads per kv head: ctx 500 over 32
    # splits of 16 keys fills all 32, two chunks.
    assert triton_decode.reduce_tile(8, 64)[1] == 16
    c = make_paged_case([(1, 500), (1, 40)], 16, 8, 1, 64, seed=10)
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables,
                                 c.scale)
    o = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale,
                         num_splits=32)
    assert rel_err(o, ref) < TOL


@needs_interpreter
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_per_token_paging_and_workspace(monkeypatch):
    # BLOCK_N (32) larger than block_size (16): K/V tiles gather across pages token by token.
    monkeypatch.setitem(triton_decode.CONFIG, "BLOCK_N", 32)
    c = make_paged_case([(1, 45), (1, 3)], 16, 4, 2, 16, seed=5)
    ws = triton_decode.alloc_decode_workspace(4, 4, 16, 8, "cpu")  # larger than needed
    ws[0].fill_(float("nan"))
    ws[1].fill_(float("nan"))
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    o = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale,
                         num_splits=3, workspace=ws)
    assert rel_err(o, ref) < TOL


@needs_interpreter
@pytest.mark.parametrize("head_fast", [False, True])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_launch_orders(head_fast, num_splits, monkeypatch):
    # kv heads fastest in the grid, and rows started in a given order (longest first): the
    # same attention, each row's output in its own place.
    monkeypatch.setitem(triton_decode.CONFIG, "HEAD_FAST", head_fast)
    monkeypatch.setitem(triton_decode.CONFIG, "LPT", True)
    c = make_paged_case([(1, 7), (1, 40), (1, 1), (1, 23)], 16, 4, 2, 16, seed=8)
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    order = torch.argsort(c.context_lens, descending=True).int()
    assert order.tolist() == [1, 3, 0, 2]
    for o in (None, order):
        out = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale,
                               num_splits=num_splits, order=o)
        assert rel_err(out, ref) < TOL


@needs_interpreter
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_broadcast_variant(monkeypatch):
    monkeypatch.setitem(triton_decode.CONFIG, "USE_DOT", False)
    c = make_paged_case([(1, 30), (1, 2)], 16, 4, 2, 16, seed=6)
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    for splits in (1, 2):
        o = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables,
                             c.scale, num_splits=splits)
        assert rel_err(o, ref) < TOL


@needs_interpreter
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_zero_context_gives_zeros():
    # Padding rows of a captured decode batch have context_lens == 0: output must be finite.
    c = make_paged_case([(1, 5), (1, 1)], 16, 2, 2, 16, seed=7)
    ctx = torch.tensor([5, 0], dtype=torch.int32)
    for splits in (1, 2):
        o = decode_attention(c.q, c.k_cache, c.v_cache, ctx, c.block_tables, c.scale,
                             num_splits=splits)
        assert torch.isfinite(o).all() and (o[1] == 0).all()


@needs_interpreter
def test_default_split_choice():
    assert triton_decode.choose_num_splits(1, 8, "cpu") == triton_decode.MAX_SPLITS
    assert triton_decode.choose_num_splits(8, 8, "cpu") == 8
    # 132 SMs off a GPU: two splits from 132 programs up to 4 x 132 = 528, then one.
    assert triton_decode.choose_num_splits(17, 8, "cpu") == 2
    assert triton_decode.choose_num_splits(65, 8, "cpu") == 2
    assert triton_decode.choose_num_splits(66, 8, "cpu") == 1
    assert triton_decode.choose_num_splits(256, 8, "cpu") == 1


GPU_TOL = 1e-2
# Tile configs the benchmark may pick from: every one is checked for correctness here.
DECODE_CFGS = [dict(BLOCK_N=64, num_warps=4, num_stages=3),
               dict(BLOCK_N=128, num_warps=4, num_stages=2),
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
@on_gpu
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
@on_gpu
def test_prefill_gpu(kind, block_size, heads, prefill_cfg):
    from nanovllm.kernels.triton_prefill import prefill_attention
    c = gpu_case(PREFILL[kind], block_size, heads, seed=11)
    args = (c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables, c.scale)
    o = prefill_attention(*args, c.max_seqlen_q)
    ref = prefill_attention_torch(*args)
    assert rel_err(o, ref) <= GPU_TOL


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
@on_gpu
def test_decode_gpu(batch, max_ctx, block_size, heads, num_splits, decode_cfg):
    from nanovllm.kernels.triton_decode import decode_attention
    g = torch.Generator().manual_seed(batch + max_ctx)
    ctxs = torch.randint(1, max_ctx + 1, (batch,), generator=g).tolist()
    ctxs[0] = max_ctx
    c = gpu_case([(1, s) for s in ctxs], block_size, heads, seed=12)
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    o = decode_attention(*args, num_splits=num_splits)
    ref = decode_attention_torch(*args)
    assert rel_err(o, ref) <= GPU_TOL


@pytest.mark.parametrize("batch", [4, 64])
@pytest.mark.usefixtures("poisoned_empty")
@on_gpu
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
        assert rel_err(out, ref) <= GPU_TOL, trial
