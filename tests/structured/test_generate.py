"""Structured output end to end on the CPU (toy Qwen3 with random weights, whose logits are
wider than its tokenizer's vocabulary): the grammar alone makes every output valid, so each
of 50 random JSON schemas' outputs parses and validates, regex, choice and EBNF outputs
match, and so do those of n = 2, preemption, chunked prefill, async scheduling and
speculative decoding (which leaves grammar requests alone). Bad specs raise ValueError and
the engine serves on; every block is free afterwards."""
import json
import re
import threading

import jsonschema
import pytest

from nanovllm import LLM, SamplingParams, StructuredOutputsParams
from tests.support.schemas import random_schemas

MODEL = "tied_gqa4_d16_l4"
PROMPT = "Give me JSON:"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1, "disable_by_batch_size": 16}
REGEX = r"[a-c]{2,5}x(yz)?"
CHOICES = ["yes", "no", "maybe so", 'a "quoted" one']
# Sums of up to four numbers of up to three digits, in parentheses.
EBNF = 'root ::= "(" num ("+" num){0,3} ")"\nnum ::= [0-9]{1,3}'
EBNF_RE = r"\([0-9]{1,3}(\+[0-9]{1,3}){0,3}\)"


def so(**kw) -> SamplingParams:
    """Sampled (temperature 1) with a grammar; max_tokens leaves room for every output."""
    seed, n, max_tokens = kw.pop("seed", 0), kw.pop("n", 1), kw.pop("max_tokens", 200)
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, n=n,
                          structured_outputs=StructuredOutputsParams(**kw))


def assert_idle(llm) -> None:
    bm = llm.clients[0].core.scheduler.block_manager
    assert llm.is_finished() and bm.num_free_blocks == bm.num_blocks


def test_random_json_schemas_validate(small_llm):
    schemas = random_schemas(50, seed=0)
    sps = [so(json=s, disable_any_whitespace=True, seed=i) for i, s in enumerate(schemas)]
    outs = small_llm.generate([PROMPT] * len(schemas), sps, use_tqdm=False)
    for out, schema in zip(outs, schemas):
        c = out.outputs[0]
        assert c.finish_reason == "stop", (c.text, schema)
        jsonschema.validate(json.loads(c.text), schema)
    assert_idle(small_llm)


def test_regex_choice_and_grammar_match(small_llm):
    sps = ([so(regex=REGEX, seed=i) for i in range(4)]
           + [so(choice=CHOICES, seed=i) for i in range(4)]
           + [so(grammar=EBNF, seed=i) for i in range(4)]
           + [SamplingParams(temperature=0, max_tokens=50,
                             structured_outputs=StructuredOutputsParams(regex=REGEX))])
    outs = [o.outputs[0] for o in small_llm.generate([PROMPT] * len(sps), sps, use_tqdm=False)]
    assert all(c.finish_reason == "stop" for c in outs)
    assert all(re.fullmatch(REGEX, c.text) for c in outs[:4] + outs[12:])
    assert all(c.text in CHOICES for c in outs[4:8])
    assert all(re.fullmatch(EBNF_RE, c.text) for c in outs[8:12])
    assert_idle(small_llm)


def test_parallel_samples_walk_their_own_grammar(small_llm):
    schema = {"type": "object", "required": ["n", "s"],
              "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999},
                             "s": {"type": "string", "pattern": "^[a-z]{3,5}$"}}}
    out = small_llm.generate([PROMPT], so(json=schema, disable_any_whitespace=True, n=3,
                                          seed=7), use_tqdm=False)[0]
    texts = [c.text for c in out.outputs]
    for text in texts:
        jsonschema.validate(json.loads(text), schema)
    assert len(set(texts)) > 1  # three seeded samples: not one output copied
    assert_idle(small_llm)


def test_ignore_eos_still_stops_when_the_grammar_is_complete(small_llm):
    sp = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True,
                        structured_outputs=StructuredOutputsParams(choice=["done"]))
    c = small_llm.generate([PROMPT], sp, use_tqdm=False)[0].outputs[0]
    assert (c.text, c.finish_reason) == ("done", "stop")


