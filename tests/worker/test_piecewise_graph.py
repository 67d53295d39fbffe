"""Piecewise graphs for prefill and mixed steps (worker/piecewise_graph.py): buckets and the
config rule, the capture's hand-over at Attention.forward and its static copies of q/k/v
(CPU); on a GPU, an engine whose prefill and mixed steps replay them gives the eager
engine's outputs."""
from types import SimpleNamespace

import pytest
import torch

from nanovllm.layers.attention import Attention
from nanovllm.utils.context import set_attention_cut
from nanovllm.worker import piecewise_graph
from nanovllm.worker.piecewise_graph import PiecewiseGraphs, bucket_sizes, prefill_graph_tokens


@pytest.mark.parametrize("max_tokens", [1, 64, 100, 512, 2560, 3000])
def test_buckets_cover_every_count(max_tokens):
    sizes = bucket_sizes(max_tokens)
    assert sizes == sorted(set(sizes)) and sizes[-1] == max_tokens
    for n in range(1, max_tokens + 1, 7):
        fit = next(s for s in sizes if s >= n)
        assert fit - n < max(n, 64)  # padding at most doubles a step (or fills one bucket)


def test_config_rule():
    def cfg(tokens, mixed, budget=16384):
        return SimpleNamespace(prefill_graph_tokens=tokens, enable_mixed_steps=mixed,
                               max_num_batched_tokens=budget)

    assert prefill_graph_tokens(cfg(None, True)) == 2560
    assert prefill_graph_tokens(cfg(None, False)) == 512
    assert prefill_graph_tokens(cfg(1024, False)) == 1024
    assert prefill_graph_tokens(cfg(0, True)) == 0
    assert prefill_graph_tokens(cfg(None, True, budget=64)) == 64


def test_attention_hands_over_to_a_capture():
    """While a cut is installed, Attention.forward gives it the module and its arguments and
    returns what it returns (no cache needed); without one it attends."""
    attn = Attention(4, 8, 8 ** -0.5, 2)
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    seen = []

    def cut(module, *args):
        seen.append((module, args))
        return "piece ends here"

    set_attention_cut(cut)
    try:
        assert attn(q, k, v, torch.arange(3), None) == "piece ends here"
    finally:
        set_attention_cut(None)
    assert seen[0][0] is attn and seen[0][1][0] is q
    # Without the cut: the real path (its warm-up branch: no cache yet).
    assert torch.equal(attn(q, k, v, torch.arange(3), None), torch.zeros_like(q))


def test_static_inputs_keep_the_views_layout():
    """q/k/v views of one packed projection become the same views (shape, strides, values)
    of the static buffer; a tensor with no base gets its own region."""
    graphs = PiecewiseGraphs.__new__(PiecewiseGraphs)
    graphs._inputs = None
    with torch.inference_mode():  # as in the engine: views keep no _base there
        qkv = torch.randn(5, 4 * 8 + 2 * 2 * 8)
        q, k, v = qkv.split([32, 16, 16], -1)
        q, k, v = q.view(5, 4, 8), k.view(5, 2, 8), v.view(5, 2, 8)
        alone = torch.randn(5, 3)
        views = graphs.stage_inputs((q, k, v, alone))
    for t, view in zip((q, k, v, alone), views):
        assert view.shape == t.shape and view.stride() == t.stride()
        assert torch.equal(view, t)
    assert graphs._inputs.numel() == qkv.numel() + alone.numel()
    # A smaller bucket reuses the buffer.
    with torch.inference_mode():
        assert torch.equal(graphs.stage_inputs((q[:2],))[0], q[:2])


@pytest.mark.gpu
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_replayed_prefill_and_mixed_steps_match_eager(toy_models, monkeypatch,
                                                      async_scheduling):
    """Staggered arrivals (test_mixed_steps.py) with mixed steps: replayed pieces give the
    eager engine's tokens, texts and logprobs, and they were replayed."""
    pytest.importorskip("xgrammar")
    from tests.engine.test_mixed_steps import MODEL, staggered

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    runs = [0]
    original = PiecewiseGraphs.run

    def run(self, *args):
        runs[0] += 1
        return original(self, *args)

    monkeypatch.setattr(piecewise_graph.PiecewiseGraphs, "run", run)
    # A budget of 1024: five buckets (64 to 1024) captured into one pool.
    engine = dict(num_kvcache_blocks=64, max_num_batched_tokens=1024,
                  max_mixed_prefill_tokens=16)
    want, _ = staggered(toy_models[MODEL], True, async_scheduling, "cuda",
                        prefill_graph_tokens=0, **engine)
    assert runs[0] == 0
    got, (mixed, _) = staggered(toy_models[MODEL], True, async_scheduling, "cuda", **engine)
    assert mixed >= 5 and runs[0] >= mixed
    assert got == want
