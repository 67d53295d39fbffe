"""An fp8 cache's V pages tiled ([kv head][tile][dim][key], kv_cache.tile_v_pages): the store
kernels write the usual layout's bytes at the tiled places, and decode and prefill read them
to the usual layout's outputs (TRITON_INTERPRET=1 on CPU, tiny fp32 shapes; the GPU at the
engine's tiles, and an engine's greedy tokens with and without the tiles)."""
import pytest
import torch
import triton
import triton.language as tl

from nanovllm.kernels import decode_config
from nanovllm.kernels.decode_tiles import attend_tiles
from nanovllm.kernels.torch_ref import store_kvcache_torch
from nanovllm.kernels.triton_decode import decode_attention
from nanovllm.kernels.triton_kv import store_kvcache, v_tile_of
from nanovllm.kernels.triton_prefill import prefill_attention
from nanovllm.kernels.triton_rope import norm_rope_store
from tests.kernels.test_fp8_kv import (FP8, fp8_case, nan_codes_finite, quantized_case,
                                       same_bytes)
from tests.support.markers import needs_interpreter, on_gpu
from tests.support.paged import make_paged_case


def tiled(v: torch.Tensor, tile: int) -> torch.Tensor:
    """A [blocks, block_size, Hkv, D] cache's values rewritten in tiled pages (a new tensor:
    [blocks, Hkv, block_size / tile, D, tile])."""
    p, b, h, d = v.shape
    return v.view(p, b // tile, tile, h, d).permute(0, 3, 1, 4, 2).contiguous()


def untiled(vt: torch.Tensor) -> torch.Tensor:
    """tiled's inverse."""
    p, h, t, d, tile = vt.shape
    return vt.permute(0, 2, 4, 1, 3).reshape(p, t * tile, h, d)


def test_v_tile_of_reads_the_view():
    k = torch.zeros(3, 16, 2, 8)
    assert v_tile_of(k, torch.zeros_like(k)) == 0
    assert v_tile_of(k, torch.zeros_like(k).view(3, 2, 4, 8, 4)) == 4
    with pytest.raises(AssertionError):
        v_tile_of(k, torch.zeros(3, 2, 4, 8, 2))  # tiles covering half a page


@needs_interpreter
@pytest.mark.parametrize("dtype", FP8)
def test_stores_write_tiled_places(dtype):
    g = torch.Generator().manual_seed(2)
    t, hq, hkv, d = 7, 4, 2, 16
    q, k, v = (torch.randn(t, h, d, generator=g) for h in (hq, hkv, hkv))
    v[1, 0, 3] = v[4, 1, :5] = float("nan")  # stored as 0: a tiled V's slots hold no NaN
    slots = torch.tensor([3, 9, -1, 17, 30, 0, 63], dtype=torch.int32)
    ks, vs = torch.tensor([0.01, 0.02]), torch.tensor([0.004, 0.05])
    kc, vc, rk, rv = (torch.zeros(2, 32, hkv, d, dtype=dtype) for _ in range(4))
    store_kvcache_torch(k, v, rk, rv, slots, ks, vs)
    vt = tiled(vc, 8)
    store_kvcache(k, v, kc, vt, slots, ks, vs)
    assert same_bytes(kc, rk) and same_bytes(untiled(vt), rv)
    assert rv[0, 9, 0, 3].float() == 0 and not rv.float().isnan().any()
    # The fused RoPE store: its rotated k through the plain store gives the reference.
    cos_sin = torch.randn(16, 1, d, generator=g)
    kc.zero_()
    vt.zero_()
    _, k_rot = norm_rope_store(q, k, v, torch.arange(t), cos_sin, None, None, 0.0, kc, vt,
                               slots, return_k=True, k_scale=ks, v_scale=vs)
    store_kvcache_torch(k_rot, v, rk, rv, slots, ks, vs)
    assert same_bytes(kc, rk) and same_bytes(untiled(vt), rv)


@needs_interpreter
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("v_last", [0, 1, 2])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_reads_tiled_pages(num_splits, v_last, monkeypatch):
    # Contexts ending inside a tile, on its edge and after one key; slots past a context
    # hold NaN (make_paged_case), so a partial tile read whole would show, but for V_LAST 2,
    # which reads it whole on purpose: its V slots hold finite codes (the engine's do).
    c = quantized_case(make_paged_case([(1, 70), (1, 32), (1, 1), (1, 47)], 32, 4, 2, 16,
                                       seed=6), torch.float8_e4m3fn)
    ref, o = _usual_and_tiled(c, num_splits, 16, v_last, monkeypatch)
    assert not o.isnan().any() and torch.equal(o, ref)


def _usual_and_tiled(c, num_splits, tile, v_last, monkeypatch):
    """The decode of case c over its usual V pages, then over them tiled (V_LAST v_last;
    for 2, V's NaN codes made finite first, as the engine's tiled caches hold them)."""
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    kw = dict(num_splits=num_splits, k_scale=c.k_scale, v_scale=c.v_scale)
    ref = decode_attention(*args, **kw)
    monkeypatch.setitem(decode_config.CONFIG_FP8, "V_LAST", v_last)
    v = nan_codes_finite(c.v_cache) if v_last == 2 else c.v_cache
    return ref, decode_attention(*args[:2], tiled(v, tile), *args[3:], **kw)


@triton.jit
def _attend_range(q_ptr, k_cache, v_cache, bt_ptr, start, end, out_ptr, stride_kblk,
                  stride_kslot, G: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                  BLOCK_N: tl.constexpr, V_TILE: tl.constexpr, V_LAST: tl.constexpr):
    rows = tl.arange(0, G)[:, None] * D + tl.arange(0, D)[None, :]
    q = tl.load(q_ptr + rows)
    acc, m_i, l_i = attend_tiles(q, k_cache, v_cache, k_cache, k_cache, bt_ptr, 0, start, end,
                                 1.0, stride_kblk, stride_kslot, 0, 0, G, D, BLOCK_SIZE,
                                 BLOCK_N, True, True, "ieee", True, False, q.dtype, False,
                                 False, V_TILE, V_LAST)
    tl.store(out_ptr + rows, acc / l_i[:, None])


@needs_interpreter
@pytest.mark.parametrize("start,end", [(39, 40), (16, 17), (4, 5), (0, 40), (16, 39)])
@pytest.mark.parametrize("v_last", [0, 1])
def test_key_ranges_starting_anywhere(start, end, v_last):
    """attend_tiles over keys start..end, as the layer kernel's splits hand it: the new key
    alone in a split of its own (NEW_APART) starts anywhere in a tile, and a tiled V's
    whole-tile read must start where the tile does (a GPU faulted: misaligned address;
    _common.aligned checks the promise here). Tiled equals usual; NaN past the range's end."""
    g = torch.Generator().manual_seed(start * 100 + end)
    blocks, bs, d = 2, 32, 16
    k, v = (torch.randn(blocks * bs, 1, d, generator=g) for _ in range(2))
    k[end:] = v[end:] = float("nan")
    kc, vc = (x.view(blocks, bs, 1, d).to(torch.float8_e4m3fn) for x in (k, v))
    q = torch.randn(16, d, generator=g)
    bt = torch.tensor([1, 0], dtype=torch.int32)  # pages out of order
    kc, vc = kc[bt.long().argsort()].contiguous(), vc[bt.long().argsort()].contiguous()
    outs = []
    for v_cache, tile in ((vc, 0), (tiled(vc, 16), 16)):
        out = torch.empty(16, d)
        _attend_range[(1,)](q, kc, v_cache, bt, start, end, out, kc.stride(0), kc.stride(1),
                            G=16, D=d, BLOCK_SIZE=bs, BLOCK_N=16, V_TILE=tile, V_LAST=v_last)
        outs.append(out)
    assert not outs[0].isnan().any() and torch.equal(outs[1], outs[0])


@needs_interpreter
@pytest.mark.parametrize("block_size,tile", [(32, 16), (32, 8), (8, 8)])
@pytest.mark.usefixtures("poisoned_empty")
def test_prefill_reads_tiled_pages(block_size, tile):
    # Plain prefill, a prefix hit and a chunk (16-key tiles): a tile a V tile, a tile of two
    # V tiles, and 8-slot pages, which put a tile on two pages (read key by key, masked).
    c = quantized_case(make_paged_case([(20, 20), (5, 37), (7, 39)], block_size, 4, 2, 16,
                                       seed=3), torch.float8_e4m3fn)
    args = (c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables, c.scale,
            c.max_seqlen_q)
    kw = dict(k_scale=c.k_scale, v_scale=c.v_scale)
    ref = prefill_attention(*args, **kw)
    o = prefill_attention(*args[:2], tiled(c.v_cache, tile), *args[3:], **kw)
    assert not o.isnan().any() and torch.equal(o, ref)


@on_gpu
@pytest.mark.parametrize("batch,ctx,splits", [(1, 3000, None), (64, 301, None), (64, 301, 3),
                                              (256, 700, None)])
@pytest.mark.parametrize("v_last", [0, 1, 2])
def test_decode_gpu_reads_tiled_pages(batch, ctx, splits, v_last, monkeypatch):
    c = fp8_case([(1, ctx - i % 5) for i in range(batch)], 256, torch.float8_e4m3fn, seed=batch)
    ref, o = _usual_and_tiled(c, splits, 64, v_last, monkeypatch)
    assert not o.isnan().any()
    torch.testing.assert_close(o, ref, rtol=1e-2, atol=1e-3)


@on_gpu
@pytest.mark.parametrize("seqs", [[(300, 1500), (257, 257), (1, 700)],  # 64-key tiles
                                  [(600, 1300), (700, 700)]])  # 128-key tiles (long prompts)
def test_prefill_gpu_reads_tiled_pages(seqs):
    c = fp8_case(seqs, 256, torch.float8_e4m3fn, seed=1)
    args = (c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables, c.scale,
            c.max_seqlen_q)
    kw = dict(k_scale=c.k_scale, v_scale=c.v_scale)
    ref = prefill_attention(*args, **kw)
    o = prefill_attention(*args[:2], tiled(c.v_cache, 64), *args[3:], **kw)
    torch.testing.assert_close(o, ref, rtol=1e-2, atol=1e-3)


@on_gpu
def test_engine_greedy_with_and_without_tiles(toy_models, monkeypatch):
    """The engine's fp8 cache, tiled (CONFIG_FP8["V_TILE"] 64, blocks of 256) or not: the
    same greedy tokens, batch 1 (the layer kernel) and batched, over prompts spanning pages
    (a fixed block count: the first engine's memory is still held when the second starts)."""
    from nanovllm import LLM, SamplingParams

    prompts = [[(7 * i + j) % 300 + 10 for j in range(n)] for i, n in enumerate((5, 300, 700))]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = {}
    for tile in (0, 64):
        monkeypatch.setitem(decode_config.CONFIG_FP8, "V_TILE", tile)
        llm = LLM(toy_models["untied_gqa4_d64"], device="cuda", kv_cache_dtype="fp8_e4m3",
                  kvcache_block_size=256, num_kvcache_blocks=16, max_model_len=1024)
        try:
            layer = llm.clients[0].core.executor.runner.model.model.layers[0]
            assert layer.self_attn.attn.v_cache.dim() == (5 if tile else 4)
            outs[tile] = ([o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)],
                          llm.generate([prompts[1]], sp, use_tqdm=False)[0]["token_ids"])
        finally:
            llm.shutdown()
    assert outs[0] == outs[64]


def test_tile_v_pages_views_the_same_memory():
    from types import SimpleNamespace

    from nanovllm.worker.kv_cache import tile_v_pages

    cache = torch.full((2, 3, 8, 64, 2, 16), 0xFF, dtype=torch.uint8).view(torch.float8_e4m3fn)
    layers = [SimpleNamespace(k_cache=cache[0, i], v_cache=cache[1, i]) for i in range(3)]
    tile_v_pages(layers, 16)
    # V zeroed (the decode reads slots past a context: no NaN codes), K left as it was.
    assert (cache[1].view(torch.uint8) == 0).all() and (cache[0].view(torch.uint8) == 0xFF).all()
    for i, layer in enumerate(layers):
        assert layer.v_cache.shape == (8, 2, 4, 16, 16)
        assert layer.v_cache.data_ptr() == cache[1, i].data_ptr()
        assert v_tile_of(layer.k_cache, layer.v_cache) == 16
