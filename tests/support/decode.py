"""A check shared by the toy and the real tokenizers' tests."""
import random

from nanovllm.engine.tokenizer import TextDecoder


def check_decode_matches_the_tokenizers(tokenizer, seed=0):
    """TextDecoder.decode gives tokenizer.decode's text (skipping special tokens, dropping
    ids past the vocabulary), and skips transformers' wrapper only where it adds nothing."""
    rng, text, n = random.Random(seed), TextDecoder(tokenizer), len(tokenizer)
    for _ in range(200):
        ids = [rng.randrange(n + 3) for _ in range(rng.randrange(1, 6))]
        assert text.decode(ids) == tokenizer.decode([t for t in ids if t < n],
                                                     skip_special_tokens=True)
    wrapped = getattr(tokenizer, "clean_up_tokenization_spaces", True) is not False
    assert (text._decode == tokenizer.decode) == wrapped
