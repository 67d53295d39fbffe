"""kernels/kv_feedback.py: K rounded to e4m3 with GPTQ's error feedback against the queries'
second moments."""
import os

import pytest
import torch

from nanovllm.kernels.kv_feedback import feedback_factor, identity_feedback, quantize_feedback
from nanovllm.kernels.torch_ref import dequantize, quantize, store_kvcache_torch
from nanovllm.layers.rotary_embedding import RotaryEmbedding

FP8 = torch.float8_e4m3fn


def make(t=64, hkv=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(t, hkv, d, generator=g) * 3
    scale = k.abs().amax(dim=(0, 2)) * 8 / 448  # a calibration with margin 8
    return k, scale, g


def test_no_feedback_without_correlations():
    """The identity pushes no error anywhere: plain rounding, code for code; so does the
    factor of uncorrelated queries with equal variances."""
    k, scale, g = make()
    plain = quantize(k, scale, FP8).view(torch.uint8)
    assert torch.equal(quantize_feedback(k, scale, identity_feedback(2, 32)).view(torch.uint8),
                       plain)
    factor = feedback_factor(torch.eye(32).repeat(1, 2, 1), num_kv_heads=2)
    assert torch.equal(factor, identity_feedback(2, 32))


def test_scores_err_less_on_anisotropic_queries():
    """Queries in a few directions (as attention's are): held-out queries' score errors
    E[(q.d)^2] fall well below plain rounding's, while every code stays a finite e4m3 value."""
    k, scale, g = make(t=256)
    hq, d = 4, k.shape[-1]
    basis = torch.randn(2, 3, d, generator=g)  # a 3-direction subspace per kv head

    def queries(n):
        z = torch.randn(n, 2, 2, 3, generator=g)  # [T, Hkv, G, 3]
        return (torch.einsum("tkgr,krd->tkgd", z, basis)
                + 0.05 * torch.randn(n, 2, 2, d, generator=g)).reshape(n, hq, d)

    fit = queries(512)
    q = queries(512).view(512, 2, 2, d)

    def score_err(delta):  # mean over queries, keys and heads of (q . delta)^2
        return torch.einsum("qkgd,tkd->qtkg", q, delta).pow(2).mean()

    plain = score_err(dequantize(quantize(k, scale, FP8), scale) - k)
    errs = {}
    for group in (8, 16, 32):  # 32: one group, the dense feedback
        fb = quantize_feedback(k, scale, feedback_factor(fit, 2, group=group))
        assert torch.isfinite(fb.float()).all()
        errs[group] = score_err(dequantize(fb, scale) - k)
    assert errs[32] < errs[8] < 0.8 * plain
    assert errs[16] < 0.7 * plain


def rope_case(mix: bool, device="cpu", dtype=torch.float32, hkv=2, d=32):
    """Inputs of the fused RoPE-store kernel with an fp8 cache, and a factor from
    anisotropic queries."""
    g = torch.Generator().manual_seed(3)
    t, hq, bs = 7, 2 * hkv, 8
    q, v = torch.randn(t, hq, d, generator=g), torch.randn(t, hkv, d, generator=g)
    k = torch.randn(t, hkv, d, generator=g) * 2
    rope = RotaryEmbedding(d, 64, 1e4)
    slots = torch.randperm(4 * bs, generator=g)[:t].int()
    slots[2] = -1  # a padding row writes nowhere
    queries = torch.randn(64, hq, 4, generator=g) @ torch.randn(4, d, generator=g)
    factor = feedback_factor(queries, hkv)
    scales = [torch.rand(hkv, generator=g) * 0.05 + 0.02 for _ in range(2)]
    caches = [torch.zeros(4, bs, hkv, d, dtype=FP8) for _ in range(2)]
    return [x.to(device) if isinstance(x, (torch.Tensor, torch.nn.Module)) else x
            for x in (q.to(dtype), k.to(dtype), v.to(dtype), torch.arange(t), rope, slots,
                      factor, *scales, *caches)]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter (CPU)")
@pytest.mark.parametrize("mix", [False, True])
@pytest.mark.parametrize("ahead", [False, True])
def test_fused_store_rounds_as_the_reference(mix, ahead, monkeypatch):
    """The fused RoPE-store kernel's K codes with feedback equal quantize_feedback's of its
    rotated K, bit for bit (the interpreter rounds as torch does); V stays plain. ahead: the
    loop's matrix rows asked for a block of steps early (FEEDBACK_ROWS_AHEAD)."""
    from nanovllm.kernels import triton_rope
    from nanovllm.kernels.triton_rope import norm_rope_store

    monkeypatch.setattr(triton_rope, "FEEDBACK_ROWS_AHEAD", int(ahead))

    q, k, v, pos, rope, slots, factor, ks, vs, kc, vc = rope_case(mix)
    _, k_rot = norm_rope_store(q, k, v, pos, rope.cos_sin_cache, None, None, 0.0, kc, vc,
                               slots, return_k=True, k_scale=ks, v_scale=vs, mix=mix,
                               k_feedback=factor)
    ref_kc, ref_vc = torch.zeros_like(kc), torch.zeros_like(vc)
    store_kvcache_torch(k_rot, v, ref_kc, ref_vc, slots, ks, vs, k_feedback=factor)
    assert torch.equal(kc.view(torch.uint8), ref_kc.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), ref_vc.view(torch.uint8))
    plain = torch.zeros_like(kc)
    store_kvcache_torch(k_rot, v, plain, torch.zeros_like(vc), slots, ks, vs)
    assert not torch.equal(plain.view(torch.uint8), kc.view(torch.uint8))  # it did feed back