@pytest.mark.parametrize("kw, field", [
    (dict(json={"type": "no-such-type"}), "json"),
    (dict(json='{"type": '), "json"),
    (dict(regex="(unclosed"), "regex"),
    (dict(grammar='root ::= undefined_rule'), "grammar"),
])
def test_bad_specs_raise_and_the_engine_serves_on(small_llm, kw, field):
    with pytest.raises(ValueError, match=f"StructuredOutputsParams.{field}"):
        small_llm.add_request(PROMPT, so(**kw))
    with pytest.raises(ValueError, match=f"StructuredOutputsParams.{field}"):
        small_llm.generate([PROMPT, PROMPT], [so(regex="ab"), so(**kw)], use_tqdm=False)
    assert small_llm.is_finished()
    assert small_llm.generate([PROMPT], so(regex="ab"), use_tqdm=False)[0].outputs[0].text == "ab"
    assert_idle(small_llm)


def test_a_compiling_grammar_stalls_no_one(small_llm, monkeypatch):
    """A request whose grammar is still compiling waits; the others run and finish."""
    grammars = small_llm.clients[0].core.grammars
    compile_grammar, release = grammars._compile, threading.Event()

    def slow_compile(key):
        release.wait(30)
        return compile_grammar(key)

    monkeypatch.setattr(grammars, "_compile", slow_compile)
    waiting = small_llm.add_request(PROMPT, so(regex="slow+w?"))
    aborted = small_llm.add_request(PROMPT, so(regex="slow+w?", n=2))
    plain = small_llm.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=5))
    small_llm.abort_request(aborted)  # still compiling: it ends at once
    done = {}
    for _ in range(50):
        done.update((o.request_id, o) for o in small_llm.step()[0])
        if plain in done:
            break
    assert plain in done and waiting not in done
    assert [c.finish_reason for c in done[aborted].outputs] == ["abort", "abort"]
    release.set()
    while waiting not in done:
        done.update((o.request_id, o) for o in small_llm.step()[0])
    assert re.fullmatch("slow+w?", done[waiting].outputs[0].text)
    assert_idle(small_llm)


def test_a_grammar_that_fails_to_compile_ends_its_request_with_an_error(small_llm, monkeypatch):
    grammars = small_llm.clients[0].core.grammars

    def broken(key):
        raise RuntimeError("compiler exploded")

    monkeypatch.setattr(grammars, "_compile", broken)
    bad = small_llm.add_request(PROMPT, so(regex="never+compiled"))
    good = small_llm.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=3))
    done = {}
    while len(done) < 2:
        done.update((o.request_id, o) for o in small_llm.step()[0])
    c = done[bad].outputs[0]
    assert c.finish_reason == "error" and "compiler exploded" in c.stop_reason
    assert done[good].outputs[0].finish_reason == "length"
    monkeypatch.undo()  # the compiler works again: so does the same spec
    again = small_llm.generate([PROMPT], so(regex="never+compiled"), use_tqdm=False)[0]
    assert re.fullmatch("never+compiled", again.outputs[0].text)
    assert_idle(small_llm)


def test_without_xgrammar_a_structured_request_says_how_to_install(small_llm, monkeypatch):
    import sys

    from nanovllm.structured import spec

    spec.to_grammar.cache_clear()
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar now fails
    with pytest.raises(ValueError, match=r"pip install 'nanovllm\[structured\]'"):
        small_llm.generate([PROMPT], so(regex="x+"), use_tqdm=False)
    assert small_llm.generate([PROMPT], SamplingParams(max_tokens=2), use_tqdm=False)
    assert_idle(small_llm)


