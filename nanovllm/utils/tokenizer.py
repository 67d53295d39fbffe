"""Loading a tokenizer, once, on the front side (a GGUF file's comes from its metadata,
through the GGUF reader, which brings torch in), and carrying it to an engine process."""
import logging
import os
import pickle
import subprocess
import sys

logger = logging.getLogger(__name__)

# Files a Hugging Face tokenizer is loaded from; a directory without any of them would give
# an empty tokenizer (transformers does not complain) that turns every prompt into nothing.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def load_tokenizer(path: str, in_child: bool = False):
    """AutoTokenizer from a model directory (or a GGUF file's metadata), with a clear error
    when it is missing; a directory's comes from tokenizer_cache.py after its first load.
    in_child: a first load runs AutoTokenizer in a child interpreter (load_in_child), for a
    load beside a GPU engine's warm-up."""
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
    # Once this process has imported AutoTokenizer, loading here is the cheaper.
    tokenizer = load_in_child(path) if in_child and AUTO_MODULE not in sys.modules else None
    if tokenizer is not None and len(tokenizer) > 1:
        tokenizer_cache.store(path, tokenizer)
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


# A child's whole job: AutoTokenizer, its pickle on stdout. Torch is hidden from it
# (transformers then imports none: ~1 s of imports instead of ~3 s, more on a cold disk); a
# tokenizer uses none, and its pickle is byte-identical to an in-process load's.
_CHILD = ("import pickle, sys\n"
          "sys.modules['torch'] = None\n"
          "from transformers import AutoTokenizer\n"
          "tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])\n"
          "sys.stdout.buffer.write(pickle.dumps(tokenizer, pickle.HIGHEST_PROTOCOL))\n")
AUTO_MODULE = "transformers.models.auto.tokenization_auto"


def gpu_host() -> bool:
    """Whether this host has an NVIDIA GPU, from its device node (no torch import): where a
    start-up compiles kernels beside the tokenizer's load, so load_in_child pays."""
    return os.path.exists("/dev/nvidiactl")


def load_in_child(path: str, timeout: float = 600.0):
    """AutoTokenizer.from_pretrained(path) run in a child interpreter and unpickled here, or
    None on any failure (the caller then loads in-process, which raises the clear error).

    Why: AutoTokenizer's first load imports transformers' modeling and generation code,
    torch._dynamo, scipy, sklearn and pandas: ~11 s of Python on a fresh H100 host, holding
    the GIL on the thread that loads the tokenizer beside the engine's warm-up, whose
    compiles and Python then ran ~3x slower (kernel warm-up 11.8-17.1 s against 4.1-5.1 s
    once the tokenizer cache had the entry; docs/PERF_NOTES.md, thirtieth session). In a
    child those imports run on another core; unpickling here imports only the tokenizer's
    own class."""
    if not sys.executable:
        return None
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            logger.debug("loading the tokenizer in a child failed: %s",
                         done.stderr.decode(errors="replace")[-2000:])
            return None
        return pickle.loads(done.stdout)
    except Exception as e:  # any failure only costs the in-process path
        logger.debug("loading the tokenizer in a child failed: %r", e)
        return None


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
