"""Loading a tokenizer, once, on the front side (a GGUF file's comes from its metadata,
through the GGUF reader, which brings torch in), and carrying it to an engine process."""
import os
import pickle

# Files a Hugging Face tokenizer is loaded from; a directory without any of them would give
# an empty tokenizer (transformers does not complain) that turns every prompt into nothing.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def load_tokenizer(path: str):
    """AutoTokenizer from a model directory (or a GGUF file's metadata), with a clear error
    when it is missing; a directory's comes from tokenizer_cache.py after its first load."""
    from nanovllm.utils import tokenizer_cache
    from nanovllm.utils.gguf_file import GGUFCheckpoint, is_gguf

    if is_gguf(path):
        path = GGUFCheckpoint(path).tokenizer_dir()
    hint = ("add the tokenizer files of this model, or pass skip_tokenizer_init=True and give "
            "prompts as token ids")
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise ValueError(f"{path!r} has no tokenizer: none of {', '.join(TOKENIZER_FILES)} is "
                         f"there; {hint}")
    tokenizer = tokenizer_cache.load_cached(path)
    if tokenizer is not None:
        return tokenizer
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"could not load a tokenizer from {path!r} ({e}); {hint}") from e
    if len(tokenizer) <= 1:
        raise ValueError(f"the tokenizer in {path!r} is empty ({len(tokenizer)} tokens); {hint}")
    tokenizer_cache.store(path, tokenizer)
    return tokenizer


class PickledTokenizer:
    """A tokenizer sent to an engine process as its pickle and unpickled there on first use.
    Unpickling a Hugging Face tokenizer imports transformers, ~1 s of CPU that made up a third
    of an engine process's start (AsyncLLM, the server, each data-parallel replica); a core
    needs the tokenizer only for a stop string or a grammar, and pays it then, once."""

    def __init__(self, tokenizer):
        self._pickle = pickle.dumps(tokenizer)
        self._len = len(tokenizer)  # known without unpickling: TextDecoder and Grammars ask
        self._tokenizer = None

    def __len__(self) -> int:
        return self._len

    def __getattr__(self, name: str):
        # Only the tokenizer's own attributes (decode, eos_token_id...); this object's are
        # missing only while pickle restores it, which must not unpickle the tokenizer.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.get(), name)

    def get(self):
        """The tokenizer itself (unpickled on the first call)."""
        if self._tokenizer is None:
            self._tokenizer = pickle.loads(self._pickle)
        return self._tokenizer

    def __getstate__(self) -> dict:
        return {"_pickle": self._pickle, "_len": self._len, "_tokenizer": None}


def unwrap_tokenizer(tokenizer):
    """The tokenizer itself, for code that checks its type (xgrammar)."""
    return tokenizer.get() if isinstance(tokenizer, PickledTokenizer) else tokenizer
