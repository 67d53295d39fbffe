"""fp8 KV cache on GPU: bf16 q, Qwen3-0.6B head shapes, the hardware fp8 conversions."""
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from nanovllm.kernels import triton_decode, triton_prefill  # noqa: E402
from nanovllm.kernels.torch_ref import (decode_attention_torch, prefill_attention_torch,  # noqa: E402
                                        quantize, store_kvcache_torch)
from tests.support.paged import make_paged_case, naive_attention, rel_err  # noqa: E402

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
TOL = 1e-2  # bf16 q and output, same quantized cache


def fp8_case(seqs, block_size, dtype, seed):
    c = make_paged_case(seqs, block_size, 16, 8, 128, seed=seed, dtype=torch.bfloat16,
                        device="cuda")
    c.exact = naive_attention(c)
    c.k_scale = 0.01 + torch.rand(8, device="cuda") * 0.02
    c.v_scale = 0.01 + torch.rand(8, device="cuda") * 0.02
    shape = c.k_cache.shape
    c.k_cache = quantize(c.k_cache.view(-1, 8, 128), c.k_scale, dtype).view(shape)
    c.v_cache = quantize(c.v_cache.view(-1, 8, 128), c.v_scale, dtype).view(shape)
    return c


@pytest.mark.parametrize("dtype", FP8)
def test_store_gpu_same_bytes_as_torch(dtype):
    from nanovllm.kernels.triton_kv import store_kvcache
    from nanovllm.kernels.triton_rope import norm_rope_store
    t, hkv, d = 300, 8, 128
    k = torch.randn(t, hkv, d, device="cuda", dtype=torch.bfloat16) * torch.logspace(
        -4, 2, d, device="cuda").bfloat16()
    v, q = torch.randn_like(k) * 3, torch.randn(t, 16, d, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(8 * 64, device="cuda")[:t].int()
    slots[::7] = -1
    ks, vs = torch.rand(hkv, device="cuda") * 0.1 + 1e-3, torch.rand(hkv, device="cuda") + 1e-3
    caches = [torch.zeros(8, 64, hkv, d, dtype=dtype, device="cuda") for _ in range(6)]
    store_kvcache(k, v, caches[0], caches[1], slots, ks, vs)
    store_kvcache_torch(k, v, caches[2], caches[3], slots, ks, vs)
    assert torch.equal(caches[0].view(torch.uint8), caches[2].view(torch.uint8))
    assert torch.equal(caches[1].view(torch.uint8), caches[3].view(torch.uint8))
    # The fused RoPE-store quantizes its rotated k like the plain store does.
    cos_sin = torch.randn(4096, 1, d, device="cuda")
    pos = torch.randint(0, 4096, (t,), device="cuda")
    _, k_rot = norm_rope_store(q, k, v, pos, cos_sin, None, None, 0.0, caches[4], caches[5],
                               slots, return_k=True, k_scale=ks, v_scale=vs)
    store_kvcache_torch(k_rot, v, caches[2], caches[3], slots, ks, vs)
    assert torch.equal(caches[4].view(torch.uint8), caches[2].view(torch.uint8))
    assert torch.equal(caches[5].view(torch.uint8), caches[3].view(torch.uint8))


@pytest.mark.parametrize("fp16_dot", [True, False])
@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("batch,ctx", [(1, 3000), (4, 700), (64, 300)])
def test_decode_fp8_gpu(dtype, batch, ctx, fp16_dot, monkeypatch):
    monkeypatch.setitem(triton_decode.CONFIG_FP8, "FP16_DOT", fp16_dot)
    c = fp8_case([(1, ctx - i % 5) for i in range(batch)], 256, dtype, seed=batch)
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    ref = decode_attention_torch(*args, c.k_scale, c.v_scale)
    o = triton_decode.decode_attention(*args, k_scale=c.k_scale, v_scale=c.v_scale)
    assert rel_err(o, ref) < TOL
    assert rel_err(ref, c.exact) < (0.06 if dtype == torch.float8_e4m3fn else 0.12)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("seqs", [[(1000, 1000), (7, 7)], [(300, 1500), (257, 257)]])
def test_prefill_fp8_gpu(dtype, seqs):
    c = fp8_case(seqs, 256, dtype, seed=len(seqs))
    args = (c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables, c.scale)
    ref = prefill_attention_torch(*args, c.k_scale, c.v_scale)
    o = triton_prefill.prefill_attention(*args, c.max_seqlen_q, k_scale=c.k_scale,
                                         v_scale=c.v_scale)
    assert rel_err(o, ref) < TOL


def test_backend_prefill_fp8_gpu_attends_to_its_unquantized_kv():
    from nanovllm.layers.attention_backend import TritonBackend
    from nanovllm.utils.context import Context

    seqs = [(1000, 1000), (7, 7), (300, 300)]
    c = fp8_case(seqs, 256, torch.float8_e4m3fn, seed=7)
    ctx = Context(is_prefill=True, cu_seqlens_q=c.cu_seqlens_q, cu_seqlens_k=c.cu_seqlens_k,
                  max_seqlen_q=c.max_seqlen_q, max_seqlen_k=c.max_seqlen_k,
                  block_tables=c.block_tables)
    backend = TritonBackend()
    backend.exact_prefill = True  # off by default on the GPU (see TritonBackend)
    o = backend.prefill(c.q, torch.cat(c.ks), torch.cat(c.vs), c.k_cache, c.v_cache,
                                ctx, c.scale, c.k_scale, c.v_scale)
    assert rel_err(o, c.exact) < TOL  # bf16 rounding only, not e4m3's


def test_engine_fp8_gpu_calibrates_and_doubles_blocks(tmp_path):
    from nanovllm import LLM, SamplingParams
    from nanovllm.utils.toy import save_random_qwen3

    path = save_random_qwen3(str(tmp_path / "m"), num_attention_heads=8, num_key_value_heads=2,
                             head_dim=64, hidden_size=128, num_hidden_layers=2)
    blocks, outs = {}, {}
    for kind in ("auto", "fp8_e4m3"):
        # Small limits: a quick start-up (few decode graphs, a short warm-up prefill).
        llm = LLM(path, kv_cache_dtype=kind, gpu_memory_utilization=0.3, max_num_seqs=8,
                  max_num_batched_tokens=1024, max_model_len=1024)
        sp = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
        outs[kind] = [o["token_ids"] for o in llm.generate([[1, 2, 3] * 50, [9] * 70], sp,
                                                           use_tqdm=False)]
        blocks[kind] = llm.clients[0].core.executor.num_kvcache_blocks
        if kind != "auto":
            scales = llm.clients[0].core.executor.runner.kv_scales
            assert (scales != 1).all() and torch.isfinite(scales).all()
        llm.shutdown()
        torch.cuda.empty_cache()
    assert blocks["fp8_e4m3"] > 1.8 * blocks["auto"]
    assert all(len(o) == 32 for o in outs["fp8_e4m3"])
