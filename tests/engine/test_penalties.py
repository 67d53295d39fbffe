"""Penalties and min_tokens through the engine on CPU: greedy with penalties equals vLLM's
formula applied to Hugging Face's logits, min_tokens holds back end tokens, stop ids and stop
strings, and async scheduling, preemption and chunked prefill change no token."""
import pytest

from nanovllm import LLM, SamplingParams
from tests.support.hf_oracle import hf_greedy, hf_greedy_penalized
from tests.support.penalties import CASES, mixed_params
from tests.support.prompts import make_prompts
from tests.support.text import STOP_PROMPT

MODEL = "tied_mha_d16"
N = 16
# Random prompts, one that repeats a phrase and one that repeats a single token.
PROMPTS = make_prompts(4, n=4) + [[5, 6, 7, 5, 6, 7, 5, 6, 7, 8], [30] * 12]


@pytest.fixture(scope="module")
def llm(toy_models):
    llm = LLM(toy_models[MODEL], device="cpu", dtype="float32", enforce_eager=True,
              kvcache_block_size=16, max_model_len=256)
    yield llm
    llm.shutdown()


def greedy(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0, "max_tokens": N, "ignore_eos": True, **kw})


def ids(outputs) -> list[list[int]]:
    return [o["token_ids"] for o in outputs]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "+".join(k.split("_")[0] for k in kw))
def test_greedy_with_penalties_matches_vllm_formula_on_hf_logits(llm, toy_models, kw):
    path = toy_models[MODEL]
    got = ids(llm.generate(PROMPTS, greedy(**kw), use_tqdm=False))
    want = [hf_greedy_penalized(path, tuple(p), N, **kw) for p in PROMPTS]
    assert got == want
    # The penalties bite: most completions differ from plain greedy (a no-op would fail).
    plain = [hf_greedy(path, tuple(p), N) for p in PROMPTS]
    assert sum(a != b for a, b in zip(want, plain)) >= len(PROMPTS) - 1


def test_mixed_batch_penalizes_only_its_rows(llm, toy_models):
    path = toy_models[MODEL]
    kws = [CASES[i % len(CASES)] if i % 3 else {} for i in range(len(PROMPTS))]
    got = ids(llm.generate(PROMPTS, [greedy(**kw) for kw in kws], use_tqdm=False))
    assert got == [hf_greedy_penalized(path, tuple(p), N, **kw) for p, kw in zip(PROMPTS, kws)]
    assert got[0] == hf_greedy(path, tuple(PROMPTS[0]), N)


def expected_stop(ref: list[int], stops: set[int], min_tokens: int):
    """Where the engine must stop in the reference tokens: at the first stop id from index
    min_tokens on (vLLM's rule), else at the length limit."""
    for i, t in enumerate(ref):
        if i >= min_tokens and t in stops:
            return ref[: i + 1], "stop"
    return ref, "length"


def test_min_tokens_holds_back_stop_token_ids(llm, toy_models):
    path, prompt = toy_models[MODEL], PROMPTS[0]
    # Every token plain greedy picks is a stop id: without min_tokens it stops at once.
    stops = sorted(set(hf_greedy(path, tuple(prompt), 12)))
    sp = dict(temperature=0, max_tokens=20, stop_token_ids=stops)
    first = llm.generate([prompt], SamplingParams(**sp), use_tqdm=False)[0]
    assert len(first["token_ids"]) == 1 and first["finish_reason"] == "stop"
    out = llm.generate([prompt], SamplingParams(**sp, min_tokens=5), use_tqdm=False)[0]
    # The reference bans the stop ids and the end tokens for five tokens, then runs on.
    banned = tuple(sorted({*stops, *llm.clients[0].core.scheduler.eos_ids}))
    ref = hf_greedy_penalized(path, tuple(prompt), 20, stop_ids=banned, min_tokens=5)
    tokens, reason = expected_stop(ref, set(stops), 5)
    assert (out["token_ids"], out["finish_reason"]) == (tokens, reason)
    assert len(out["token_ids"]) > 5 and not set(out["token_ids"][:5]) & set(stops)
    assert reason == "stop" and out.outputs[0].stop_reason == tokens[-1]


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_min_tokens_holds_back_end_tokens(toy_models, ignore_eos):
    path, prompt = toy_models[MODEL], PROMPTS[1]
    eos = hf_greedy(path, tuple(prompt), 1)[0]  # greedy's first token is the end token now
    llm = LLM(path, device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=128,
              eos=eos)
    sp = dict(temperature=0, max_tokens=12, ignore_eos=ignore_eos)
    first = llm.generate([prompt], SamplingParams(**sp), use_tqdm=False)[0]
    assert first["token_ids"][0] == eos
    assert first["finish_reason"] == ("length" if ignore_eos else "stop")
    out = llm.generate([prompt], SamplingParams(**sp, min_tokens=3), use_tqdm=False)[0]
    # vLLM holds the end tokens back for min_tokens even with ignore_eos; they stop a
    # sequence only without it.
    ref = hf_greedy_penalized(path, tuple(prompt), 12, stop_ids=(eos,), min_tokens=3)
    want = (ref, "length") if ignore_eos else expected_stop(ref, {eos}, 3)
    assert (out["token_ids"], out["finish_reason"]) == want
    assert eos not in out["token_ids"][:3]
    llm.shutdown()


