"""The fused Gumbel-max sampler against softmax(logits / T) (interpreter on CPU, real on GPU)."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from nanovllm.kernels import triton_sample
from nanovllm.kernels._common import INTERPRET
from nanovllm.kernels.triton_sample import _neg_log2, sample_temperature

# sample_temperature takes its per-chunk maxima from torch.empty: every chunk must be written.
pytestmark = pytest.mark.usefixtures("poisoned_empty", "levels")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(params=[False, True], ids=["one_level", "two_level"])
def levels(request, monkeypatch):
    """Every test with the one-level Gumbel pass and with the two-level draw, whatever the
    batch (TWO_LEVEL_FROM 0: always; a huge value: never)."""
    monkeypatch.setattr(triton_sample, "TWO_LEVEL_FROM", 0 if request.param else 1 << 62)
    return request.param


def test_greedy_rows_are_argmax():
    logits = torch.randn(3, 3000, device=DEVICE)
    out = sample_temperature(logits, torch.zeros(3, device=DEVICE), seed=1)
    assert out.tolist() == logits.argmax(-1).tolist()


# One temperature: T = 1 takes the same path and would not catch a kernel that ignored T.
@pytest.mark.parametrize("temp", [0.5])
def test_samples_follow_softmax(temp):
    # The interpreter runs each row as a program (~19 ms each). The seed is fixed, so the
    # draw is deterministic; 160 rows still tell T = 0.5 (p0 = 0.84) from T = 1 (0.61).
    n = 160 if DEVICE == "cpu" else 20000
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    logits = base.repeat(n, 1).to(DEVICE)
    out = sample_temperature(logits, torch.full((n,), temp, device=DEVICE), seed=123)
    freq = torch.bincount(out.cpu(), minlength=6).float() / n
    expect = torch.softmax(base / temp, -1)
    assert (freq - expect).abs().max() < (0.09 if DEVICE == "cpu" else 0.015)


def test_seeds_change_samples_and_bf16_input():
    logits = torch.zeros(16, 5000, device=DEVICE, dtype=torch.bfloat16)
    t = torch.ones(16, device=DEVICE)
    a = sample_temperature(logits, t, seed=1)
    b = sample_temperature(logits, t, seed=2)
    assert (a != b).any() and a.max() < 5000 and a.min() >= 0
    assert torch.equal(a, sample_temperature(logits, t, seed=1))


@triton.jit
def _neg_log2_kernel(u_ptr, out_ptr, HW: tl.constexpr):
    i = tl.arange(0, 16)
    tl.store(out_ptr + i, _neg_log2(tl.load(u_ptr + i), HW))


def test_neg_log2_keeps_its_relative_accuracy_next_to_one():
    """-log2(u), which the Gumbel score takes a log of again, near u = 1 (the series branch),
    on both sides of the switch to lg2 and near 0."""
    u = np.array([1 - 2.0 ** -24, 1 - 2.0 ** -21, 1 - 2.0 ** -12, 1 - 2.0 ** -7,
                  1 - 2.0 ** -6 * 1.01, 1 - 2.0 ** -6 * 0.99, 0.9, 0.75, 0.5, 0.25, 1e-3,
                  2.0 ** -31, 0.999, 0.99, 0.6, 0.3], dtype=np.float32)
    got = torch.empty(16, device=DEVICE)
    _neg_log2_kernel[(1,)](torch.from_numpy(u).to(DEVICE), got, HW=not INTERPRET)
    want = -np.log2(u.astype(np.float64))
    assert np.abs(got.cpu().numpy() / want - 1).max() < 2e-5


@pytest.mark.gpu
def test_on_gpu():
    """The same checks on a real GPU (selected by `-m gpu`), with the stricter tolerance."""
    test_greedy_rows_are_argmax()
    test_samples_follow_softmax(0.7)
    test_seeds_change_samples_and_bf16_input()
    test_neg_log2_keeps_its_relative_accuracy_next_to_one()


def test_a_seed_in_device_memory_draws_as_the_same_int():
    """The decode graphs that sample pass the seed as a tensor the kernel reads."""
    logits = torch.randn(4, 5000, device=DEVICE)
    t = torch.ones(4, device=DEVICE)
    seed = torch.tensor([77], dtype=torch.int32, device=DEVICE)
    assert torch.equal(sample_temperature(logits, t, seed), sample_temperature(logits, t, 77))
    assert seed.item() == 78  # bumped for the next replay
    assert torch.equal(sample_temperature(logits, t, seed), sample_temperature(logits, t, 78))
    assert seed.item() == 79


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # -inf - -inf
def test_two_level_draws_across_slices(monkeypatch, levels):
    """The two-level draw over a vocabulary of several slices: softmax frequencies, greedy rows'
    first argmax across slices, a slice masked whole never drawn."""
    if not levels:
        pytest.skip("two-level only")
    monkeypatch.setattr(triton_sample, "SLICE", 16)
    n = 400 if DEVICE == "cpu" else 20000
    base = torch.full((40,), -2.0)
    base[3], base[20], base[37] = 2.0, 1.5, 1.0
    base[16:32][base[16:32] < 0] = float("-inf")  # slice 1: token 20 alone
    out = sample_temperature(base.repeat(n, 1).to(DEVICE), torch.ones(n, device=DEVICE), 9)
    freq = torch.bincount(out.cpu(), minlength=40).float() / n
    expect = torch.softmax(base, -1)
    assert (freq - expect).abs().max() < (0.07 if DEVICE == "cpu" else 0.015)
    masked = base.clone()
    masked[16:32] = float("-inf")
    out = sample_temperature(masked.repeat(64, 1).to(DEVICE), torch.ones(64, device=DEVICE), 5)
    assert not ((out >= 16) & (out < 32)).any()
    ties = torch.zeros(2, 40, device=DEVICE)
    ties[0, 35] = ties[0, 21] = 1.0  # the first maximum is in the second slice
    ties[1, 39] = 2.0
    assert sample_temperature(ties, torch.zeros(2, device=DEVICE), 1).tolist() == [21, 39]
