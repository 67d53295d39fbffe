"""The batched penalty pass against vLLM's rules applied one row at a time."""
import pytest
import torch

from nanovllm.engine.sequence import PLACEHOLDER, Sequence
from nanovllm.layers.penalties import apply_penalties, penalty_tensors
from nanovllm.sampling_params import SamplingParams
from tests.support.penalties import penalize

VOCAB = 50
EOS = frozenset({2, 3})


def seq(prompt, output, pending=False, **kw) -> Sequence:
    s = Sequence(prompt, SamplingParams(**kw), block_size=16)
    for t in output:
        s.append_token(t)
    if pending:
        s.append_pending()
    return s


def reference(logits, seqs, sampled, prev_rows):
    """Each row by itself: its pending token read from sampled, then vLLM's rules."""
    rows = []
    for x, s in zip(logits, seqs):
        sp = s.sampling_params
        out = [sampled[prev_rows[s.seq_id]].item() if t == PLACEHOLDER else t
               for t in s.token_ids[s.num_prompt_tokens:]]
        ban = s.num_completion_tokens < sp.min_tokens
        banned = sorted(t for t in {*EOS, *sp.stop_token_ids} if t < VOCAB) if ban else ()
        rows.append(penalize(x, s.prompt_token_ids, out, banned=banned,
                             repetition_penalty=sp.repetition_penalty,
                             frequency_penalty=sp.frequency_penalty,
                             presence_penalty=sp.presence_penalty))
    return torch.stack(rows)


def batch():
    """Rows of every kind: plain, each penalty, pending tokens, min_tokens active and done."""
    return [
        seq([5, 6, 7], [8, 9]),                                          # defaults: untouched
        seq([5, 5, 6], [6, 10, 10], repetition_penalty=1.7),
        seq([11, 12], [12, 12, 13], pending=True, frequency_penalty=0.6),
        seq([1], [], presence_penalty=-1.3, frequency_penalty=0.4),
        seq([7, 8, 9, 10, 11, 12], [7], pending=True, repetition_penalty=0.6,
            presence_penalty=1.1, min_tokens=4, stop_token_ids=[9, 40, 10**6]),
        seq([4], [20, 21, 22], min_tokens=3, stop_token_ids=[20]),          # min_tokens reached
        seq([4, 4], [], min_tokens=2),                                   # only end tokens banned
    ]


def test_batched_pass_matches_the_per_row_reference():
    torch.manual_seed(0)
    seqs = batch()
    logits = torch.randn(len(seqs), VOCAB) * 3
    sampled = torch.tensor([0, 13, 0, 0, 0, 44, 9], dtype=torch.int32)  # previous step's ids
    prev_rows = {seqs[2].seq_id: 1, seqs[4].seq_id: 5}
    before = logits.clone()
    pt = penalty_tensors(seqs, EOS, prev_rows, sampled, VOCAB)
    got = apply_penalties(logits, pt)
    want = reference(logits, seqs, sampled, prev_rows)
    assert torch.equal(got, want)
    assert torch.equal(logits, before)  # raw logits left as they were
    assert pt.rows.tolist() == [1, 2, 3, 4, 6]  # the default row and the finished min_tokens row
    assert got[4, 9] == float("-inf") and got[4, 2] == float("-inf")
    assert got[6, 3] == float("-inf") and torch.isfinite(got[5]).all()


def test_bf16_logits_come_back_float32():
    seqs = batch()[1:3]
    logits = torch.randn(2, VOCAB).bfloat16()
    sampled = torch.tensor([0, 13], dtype=torch.int32)
    pt = penalty_tensors(seqs, EOS, {seqs[1].seq_id: 1}, sampled, VOCAB)
    got = apply_penalties(logits, pt)
    assert got.dtype == torch.float32
    assert torch.equal(got, reference(logits.float(), seqs, sampled, {seqs[1].seq_id: 1}))


def test_nothing_is_built_without_penalties_or_min_tokens_to_enforce():
    sampled = torch.zeros(4, dtype=torch.int32)
    plain = [seq([5, 6], [7]), seq([5], [], temperature=0.5, top_k=3),
             seq([4], [20, 21], min_tokens=2, stop_token_ids=[20])]
    assert penalty_tensors(plain, EOS, {}, sampled, VOCAB) is None
    # min_tokens alone needs no token history.
    pt = penalty_tensors([seq([5], [], min_tokens=1)], EOS, {}, sampled, VOCAB)
    assert pt.prompt is None and pt.output is None and pt.banned.tolist() == [[2, 3]]
    # Frequency/presence alone need the output but not the prompt.
    pt = penalty_tensors([seq([5], [6], presence_penalty=1.0)], EOS, {}, sampled, VOCAB)
    assert pt.prompt is None and pt.output is not None and pt.banned is None


@pytest.mark.parametrize("kw", [dict(repetition_penalty=1.3), dict(frequency_penalty=-2.0),
                                dict(presence_penalty=2.0), dict(min_tokens=5)])
def test_greedy_argmax_moves_off_a_repeated_token(kw):
    # A token that leads by a little loses the lead once penalized (or banned, as an end token).
    s = seq([3, 4], [3], **kw)
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 8] = 2.0, 1.9
    got = apply_penalties(logits, penalty_tensors([s], EOS, {}, torch.zeros(1), VOCAB))
    assert got.argmax().item() == (3 if kw.get("frequency_penalty", 0) < 0 else 8)
