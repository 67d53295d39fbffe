"""The grammar service and the bitmask's two halves: a sequence's matcher allows exactly
the tokens its grammar does (also the padding columns of logits wider than the tokenizer's
vocabulary: never), the host builds one bitmask row per logits row, and the sampler's
constrain() puts -inf on exactly the forbidden tokens without touching its input."""
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
    mask = np.zeros((1, VOCAB // 32), np.int32)
    g.fill(mask, 0)
    first = allowed(mask, 0)
    texts = {tokenizer.decode([t]) for t in first}
    assert first and all(t < len(tokenizer) for t in first)  # never a padding column
    assert texts <= {"a", "ab", "b"} and "b" in texts
    assert g.accept(tokenizer.convert_tokens_to_ids("b")) and not g.terminated
    g.fill(mask, 0)
    assert allowed(mask, 0) == [tokenizer.eos_token_id]  # complete: only the end token
    assert g.accept(tokenizer.eos_token_id) and g.terminated
    fresh = g.new_sample()  # another sample starts at the beginning
    fresh.fill(mask, 0)
    assert allowed(mask, 0) == first
    g.rollback(2)
    g.fill(mask, 0)
    assert allowed(mask, 0) == first


def test_same_spec_compiles_once(grammars):
    a = grammars.request(StructuredOutputsParams(regex="[0-9]+"))
    b = grammars.request(StructuredOutputsParams(regex="[0-9]+"))
    assert a._future is b._future and a is not b


class FakeGrammar:
    """Allows only token `token`."""

    def __init__(self, token):
        self.token = token

    def fill(self, mask, row):
        mask[row] = 0
        mask[row, self.token // 32] = np.int32(np.uint32(1 << (self.token % 32)).view(np.int32))


class Seq:
    def __init__(self, grammar=None):
        self.grammar = grammar


def test_grammar_bitmask_rows():
    assert grammar_bitmask([Seq(), Seq()], [0, 1], 2, VOCAB) is None  # free without grammars
    # A verify step: sequence 0 has rows 0-2, sequence 1 (a grammar) row 3.
    mask = grammar_bitmask([Seq(), Seq(FakeGrammar(631))], [0, 3], 4, VOCAB)
    assert mask.shape == (4, VOCAB // 32) and mask.dtype == np.int32
    assert all(len(allowed(mask, r)) == VOCAB for r in range(3))
    assert allowed(mask, 3) == [631]


def test_constrain_masks_only_forbidden_tokens():
    logits = torch.randn(3, VOCAB)
    raw = logits.clone()
    mask = grammar_bitmask([Seq(FakeGrammar(5)), Seq(), Seq(FakeGrammar(639))], [0, 1, 2], 3,
                           VOCAB)
    st = SamplingTensors(torch.zeros(3), bitmask=torch.from_numpy(mask))
    out = constrain(logits, st)
    assert torch.equal(logits, raw)  # the raw logits stay (logprobs read them)
    assert torch.isfinite(out).sum(1).tolist() == [1, VOCAB, 1]
    assert out[0, 5] == raw[0, 5] and out[2, 639] == raw[2, 639]
    assert torch.equal(out[1], raw[1])


def test_padding_ids_are_never_allowed_even_where_anything_goes(grammars, tokenizer):
    """Inside a JSON string almost every token may come next; the ids past the tokenizer's
    vocabulary (400..639: part of the last word xgrammar fills, and the words after it)
    stay forbidden although the builder's rows start all-allowed."""
    g = ready(grammars.request(StructuredOutputsParams(json={"type": "string"})))
    assert g.accept(tokenizer.convert_tokens_to_ids('"'))
    mask = np.full((2, VOCAB // 32), -1, np.int32)
    g.fill(mask, 1)
    inside = allowed(mask, 1)
    assert len(inside) > len(tokenizer) // 2 and max(inside) < len(tokenizer)
    assert allowed(mask, 0) == list(range(VOCAB))  # another row is left as it was
