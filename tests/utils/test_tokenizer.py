"""Carrying the tokenizer to an engine process: PickledTokenizer unpickles it only on use."""
import pickle

from nanovllm.engine.tokenizer import TextDecoder
from nanovllm.sampling_params import SamplingParams
from nanovllm.utils.tokenizer import PickledTokenizer, load_tokenizer, unwrap_tokenizer
from tests.support.decode import check_decode_matches_the_tokenizers


def test_a_shipped_tokenizer_is_unpickled_only_when_text_is_needed(toy_models):
    real = load_tokenizer(toy_models["tied_mha_d16"])
    shipped = pickle.loads(pickle.dumps(PickledTokenizer(real)))  # what the process receives
    assert len(shipped) == len(real) and shipped._tokenizer is None  # len needs no unpickling
    ids = real.encode("The quick brown fox jumps over the lazy dog.")
    stop = SamplingParams(stop=["lazy"])
    assert TextDecoder(shipped).completion_text(ids, stop) == \
        TextDecoder(real).completion_text(ids, stop)
    assert shipped._tokenizer is not None and unwrap_tokenizer(shipped) is shipped._tokenizer
    assert type(unwrap_tokenizer(shipped)) is type(real) and unwrap_tokenizer(real) is real
    # Sent on again (a Ray actor's arguments), it carries the pickle, not the loaded copy.
    assert pickle.loads(pickle.dumps(shipped))._tokenizer is None


def test_decode_matches_the_tokenizers(toy_models):
    check_decode_matches_the_tokenizers(load_tokenizer(toy_models["tied_mha_d16"]))