def test_stop_string_cannot_fire_before_min_tokens(llm):
    base = dict(temperature=0, max_tokens=24, ignore_eos=True, min_tokens=8)
    plain = llm.generate([STOP_PROMPT], SamplingParams(**base), use_tqdm=False)[0]
    text, toks = plain["text"], plain["token_ids"]
    decode = llm.text.decode
    # A stop string from the text of one of the first tokens (plain ASCII, so it reads the
    # same in the whole text).
    j = next((j for j in range(6) if (piece := decode([toks[j]]).strip()).isascii()
              and len(piece) >= 2 and piece[:2] in text), None)
    if j is None:
        pytest.skip("no ASCII piece among the first tokens to stop at")
    stop = decode([toks[j]]).strip()[:2]
    early = llm.generate([STOP_PROMPT], SamplingParams(**{**base, "min_tokens": 0}, stop=stop),
                         use_tqdm=False)[0]
    assert early["finish_reason"] == "stop" and len(early["token_ids"]) <= j + 2
    late = llm.generate([STOP_PROMPT], SamplingParams(**base, stop=stop), use_tqdm=False)[0]
    assert len(late["token_ids"]) > base["min_tokens"]
    # vLLM's rule: only a match that ends past the text of the first min_tokens counts.
    head = len(decode(toks[: base["min_tokens"]]))
    at = text.find(stop, max(head - len(stop) + 1, 0))
    if at == -1:
        assert (late["text"], late["finish_reason"]) == (text, "length")
    else:
        assert (late["text"], late["finish_reason"]) == (text[:at], "stop")
        assert late.outputs[0].stop_reason == stop


def run(path, async_scheduling, prompts, sps, **engine):
    llm = LLM(path, async_scheduling=async_scheduling, device="cpu", dtype="float32", **engine)
    outs = [[[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs]
             for o in llm.generate(prompts, sps, use_tqdm=False)]
            for _ in range(2)]  # the second time with prefix-cache hits
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks and llm.clients[0].core.scheduler.num_in_flight == 0
    preemptions = llm.clients[0].core.scheduler.num_preemptions
    llm.shutdown()
    return outs, preemptions


@pytest.mark.parametrize("engine", [
    dict(kvcache_block_size=16, num_kvcache_blocks=12, max_model_len=512),
    dict(kvcache_block_size=16, num_kvcache_blocks=24, max_model_len=512,
         max_num_batched_tokens=24, max_num_seqs=4),
], ids=["preemption", "chunked"])
def test_async_scheduling_gives_the_same_tokens(toy_models, engine):
    # The pending token of each sequence (still on the device when the next step starts)
    # must count in its history: a stale history would change these penalized outputs.
    prompts = make_prompts(5, n=10, shared=range(100, 137))
    sps = mixed_params(5, len(prompts))
    want = run(toy_models[MODEL], False, prompts, sps, **engine)
    got = run(toy_models[MODEL], True, prompts, sps, **engine)
    assert got[0] == want[0]
    if engine["num_kvcache_blocks"] == 12:
        assert want[1] > 0 and got[1] > 0  # both preempted


def test_bad_requests_leave_the_engine_serving(llm, toy_models):
    for kw in (dict(repetition_penalty=0), dict(frequency_penalty=2.5),
               dict(presence_penalty=float("nan")), dict(min_tokens=5, max_tokens=4)):
        with pytest.raises(ValueError, match=next(iter(kw))):
            SamplingParams(**kw)
    # A stop id outside the vocabulary is never sampled: min_tokens just skips it.
    sp = greedy(repetition_penalty=1.5, min_tokens=4, stop_token_ids=[10**6])
    with pytest.raises(ValueError):
        llm.generate([PROMPTS[0], [1, 2, 10**6]], sp, use_tqdm=False)  # token outside vocab
    assert llm.is_finished()
    out = llm.generate([PROMPTS[0]], sp, use_tqdm=False)[0]
    assert out["token_ids"] == hf_greedy_penalized(toy_models[MODEL], tuple(PROMPTS[0]), N,
                                                   repetition_penalty=1.5)
