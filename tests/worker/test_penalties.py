"""The batched penalty pass against vLLM's rules applied one row at a time; on a GPU (`gpu`
marker), CUDA-graph decode with async scheduling on and off gives the tokens of eager decode
(torch attention), and greedy rows also match the CPU engine, which the CPU suite checks
against Hugging Face."""
import pytest
import torch

from nanovllm import LLM
from nanovllm.engine.sampling_rows import penalty_rows
from nanovllm.engine.sequence import PLACEHOLDER, Sequence
from nanovllm.sampling_params import SamplingParams
from nanovllm.worker.penalties import apply_penalties
from nanovllm.worker.penalties import penalty_tensors as device_tensors
from nanovllm.worker.stager import Stager
from tests.support.penalties import CASES, mixed_params, penalize
from tests.support.prompts import make_prompts

VOCAB = 50
EOS = frozenset({2, 3})


def seq(prompt, output, pending=False, **kw) -> Sequence:
    s = Sequence(prompt, SamplingParams(**kw), block_size=16)
    for t in output:
        s.append_token(t)
    if pending:
        s.append_pending()
    return s


def penalty_tensors(seqs, eos_ids, prev_rows, sampled, vocab_size):
    """The host builder's rows, staged as the model runner stages them, on sampled's device."""
    rows = penalty_rows(seqs, eos_ids, prev_rows, vocab_size)
    if rows is None:
        return None
    dev = Stager(sampled.device).upload(dict(penalty_ids=rows.ids,
                                             penalty_settings=rows.settings))
    return device_tensors(rows, dev, sampled)


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


MODEL = "untied_gqa4_d64"
PROMPTS = make_prompts(6, 12, shared=40, every=3, max_len=89)
SPS = mixed_params(6, len(PROMPTS))


def outputs(path, **kw):
    """Completions (token ids, finish reason) of two rounds (the second with prefix-cache
    hits), and whether decode ran in CUDA graphs and async."""
    llm = LLM(path, dtype="float32", kvcache_block_size=16, max_model_len=512, max_num_seqs=16,
              **kw)
    rounds = [[[(c.token_ids, c.finish_reason) for c in o.outputs]
               for o in llm.generate(PROMPTS, SPS, use_tqdm=False)] for _ in range(2)]
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    core = llm.clients[0].core
    how = (core.executor.runner.graphs is not None, core.async_scheduling)
    llm.shutdown()
    assert rounds[0] == rounds[1]
    return rounds[0], how


@pytest.mark.gpu
@pytest.mark.parametrize("engine", [{}, dict(num_kvcache_blocks=24, max_num_batched_tokens=50)],
                         ids=["plain", "preemption+chunked"])
def test_graphs_and_async_match_eager(toy_models, engine):
    path = toy_models[MODEL]
    ref, how = outputs(path, device="cuda", attention_backend="torch", enforce_eager=True,
                       async_scheduling=False, **engine)
    assert how == (False, False)
    for on in (False, True):
        got, how = outputs(path, device="cuda", attention_backend="triton", async_scheduling=on,
                           **engine)
        assert how == (True, on)
        assert got == ref
    # Seeded rows draw from device-specific random streams: compare the greedy ones.
    cpu, _ = outputs(path, device="cpu", **engine)
    greedy = [i for i, sp in enumerate(SPS) if sp.temperature == 0]
    assert [cpu[i] for i in greedy] == [ref[i] for i in greedy]


@pytest.mark.gpu
def test_bf16_with_the_fused_sampler(toy_models):
    # Unseeded temperature rows take the fused Triton sampler after the penalty pass.
    llm = LLM(toy_models["tied_mha_d16"], device="cuda", dtype="bfloat16", max_num_seqs=64)
    stops = list(range(3, 400))  # nearly every token the prompts lead to
    sps = [SamplingParams(temperature=0.7 * (i % 2), max_tokens=20, min_tokens=6,
                          stop_token_ids=stops, **CASES[i % len(CASES)]) for i in range(40)]
    outs = llm.generate(make_prompts(0, 40), sps, use_tqdm=False)
    for o in outs:
        toks = o["token_ids"]
        assert len(toks) >= 7 or o["finish_reason"] == "length"
        assert not set(toks[:6]) & set(stops)
    llm.shutdown()
