"""Logprobs against the oracle: a float32 log_softmax of Hugging Face's logits, teacher-forced
on the prompt and the tokens our engine generated; and output-to-output comparisons."""
import torch

from tests.support.hf_oracle import hf_model

TOL = 1e-4


def hf_logprobs(path: str, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row i is log p(. | ids[: i + 1]) under HF's model, float32."""
    with torch.no_grad():
        logits = hf_model(path)(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), -1)


def check_position(d: dict, chosen: int, ref: torch.Tensor, k: int, tol: float = TOL) -> None:
    """One position's {token id: Logprob} against ref, the reference logprobs of the whole
    vocabulary: vLLM's layout (chosen token first, then the top-k with ranks 1..k), values
    within tol, HF's top-k set up to near-ties, and the chosen token's rank in the vocabulary
    (vLLM's rule: the tokens at least as likely as it, itself included)."""
    assert next(iter(d)) == chosen, "the chosen token comes first"
    assert len(d) in (k, k + 1)
    for t, lp in d.items():
        assert abs(lp.logprob - ref[t].item()) < tol, (t, lp, ref[t].item())
    top = d if len(d) == k else {t: lp for t, lp in d.items() if t != chosen}
    by_rank = sorted(top.values(), key=lambda lp: lp.rank)
    assert [lp.rank for lp in by_rank] == list(range(1, k + 1))
    assert all(a.logprob >= b.logprob for a, b in zip(by_rank, by_rank[1:]))
    if k:
        kth = ref.topk(k).values[-1].item()
        assert all(ref[t].item() >= kth - tol for t in top), "not HF's top-k"
    own = ref[chosen].item()
    lo, hi = int((ref > own + tol).sum()) + 1, int((ref >= own - tol).sum())
    assert lo <= d[chosen].rank <= hi, (d[chosen].rank, lo, hi)


def check_output(path: str, out, k: int | None, pk: int | None, tol: float = TOL) -> None:
    """A RequestOutput's logprobs (k) and prompt logprobs (pk) against HF, for every
    completion; fields that were not asked for must be None."""
    prompt = out.prompt_token_ids
    for c in out.outputs:
        if k is None:
            assert c.logprobs is None and c.cumulative_logprob is None
            continue
        ref = hf_logprobs(path, prompt + c.token_ids)
        assert len(c.logprobs) == len(c.token_ids)
        rows = [ref[len(prompt) - 1 + j] for j in range(len(c.token_ids))]
        for d, t, row in zip(c.logprobs, c.token_ids, rows):
            check_position(d, t, row, k, tol)
        want = sum(row[t].item() for t, row in zip(c.token_ids, rows))
        assert abs(c.cumulative_logprob - want) < tol * max(1, len(rows))
    if pk is None:
        assert out.prompt_logprobs is None
        return
    ref = hf_logprobs(path, prompt)
    assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
    for p in range(1, len(prompt)):
        check_position(out.prompt_logprobs[p], prompt[p], ref[p - 1], pk, tol)


def assert_lists_close(x: list | None, y: list | None, tol: float = TOL) -> None:
    """Two lists of position dicts (or None entries): same keys in the same order, same
    ranks, values within tol."""
    assert (x is None) == (y is None) and len(x or []) == len(y or [])
    for dx, dy in zip(x or [], y or []):
        assert (dx is None) == (dy is None)
        if dx is not None:
            assert list(dx) == list(dy)
            assert [v.rank for v in dx.values()] == [v.rank for v in dy.values()]
            assert all(abs(dx[t].logprob - dy[t].logprob) < tol for t in dx)


def assert_close(a, b, tol: float = TOL) -> None:
    """Two RequestOutputs with the same tokens and logprobs up to tol."""
    assert a.prompt_token_ids == b.prompt_token_ids
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert_lists_close(a.prompt_logprobs, b.prompt_logprobs, tol)
    for x, y in zip(a.outputs, b.outputs):
        assert_lists_close(x.logprobs, y.logprobs, tol)
        assert (x.cumulative_logprob is None) == (y.cumulative_logprob is None)
        if x.cumulative_logprob is not None:
            assert abs(x.cumulative_logprob - y.cumulative_logprob) < tol * (1 + len(x.token_ids))