@pytest.mark.parametrize("speculate", [False, True])
def test_preemption_chunked_prefill_async_scheduling_and_speculation(toy_models, small_llm,
                                                                    speculate):
    """Grammar requests beside plain ones on a tight engine (preemptions, 48-token prefill
    chunks, one step in flight, n-gram speculation or not): grammar outputs stay valid and
    get no drafts; plain greedy outputs equal those of the plain engine."""
    schemas = random_schemas(8, seed=3)
    plain = [[(7 * i + j) % 300 + 3 for j in range(20)] * 2 for i in range(6)]  # n-gram hits
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in small_llm.generate(plain, greedy, use_tqdm=False)]
    llm = LLM(toy_models[MODEL], kvcache_block_size=16, max_model_len=256,
              num_kvcache_blocks=14, max_num_batched_tokens=48, async_scheduling=True,
              speculative_config=NGRAM if speculate else None)
    try:
        sps = [so(json=s, disable_any_whitespace=True, seed=i, max_tokens=150)
               for i, s in enumerate(schemas)]
        sps.insert(3, so(json=schemas[0], disable_any_whitespace=True, n=2, seed=11,
                         max_tokens=150))
        outs = llm.generate(plain + [PROMPT * 3] * len(sps), [greedy] * len(plain) + sps,
                            use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs[:len(plain)]] == want
        for out, sp in zip(outs[len(plain):], sps):
            assert not speculate or out.spec_metrics.num_draft_tokens == 0
            for c in out.outputs:
                assert c.finish_reason == "stop"
                jsonschema.validate(json.loads(c.text), sp.structured_outputs.json)
        sched = llm.clients[0].core.scheduler
        assert sched.num_preemptions > 0 and (sched.spec_stats.accepted > 0) == speculate
        assert_idle(llm)
    finally:
        llm.shutdown()


@pytest.mark.gpu
def test_on_the_gpu_with_graphs_and_async_scheduling(toy_models):
    """The GPU's defaults (bfloat16, CUDA graphs, async scheduling, xgrammar's CUDA mask
    kernel): grammar outputs valid beside plain requests."""
    schemas = random_schemas(50, seed=1)
    llm = LLM(toy_models[MODEL], kvcache_block_size=16, max_model_len=256)
    try:
        assert llm.clients[0].core.async_scheduling
        sps = [so(json=s, disable_any_whitespace=True, seed=i) for i, s in enumerate(schemas)]
        plain = SamplingParams(temperature=0.8, max_tokens=64, ignore_eos=True)
        outs = llm.generate([PROMPT] * 60, sps + [plain] * 10, use_tqdm=False)
        for out, schema in zip(outs, schemas):
            assert out.outputs[0].finish_reason == "stop"
            jsonschema.validate(json.loads(out.outputs[0].text), schema)
        assert all(len(o.outputs[0].token_ids) == 64 for o in outs[50:])
        assert_idle(llm)
    finally:
        llm.shutdown()


def test_async_steps_fill_masks_while_the_forward_runs(toy_models, small_llm, monkeypatch):
    """With one step in flight, a grammar step's forward is queued before the previous
    step's tokens are taken and its masks are filled after: greedy outputs equal those of
    synchronous steps (small_llm), and the late path is what ran."""
    from nanovllm.worker.model_runner import ModelRunner

    late = []
    launch = ModelRunner.launch

    def spy(self, seqs, is_prefill, late_masks=False):
        late.append(late_masks)
        return launch(self, seqs, is_prefill, late_masks)

    monkeypatch.setattr(ModelRunner, "launch", spy)
    schemas = random_schemas(6, seed=5)
    sps = [SamplingParams(temperature=0, max_tokens=120,
                          structured_outputs=StructuredOutputsParams(
                              json=s, disable_any_whitespace=True)) for s in schemas]
    want = [o.outputs[0].token_ids for o in small_llm.generate([PROMPT] * 6, sps, use_tqdm=False)]
    late.clear()
    llm = LLM(toy_models[MODEL], kvcache_block_size=16, max_model_len=256, async_scheduling=True)
    try:
        outs = llm.generate([PROMPT] * 6, sps, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == want
        assert sum(late) > 10 and all(late)  # every step of this batch holds a grammar
        assert_idle(llm)
    finally:
        llm.shutdown()
