import torch

from nanovllm.worker.sampler import Sampler, SamplingTensors


def draw(logits, n=4000, **kw):
    """Sample n times from one row of logits (the row repeated) and count tokens."""
    rows = logits.repeat(n, 1)
    st = SamplingTensors(torch.full((n,), kw.pop("temperature", 1.0)), **{
        k: torch.tensor([v] * n) for k, v in kw.items()})
    return torch.bincount(Sampler()(rows, st), minlength=logits.numel())


def test_greedy_rows_take_argmax_even_in_a_mixed_batch():
    logits = torch.randn(6, 50)
    st = SamplingTensors(torch.tensor([0.0, 1.0, 0.0, 0.7, 0.0, 2.0]))
    out = Sampler()(logits, st)
    for i in (0, 2, 4):
        assert out[i] == logits[i].argmax()
    assert Sampler()(logits, SamplingTensors(torch.zeros(6), all_greedy=True)).tolist() == \
        logits.argmax(-1).tolist()


def test_temperature_sampling_follows_softmax():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    counts = draw(logits, n=20000, temperature=0.5).float() / 20000
    expect = torch.softmax(logits[0] / 0.5, -1)
    assert (counts - expect).abs().max() < 0.02


def test_top_k_top_p_min_p_restrict_the_support():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    assert set(draw(logits, top_ks=2).nonzero().flatten().tolist()) == {0, 1}
    # top_p=0.6: 0.4 alone is short of 0.6, 0.4+0.3 reaches it -> tokens {0, 1}.
    assert set(draw(logits, top_ps=0.6).nonzero().flatten().tolist()) == {0, 1}
    assert set(draw(logits, top_ps=0.05).nonzero().flatten().tolist()) == {0}
    # min_p=0.6 keeps tokens with p >= 0.6 * 0.4 = 0.24.
    assert set(draw(logits, min_ps=0.6).nonzero().flatten().tolist()) == {0, 1}


def test_seeded_rows_are_reproducible():
    logits = torch.randn(3, 1000)
    st = lambda: SamplingTensors(torch.ones(3), seeds=[(0, 7, 5), (2, 7, 6)])
    a = Sampler()(logits, st())
    b = Sampler()(logits, st())
    assert a[0] == b[0] and a[2] == b[2]
    draws = {int(Sampler()(logits, SamplingTensors(torch.ones(3), seeds=[(0, s, 0)]))[0])
             for s in range(20)}
    assert len(draws) > 1  # different seeds give different samples
