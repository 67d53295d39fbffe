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
