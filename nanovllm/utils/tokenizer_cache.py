"""A disk cache of loaded Hugging Face tokenizers, so a start-up after the first unpickles one
instead of going through AutoTokenizer.

Why: `from transformers import AutoTokenizer` imports tokenization_auto, which (transformers
5.17) pulls in modeling_auto, generation, torch._dynamo, scipy, sklearn and pandas. On the
H100 host that took ~11 s of a fresh process, all of it Python holding the GIL on the thread
that loads the tokenizer beside the engine's warm-up, so the warm-up's Python ran slowly too:
`LLM(...)` with warm kernel caches took 16.2 / 17.0 s with a tokenizer and 8.4 / 7.7 s
without (docs/PERF_NOTES.md, twenty-fifth session). Unpickling the same tokenizer imports only
its own class's module (1.7-2.1 s there, no torch._dynamo). The engine already relies on a
tokenizer's pickle being the same tokenizer: that is how engine processes get theirs.

The key covers what the loaded tokenizer depends on: the directory's absolute path, the bytes
of every file in it that is not a weight file, and the transformers and tokenizers versions.
A directory keeps one entry: storing a new one (its files changed) removes the older.
A first load beside a GPU engine's start-up runs in a child interpreter with torch hidden
(utils/tokenizer.load_in_child): its imports then take another core instead of the GIL that
the warm-up's compiles need: H200, emptied caches, 12.5 / 10.8 s against 18.4 / 19.5 s
in-process. (An earlier try on an H100, torch visible to the child: 12.5 / 16.9 s against
15.3 / 15.3 s, no clear gain.)

NANOVLLM_TOKENIZER_CACHE: "0" turns the cache off; a path puts it there (default
$XDG_CACHE_HOME/nanovllm/tokenizers, or ~/.cache/...). The files are pickles this library
wrote, trusted as Triton's and torch's caches of compiled code are.
"""
import contextlib
import hashlib
import logging
import os
import pickle
import tempfile

logger = logging.getLogger(__name__)

CACHE_ENV = "NANOVLLM_TOKENIZER_CACHE"
# Files no tokenizer reads (weights): left out of the key, so it stays cheap to compute.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx",
                   ".ckpt")
HASH_MAX_BYTES = 64 << 20  # a larger non-weight file enters the key by size and mtime only


def cache_dir() -> str | None:
    """Where cached tokenizers live, or None when the cache is off."""
    value = os.environ.get(CACHE_ENV, "")
    if value == "0":
        return None
    if value:
        return value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nanovllm", "tokenizers")


def cache_key(path: str) -> str | None:
    """The key of the tokenizer that AutoTokenizer would load from directory `path` (None when
    the versions it depends on cannot be read)."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256()
    try:
        for package in ("transformers", "tokenizers"):
            h.update(f"{package}={version(package)}\n".encode())
    except PackageNotFoundError:
        return None
    path = os.path.abspath(path)
    h.update(f"{path}\n".encode())
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.endswith(WEIGHT_SUFFIXES) or not os.path.isfile(full):
            continue
        st = os.stat(full)
        h.update(f"{name}\n{st.st_size}\n".encode())
        if st.st_size > HASH_MAX_BYTES:
            h.update(f"{st.st_mtime_ns}\n".encode())
            continue
        with open(full, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def _file(path: str) -> str | None:
    """The entry's file: <hash of the path>-<key>.pkl, so the entries of one directory are
    known by their prefix (store() keeps only the newest)."""
    root = cache_dir()
    if root is None:
        return None
    key = cache_key(path)
    if key is None:
        return None
    where = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:16]
    return os.path.join(root, f"{where}-{key}.pkl")


def load_cached(path: str):
    """The tokenizer cached for directory `path`, or None (none cached, cache off, or a file
    that does not unpickle: it is then loaded and written again)."""
    try:
        file = _file(path)
        if file is None or not os.path.isfile(file):
            return None
        with open(file, "rb") as f:
            return pickle.load(f)
    except Exception as e:  # any failure only costs the slow path
        logger.debug("tokenizer cache: could not read the entry for %s: %r", path, e)
        return None


def store(path: str, tokenizer) -> None:
    """Cache the tokenizer loaded from directory `path` (atomically: a concurrent reader sees
    a whole file or none). Failures (a read-only home, an unpicklable tokenizer) are logged
    and otherwise ignored."""
    try:
        file = _file(path)
        if file is None:
            return
        os.makedirs(os.path.dirname(file), exist_ok=True)
        data = pickle.dumps(tokenizer)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(file), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, file)
        except BaseException:
            os.unlink(tmp)
            raise
        # The same directory's older entries (its files changed since): never read again.
        root, name = os.path.split(file)
        prefix = name.split("-", 1)[0] + "-"
        for old in os.listdir(root):
            if old.startswith(prefix) and old.endswith(".pkl") and old != name:
                with contextlib.suppress(OSError):  # a concurrent store removed it first
                    os.remove(os.path.join(root, old))
    except Exception as e:
        logger.debug("tokenizer cache: could not store the tokenizer of %s: %r", path, e)