@pytest.mark.gpu
@pytest.mark.parametrize("mix", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hkv,d", [(2, 32), (3, 64), (8, 128)])
@pytest.mark.parametrize("fused", [True, False, "ahead", "ahead_l1"])
def test_gpu_fused_store_rounds_as_the_reference(mix, dtype, hkv, d, fused, monkeypatch):
    """On a GPU a prefill's chains run one per thread (feedback_chains.chain_asm) with the
    reference's roundings: the codes are the torch path's, bit for bit, for groups of 16 and
    32, padded kv heads and every activation dtype. A decode step's (fused: the register
    tile; "ahead" / "ahead_l1": its rows loaded / asked into L1 early) contracts
    multiply-adds, so a rare code may differ by one step."""
    from nanovllm.kernels import triton_rope
    from nanovllm.kernels.triton_rope import norm_rope_store

    monkeypatch.setattr(triton_rope, "FUSED_FEEDBACK_MAX_TOKENS", 1 << 20 if fused else 0)
    monkeypatch.setattr(triton_rope, "FEEDBACK_ROWS_AHEAD",
                        {"ahead": 1, "ahead_l1": 2}.get(fused, 0))
    q, k, v, pos, rope, slots, factor, ks, vs, kc, vc = rope_case(mix, "cuda", dtype, hkv, d)
    _, k_rot = norm_rope_store(q, k, v, pos, rope.cos_sin_cache, None, None, 0.0, kc, vc,
                               slots, return_k=True, k_scale=ks, v_scale=vs, mix=mix,
                               k_feedback=factor)
    ref_kc, ref_vc = torch.zeros_like(kc), torch.zeros_like(vc)
    store_kvcache_torch(k_rot, v, ref_kc, ref_vc, slots, ks, vs, k_feedback=factor)
    assert torch.equal(vc.view(torch.uint8), ref_vc.view(torch.uint8))
    if not fused:
        assert torch.equal(kc.view(torch.uint8), ref_kc.view(torch.uint8))
        return
    same = (kc.view(torch.uint8) == ref_kc.view(torch.uint8)).float().mean().item()
    assert same > 0.98
    got, want = kc.float(), ref_kc.float()
    # A differing code is a neighbour: one step is 1/8 of its binade (2^-9 below 2^-6).
    step = 0.125 * torch.maximum(got.abs(), want.abs()).clamp(min=2.0 ** -6)
    assert ((got - want).abs() <= step).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hkv,d", [(3, 64), (8, 128), (2, 16)])
def test_gpu_layer_kernel_chains_round_as_the_reference(dtype, hkv, d):
    """The layer kernel's K store (layer_attn._chains: a decode token's key through its qkv
    row, a thread per feedback group) gives the reference's codes bit for bit."""
    import triton
    import triton.language as tl

    from nanovllm.kernels.feedback_chains import SOURCE_DTYPES, chain_asm
    from nanovllm.kernels.kv_feedback import group_size
    from nanovllm.kernels.layer_attn import _chains

    @triton.jit
    def probe(k_ptr, row_ptr, fb_ptr, ks_ptr, out_ptr, HD: tl.constexpr, FB_G: tl.constexpr,
              FB_ASM: tl.constexpr):
        h = tl.program_id(0)
        half = tl.arange(0, HD // 2)[None, :]
        k1 = tl.load(k_ptr + h * HD + half).to(tl.float32)
        k2 = tl.load(k_ptr + h * HD + HD // 2 + half).to(tl.float32)
        _chains(k1, k2, row_ptr + h * HD, fb_ptr + h * (HD * FB_G), tl.load(ks_ptr + h),
                out_ptr + h * HD, FB_ASM, FB_G)

    k, scale, g = make(t=1, hkv=hkv, d=d, seed=3)
    group = group_size(d)
    factor = feedback_factor(torch.randn(256, 2 * hkv, d, generator=g), hkv, group=group)
    k = k.to(dtype)
    want = quantize_feedback(k, scale, factor)[0]
    k, scale, factor = k.cuda(), scale.cuda(), factor.cuda()
    got = torch.empty(hkv, d, dtype=FP8, device="cuda")
    probe[(hkv,)](k, torch.empty_like(k), factor, scale, got, HD=d, FB_G=group,
                  FB_ASM=chain_asm(group, SOURCE_DTYPES[dtype]), num_warps=4)
    assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))
