"""The grammar service and the bitmask's two halves: a sequence's matcher allows exactly
the tokens its grammar does (also the padding columns of logits wider than the tokenizer's
vocabulary: never), the host builds one bitmask row per logits row, and the sampler's
constrain() puts -inf on exactly the forbidden tokens without touching its input."""
import re

import numpy as np
import pytest
import torch

from nanovllm import StructuredOutputsParams
from nanovllm.engine.sampling_rows import grammar_bitmask
from nanovllm.structured.grammars import Grammars
from nanovllm.utils.tokenizer import load_tokenizer
from nanovllm.worker.sampler import SamplingTensors, constrain

VOCAB = 640  # the toy model's logits width; its tokenizer has 400 tokens


@pytest.fixture(scope="module")
def tokenizer(toy_models):
    return load_tokenizer(toy_models["tied_gqa4_d16_l4"])


@pytest.fixture(scope="module")
def grammars(tokenizer):
    service = Grammars(tokenizer, VOCAB, {tokenizer.eos_token_id})
    yield service
    service.shutdown()


def allowed(mask: np.ndarray, row: int) -> list[int]:
    bits = np.unpackbits(mask[row].view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:VOCAB]).tolist()


def ready(grammar):
    grammar.wait(30)
    assert grammar.ready and grammar.error() is None
    return grammar


def test_a_matcher_allows_exactly_what_its_grammar_does(grammars, tokenizer):
    g = ready(grammars.request(StructuredOutputsParams(choice=["ab", "b"])))
    mask = np.zeros((1, grammars.words), np.int32)
    grammars.fill(mask, [0], [g])
    first = allowed(mask, 0)
    texts = {tokenizer.decode([t]) for t in first}
    assert first and all(t < len(tokenizer) for t in first)  # never a padding column
    assert texts <= {"a", "ab", "b"} and "b" in texts
    assert g.accept(tokenizer.convert_tokens_to_ids("b")) and not g.terminated
    grammars.fill(mask, [0], [g])
    assert allowed(mask, 0) == [tokenizer.eos_token_id]  # complete: only the end token
    assert g.accept(tokenizer.eos_token_id) and g.terminated
    fresh = g.new_sample()  # another sample starts at the beginning
    grammars.fill(mask, [0], [fresh])
    assert allowed(mask, 0) == first
    g.rollback(2)
    grammars.fill(mask, [0], [g])
    assert allowed(mask, 0) == first


def test_same_spec_compiles_once(grammars):
    a = grammars.request(StructuredOutputsParams(regex="[0-9]+"))
    b = grammars.request(StructuredOutputsParams(regex="[0-9]+"))
    assert a._future is b._future and a is not b


class FakeService:
    """Fills a row with exactly its grammar's one token; 13 words: a 400-token vocabulary."""

    words = 13

    def fill(self, mask, rows, grammars):
        for row, g in zip(rows, grammars):
            mask[row] = 0
            mask[row, g.token // 32] = np.int32(np.uint32(1 << (g.token % 32)).view(np.int32))


class FakeGrammar:
    """Allows only token `token`."""

    service = FakeService()

    def __init__(self, token):
        self.token = token


class Seq:
    def __init__(self, grammar=None, finished=False):
        self.grammar, self.is_finished = grammar, finished


def test_grammar_bitmask_rows():
    assert grammar_bitmask([Seq(), Seq()], [0, 1], 2) is None  # free without grammars
    # A verify step: sequence 0 has rows 0-2, sequence 1 (a grammar) row 3.
    mask, flags = grammar_bitmask([Seq(), Seq(FakeGrammar(391))], [0, 3], 4)
    assert mask.shape == (4, 13) and mask.dtype == flags.dtype == np.int32
    assert all(len(allowed(mask, r)) == 13 * 32 for r in range(3))
    assert allowed(mask, 3) == [391] and flags.tolist() == [0, 0, 0, 1]
    # A sequence that ended while a step was in flight (its row is void) is not constrained.
    assert grammar_bitmask([Seq(FakeGrammar(5), finished=True)], [0], 1) is None


def test_constrain_masks_only_forbidden_tokens():
    """Constrained rows lose every token their mask forbids, and the padding ids past the
    mask's 416 columns; the unconstrained row keeps all 640."""
    logits = torch.randn(3, VOCAB)
    raw = logits.clone()
    mask, flags = grammar_bitmask([Seq(FakeGrammar(5)), Seq(), Seq(FakeGrammar(399))],
                                  [0, 1, 2], 3)
    st = SamplingTensors(torch.zeros(3), bitmask=torch.from_numpy(mask),
                         grammar_rows=torch.from_numpy(flags))
    out = constrain(logits, st)
    assert torch.equal(logits, raw)  # the raw logits stay (logprobs read them)
    assert torch.isfinite(out).sum(1).tolist() == [1, VOCAB, 1]
    assert out[0, 5] == raw[0, 5] and out[2, 399] == raw[2, 399]
    assert torch.equal(out[1], raw[1])


def test_padding_ids_are_never_allowed_even_where_anything_goes(grammars, tokenizer):
    """Inside a JSON string almost every token may come next; the ids past the tokenizer's
    vocabulary in the last word xgrammar fills (400..415) stay forbidden although the
    builder's rows start all-allowed (constrain() forbids the columns past the words)."""
    g = ready(grammars.request(StructuredOutputsParams(json={"type": "string"})))
    assert g.accept(tokenizer.convert_tokens_to_ids('"'))
    mask = np.full((2, grammars.words), -1, np.int32)
    grammars.fill(mask, [1], [g])
    inside = allowed(mask, 1)
    assert len(inside) > len(tokenizer) // 2 and max(inside) < len(tokenizer)
    assert allowed(mask, 0) == list(range(32 * grammars.words))  # another row: as it was


def test_large_fills_go_to_threads_and_fill_the_same(grammars, tokenizer, monkeypatch):
    """A fill of fewer than PARALLEL_FILL_WORDS words runs on the calling thread (handing it
    to threads costs more than it saves at small batches), a larger one on xgrammar's
    threads; both write the same masks."""
    from nanovllm.structured import grammars as module

    monkeypatch.setattr(module, "PARALLEL_FILL_WORDS", 3 * grammars.words)
    monkeypatch.setattr(module, "_threads", lambda: 2)
    monkeypatch.setattr(grammars, "_serial", None)
    monkeypatch.setattr(grammars, "_parallel", None)
    specs = [dict(json={"type": "string"}), dict(regex="[a-c]+x"), dict(choice=["ab", "b"])]
    gs = [ready(grammars.request(StructuredOutputsParams(**kw))) for kw in specs]
    assert gs[0].accept(tokenizer.convert_tokens_to_ids('"'))
    two = np.full((3, grammars.words), -1, np.int32)
    grammars.fill(two, [2, 0], gs[:2])
    assert grammars._serial is not None and grammars._parallel is None
    three = np.full((3, grammars.words), -1, np.int32)
    grammars.fill(three, [2, 0, 1], gs)
    assert grammars._parallel is not None
    assert np.array_equal(three[[2, 0]], two[[2, 0]])
    first = {tokenizer.decode([t]) for t in allowed(three, 0)}  # the regex's first tokens
    assert set("abc") <= first and all(re.fullmatch("[a-c]+x?", t) for t in first)
    assert len(allowed(three, 2)) > len(tokenizer) // 2 and allowed(three, 1) != allowed(two, 1)
