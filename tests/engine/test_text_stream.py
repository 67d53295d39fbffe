"""TextStream: the deltas of a completion add up to the engine's full decode, multi-byte
characters are never split, and text that may begin a stop string is held back."""
import random

import pytest

from nanovllm.engine.text_stream import TextStream
from nanovllm.engine.tokenizer import TextDecoder
from nanovllm.utils.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def decoder(toy_models):
    return TextDecoder(load_tokenizer(toy_models["tied_mha_d16"]))


def stream_all(decoder, ids, chunks, stops=None):
    """Feed ids in pieces of the given sizes; returns (deltas, the final piece)."""
    ts, deltas, i = TextStream(decoder.decode, stops), [], 0
    for size in chunks:
        deltas.append(ts.add(ids[i:i + size]))
        i += size
    return deltas, ts.finish(decoder.decode(ids))


@pytest.mark.parametrize("seed", range(6))
def test_deltas_add_up_to_the_full_decode(decoder, seed):
    rng = random.Random(seed)
    # Random ids over the whole vocabulary: byte tokens make broken UTF-8 mid-stream, and
    # special tokens decode to nothing.
    ids = [rng.randrange(len(decoder.tokenizer)) for _ in range(rng.randrange(1, 60))]
    chunks = [rng.randrange(1, 4) for _ in range(len(ids))]
    deltas, last = stream_all(decoder, ids, chunks)
    assert "".join(deltas) + last == decoder.decode(ids)


def test_a_multibyte_character_waits_for_its_last_byte(decoder):
    tok = decoder.tokenizer
    ids = tok.encode("héllo wörld", add_special_tokens=False)
    deltas, last = stream_all(decoder, ids, [1] * len(ids))
    assert "".join(deltas) + last == "héllo wörld"
    assert all("\ufffd" not in d for d in deltas)  # no half character was sent


def test_text_that_may_start_a_stop_string_is_held_back(decoder):
    ids = decoder.tokenizer.encode("The quick brown fox", add_special_tokens=False)
    ts = TextStream(decoder.decode, ["xyz!", "ab"])  # longest stop: 4 -> hold back 3 chars
    sent = "".join(ts.add([t]) for t in ids)
    assert sent == "The quick brown fox"[:-3]
    assert ts.finish("The quick brown f") == "f"  # the final text (cut) decides the rest
