"""Draft verification (worker/verify.py): greedy rows keep exactly the argmax tokens, and
sampled rows, whatever the drafts, give tokens distributed as the target's own (chi-square on
a small vocabulary)."""
import numpy as np
import torch

from nanovllm.engine.sampling_rows import sampling_rows
from nanovllm.sampling_params import SamplingParams
from nanovllm.worker.sampler import Sampler, SamplingTensors
from nanovllm.worker.step_output import _split
from nanovllm.worker.verify import verify_drafts

# chi-square critical values at p = 0.001 for 3 and 4 degrees of freedom: a correct sampler
# fails one in a thousand seeds, and the seeds are fixed, so the test is deterministic.
CHI2_CRIT = {3: 16.27, 4: 18.47}


def tensors(params: list[SamplingParams], vocab: int) -> SamplingTensors:
    rows = sampling_rows(params, [0] * len(params), vocab)
    dev = {"temperatures": torch.from_numpy(rows.temperatures)}
    for name in ("top_ks", "top_ps", "min_ps"):
        if getattr(rows, name) is not None:
            dev[name] = torch.from_numpy(getattr(rows, name))
    return SamplingTensors.from_rows(rows, dev)


def run(logits, params, drafts, counts):
    """(each row's token, each sequence's count of tokens out) as the host reads them."""
    out = verify_drafts(Sampler(), logits, tensors(params, logits.size(1)),
                        torch.tensor(drafts, dtype=torch.int32))
    rows = logits.size(0)
    kept = _split(out.tolist(), counts)
    return out[:rows], torch.tensor([len(k) for k in kept])


def test_greedy_keeps_the_argmax_prefix():
    torch.manual_seed(0)
    logits = torch.randn(7, 11)
    best = logits.argmax(-1).tolist()
    # Sequence A: 4 rows, drafts = argmax, argmax, wrong; sequence B: 3 rows, all right.
    drafts = [best[0], best[1], (best[2] + 1) % 11, -1, best[4], best[5], -1]
    tokens, counts = run(logits, [SamplingParams(temperature=0)] * 7, drafts, [4, 3])
    assert counts.tolist() == [3, 3]
    assert tokens[:3].tolist() == best[:3]  # two accepted drafts, then the correction
    assert tokens[4:7].tolist() == best[4:7]  # both accepted, then the bonus token


def chi2(samples: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * len(samples)
    seen = np.bincount(samples, minlength=len(probs))
    keep = expected > 0
    assert seen[~keep].sum() == 0, "a token of probability 0 was drawn"
    return float(((seen[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_sampled_tokens_follow_the_target_distribution():
    """Many 2-row sequences (one draft each) with the same target rows: the first token out
    follows p0 whatever the draft (drafts drawn from a skewed q), and so does the second one
    (p1), counted where the draft was accepted and the bonus token drawn."""
    torch.manual_seed(1)
    p0 = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    p1 = np.array([0.05, 0.05, 0.2, 0.3, 0.4])
    n = 20000
    logits = torch.from_numpy(np.log(np.tile(np.stack([p0, p1]), (n, 1)))).float()
    rng = np.random.default_rng(0)
    drafts = np.full(2 * n, -1)
    drafts[0::2] = rng.choice(5, size=n, p=[0.1, 0.1, 0.2, 0.2, 0.4])
    tokens, counts = run(logits, [SamplingParams(temperature=1.0)] * (2 * n),
                         drafts.tolist(), [2] * n)
    tokens, counts = tokens.numpy(), counts.numpy()
    first = tokens[0::2]
    assert chi2(first, p0) < CHI2_CRIT[4]
    accepted = counts == 2
    assert ((first == drafts[0::2]) == accepted).all()
    assert chi2(tokens[1::2][accepted], p1) < CHI2_CRIT[4]


def test_top_k_and_temperature_shape_the_distribution_drafts_are_judged_by():
    """With top_k=4 and temperature 0.7 the tokens out follow the processed distribution;
    a draft outside the top 4 is always rejected."""
    torch.manual_seed(2)
    raw = np.log(np.array([0.35, 0.25, 0.2, 0.12, 0.08]))
    target = np.exp(raw / 0.7)
    target[4] = 0
    target /= target.sum()
    n = 20000
    logits = torch.from_numpy(np.tile(raw, (2 * n, 1))).float()
    drafts = np.full(2 * n, -1)
    drafts[0::2] = np.random.default_rng(1).choice([0, 4], size=n)
    params = [SamplingParams(temperature=0.7, top_k=4)] * (2 * n)
    tokens, counts = run(logits, params, drafts.tolist(), [2] * n)
    first = tokens.numpy()[0::2]
    assert chi2(first, target) < CHI2_CRIT[3]
    assert (counts.numpy()[drafts[0::2] == 4] == 1).all()


def test_seeded_rows_repeat():
    logits = torch.randn(6, 9)
    params = [SamplingParams(temperature=1.0, seed=5)] * 6
    drafts = [1, 2, -1, 3, 4, -1]
    a = run(logits, params, drafts, [3, 3])
    b = run(logits, params, drafts, [3, 3])
    assert all(torch.equal(x, y) for x, y in zip(a, b))
