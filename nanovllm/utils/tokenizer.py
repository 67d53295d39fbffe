"""Loading a tokenizer, once, on the front side (a GGUF file's comes from its metadata,
through the GGUF reader, which brings torch in)."""
import os

# Files a Hugging Face tokenizer is loaded from; a directory without any of them would give
# an empty tokenizer (transformers does not complain) that turns every prompt into nothing.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def load_tokenizer(path: str):
    """AutoTokenizer from a model directory (or a GGUF file's metadata), with a clear error
    when it is missing."""
    from transformers import AutoTokenizer

    from nanovllm.utils.gguf_file import GGUFCheckpoint, is_gguf

    if is_gguf(path):
        return GGUFCheckpoint(path).load_tokenizer()
    hint = ("add the tokenizer files of this model, or pass skip_tokenizer_init=True and give "
            "prompts as token ids")
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise ValueError(f"{path!r} has no tokenizer: none of {', '.join(TOKENIZER_FILES)} is "
                         f"there; {hint}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"could not load a tokenizer from {path!r} ({e}); {hint}") from e
    if len(tokenizer) <= 1:
        raise ValueError(f"the tokenizer in {path!r} is empty ({len(tokenizer)} tokens); {hint}")
    return tokenizer
