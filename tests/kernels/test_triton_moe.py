"""Fused-MoE kernel against the plain-torch reference: tiny shapes under the Triton interpreter
(CPU), bf16 sweeps and CUDA-graph capture on a GPU."""
import pytest
import torch

from nanovllm.kernels.torch_ref import fused_moe_torch
from nanovllm.kernels.triton_moe import (HUGE_CONFIG, LARGE_CONFIG, SMALL_CONFIG, align_pairs,
                                         fused_moe)
from nanovllm.layers.fused_moe import select_experts

CUDA = torch.cuda.is_available()


def moe_case(tokens, experts, top_k, hidden, inter, dtype=torch.float32, device="cpu", seed=0):
    """Fresh random inputs: x, w13, w2 scaled to unit-ish outputs, and a softmax routing."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    x = randn(tokens, hidden)
    w13 = randn(experts, 2 * inter, hidden, scale=hidden ** -0.5)
    w2 = randn(experts, hidden, inter, scale=inter ** -0.5)
    weights, ids = select_experts(randn(tokens, experts, scale=3.0).float(), top_k, True)
    return x, w13, w2, weights, ids


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("topk_ids, experts, block_m", [
    ([[1, 0], [1, 3], [0, 1]], 4, 4),
    ([[2], [2], [2], [2], [2]], 3, 2),       # one expert gets every pair, others none
    ([[0, 1, 2, 3]], 4, 16),                  # decode: one token, every expert once
    # more pairs than one tile of the kernels
    (torch.randint(0, 6, (37, 3), generator=torch.Generator().manual_seed(0)).tolist(), 6, 16),
])
def test_align_pairs_sorts_by_expert_with_padding(topk_ids, experts, block_m):
    ids = torch.tensor(topk_ids)
    n = ids.numel()
    sorted_ids, expert_ids, num_padded = align_pairs(ids, experts, block_m)
    used = int(num_padded)
    assert used % block_m == 0 and used <= sorted_ids.numel()
    rows = sorted_ids[:used].view(-1, block_m)
    real = sorted_ids[sorted_ids < n]
    assert sorted(real.tolist()) == list(range(n))  # every pair exactly once
    assert (sorted_ids[used:] == n).all()
    flat = ids.flatten()
    for b, row in enumerate(rows):
        pairs = row[row < n]
        assert (flat[pairs.long()] == expert_ids[b]).all()  # a block holds one expert's pairs
        assert len(pairs) > 0  # no block of padding alone
    assert (expert_ids[used // block_m:] == experts).all()


@pytest.mark.usefixtures("poisoned_empty")
@pytest.mark.parametrize("tokens, experts, top_k, hidden, inter", [
    (5, 4, 2, 32, 16),
    (1, 8, 1, 48, 24),    # K and N not multiples of the 16-wide tiles
    (19, 8, 8, 32, 16),   # every expert for every token
    (40, 4, 1, 16, 32),   # several blocks of one expert
])
def test_fused_moe_matches_reference_interpreted(tokens, experts, top_k, hidden, inter):
    case = moe_case(tokens, experts, top_k, hidden, inter, seed=tokens)
    assert rel_err(fused_moe(*case), fused_moe_torch(*case)) < 1e-5


def fp8_experts(w, block):
    """w [E, rows, cols] quantized the way checkpoints store it: e4m3 values and fp32 scales
    per row (block None) or per (bn, bk) block; returns (values, scales, w as they read)."""
    from nanovllm.layers.quant.fp8 import FP8, dequantize, expand_blocks

    if block is None:
        scale = w.abs().amax(-1).clamp(min=1e-12) / 448
        q = (w / scale[..., None]).to(FP8)
    else:
        bn, bk = block
        e, rows, cols = w.shape
        padded = torch.zeros(e, -(-rows // bn) * bn, -(-cols // bk) * bk, device=w.device)
        padded[:, :rows, :cols] = w.float()
        blocks = padded.view(e, -1, bn, padded.shape[2] // bk, bk).abs().amax((2, 4))
        scale = blocks.clamp(min=1e-12) / 448
        q = (w.float() / expand_blocks(scale, block, rows, cols)).to(FP8)
    return q, scale, dequantize(q, scale, block)


@pytest.mark.usefixtures("poisoned_empty")
@pytest.mark.parametrize("block", [None, (16, 16), (32, 16)], ids=["rows", "16x16", "32x16"])
@pytest.mark.parametrize("tokens, experts, top_k, hidden, inter", [
    (5, 4, 2, 32, 32),
    (19, 8, 8, 48, 32),   # every expert for every token; K a partial block
])
def test_fused_moe_fp8_experts_interpreted(block, tokens, experts, top_k, hidden, inter):
    """fp8 experts with their scales read in the kernel equal the dequantized experts."""
    x, w13, w2, weights, ids = moe_case(tokens, experts, top_k, hidden, inter, seed=tokens)
    q13, s13, d13 = fp8_experts(w13, block)
    q2, s2, d2 = fp8_experts(w2, block)
    out = fused_moe(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2, block=block)
    assert rel_err(out, fused_moe_torch(x, d13, d2, weights, ids)) < 1e-5


def test_fused_moe_no_tokens():
    x, w13, w2, weights, ids = moe_case(0, 4, 2, 32, 16)
    assert fused_moe(x, w13, w2, weights, ids).shape == (0, 32)


# -- on the GPU ---------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("config", [None, SMALL_CONFIG, LARGE_CONFIG, HUGE_CONFIG],
                         ids=["auto", "small", "large", "huge"])
@pytest.mark.parametrize("tokens", [1, 7, 64, 512, 8192])
@pytest.mark.parametrize("experts, top_k", [(8, 2), (8, 1), (64, 4), (128, 8)])
def test_fused_moe_bf16_gpu(tokens, experts, top_k, config):
    # Qwen3-30B-A3B's expert shape (hidden 2048, moe_intermediate 768) at TP=1.
    case = moe_case(tokens, experts, top_k, 2048, 768, torch.bfloat16, "cuda", seed=tokens)
    out = fused_moe(*case, config=config)
    assert torch.isfinite(out).all()
    assert rel_err(out, fused_moe_torch(*case)) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("block", [None, (128, 128)], ids=["rows", "128x128"])
@pytest.mark.parametrize("config", [None, HUGE_CONFIG], ids=["auto", "huge"])
@pytest.mark.parametrize("tokens", [1, 7, 512])
def test_fused_moe_fp8_gpu(tokens, config, block):
    """Qwen3-30B-A3B's experts in fp8, read as fp8 by the kernel, against the torch reference
    on the dequantized experts (bf16 activations, rounded as the reference rounds them)."""
    x, w13, w2, weights, ids = moe_case(tokens, 128, 8, 2048, 768, torch.float32, "cuda",
                                        seed=tokens)
    q13, s13, d13 = fp8_experts(w13, block)
    q2, s2, d2 = fp8_experts(w2, block)
    x = x.bfloat16()
    out = fused_moe(x, q13, q2, weights, ids, config=config, w13_scale=s13, w2_scale=s2,
                    block=block)
    ref = fused_moe_torch(x, d13.bfloat16(), d2.bfloat16(), weights, ids)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 24, 256])
def test_fused_moe_cuda_graph_replays_new_routing(tokens):
    x, w13, w2, weights, ids = moe_case(tokens, 128, 8, 512, 256, torch.bfloat16, "cuda")
    fused_moe(x, w13, w2, weights, ids)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, weights, ids)
    for seed in range(3):  # new activations and routing, same shapes: the graph must follow
        nx, _, _, nw, nids = moe_case(tokens, 128, 8, 512, 256, torch.bfloat16, "cuda", seed + 1)
        x.copy_(nx), weights.copy_(nw), ids.copy_(nids)
        graph.replay()
        assert rel_err(out, fused_moe_torch(x, w13, w2, weights, ids)) < 1e-2
