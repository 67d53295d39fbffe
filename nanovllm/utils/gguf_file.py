"""GGUF checkpoints (llama.cpp's format): the file's config, tensor index and tokenizer.

No torch here: the config and the tokenizer are read on the control plane; the weights are
dequantized when a model loads them (models/gguf_weights.py). Reading a GGUF's metadata with
`gguf.GGUFReader` takes seconds (it parses the whole vocabulary), so the first start writes
what later starts need to a cache directory keyed by the file's path, size and modification
time: `index.json` (the model config and where each tensor's bytes lie) and the tokenizer
transformers converts from the file. Later starts memory-map the file and read no metadata at
all.
"""
import hashlib
import json
import logging
import os
import shutil

from nanovllm.utils.gguf_config import config_dict

logger = logging.getLogger(__name__)

# Tensor types we dequantize (all through gguf.quants.dequantize).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                   "Q4_K", "Q5_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                   "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS")
# Bump when index.json's layout changes: older caches are then rebuilt, not misread.
INDEX_VERSION = 1

def is_gguf(path: str) -> bool:
    """Whether `path` names a GGUF file (by its name, as vLLM decides)."""
    return path.endswith(".gguf") and os.path.isfile(path)


def find_gguf(path: str) -> str | None:
    """The GGUF file `path` stands for: itself, or the one .gguf in a directory without
    safetensors; None when `path` is a safetensors (or empty) directory."""
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ValueError(f"model={path!r} is a file but not a .gguf file: give a GGUF file "
                             "or a Hugging Face model directory")
        return path
    names = sorted(os.listdir(path))
    ggufs = [n for n in names if n.endswith(".gguf")]
    if not ggufs or any(n.endswith(".safetensors") for n in names):
        return None
    if len(ggufs) > 1:
        raise ValueError(f"{path!r} holds {len(ggufs)} GGUF files ({', '.join(ggufs)}): give the "
                         "path of the one to load")
    return os.path.join(path, ggufs[0])


def cache_root() -> str:
    """Where converted GGUF metadata and tokenizers are kept ($XDG_CACHE_HOME/nanovllm)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nanovllm", "gguf")


def _cache_dir(file: str) -> str:
    """This file's cache directory: a new file at the same path (other size or mtime) gets a
    new one."""
    real = os.path.realpath(file)
    st = os.stat(real)
    key = hashlib.sha256(f"{real}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return os.path.join(cache_root(), f"{os.path.basename(file)[:-5]}-{key}")


def _write_atomically(path: str, write) -> None:
    """Run write(scratch) and move scratch to `path`: a half-written entry never looks done."""
    scratch = f"{path}.{os.getpid()}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write(scratch)
    try:
        os.replace(scratch, path)
    except OSError:  # another process finished first (a directory that is not empty)
        shutil.rmtree(scratch, ignore_errors=True)


class GGUFCheckpoint:
    """One GGUF file: its model config (a config.json dict), tensor index and tokenizer."""

    def __init__(self, file: str):
        self.file = file
        self.cache = _cache_dir(file)
        index = os.path.join(self.cache, "index.json")
        data = None
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                data = json.load(f)
            if data.get("version") != INDEX_VERSION:
                data = None
        if data is None:
            data = _read_index(file)
            _write_atomically(index, lambda p: _dump_json(data, p))
        self.config: dict = data["config"]
        self.tensors: dict[str, dict] = data["tensors"]

    def check_types(self) -> None:
        """Refuse tensor types we cannot dequantize, before any tensor is read."""
        for name, t in self.tensors.items():
            if t["type"] not in SUPPORTED_TYPES:
                raise ValueError(f"{self.file}: tensor {name!r} has GGUF type {t['type']}, "
                                 f"which nanovllm cannot load; supported: "
                                 f"{', '.join(SUPPORTED_TYPES)}")

    def tokenizer_dir(self) -> str:
        """A directory holding the tokenizer transformers converts from this file's metadata
        (chat template included), converted on the first call only."""
        path = os.path.join(self.cache, "tokenizer")
        if not os.path.isdir(path):
            from transformers import AutoTokenizer

            logger.info("converting the tokenizer of %s (cached in %s)", self.file, path)
            try:
                tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(self.file)),
                                                    gguf_file=os.path.basename(self.file))
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ValueError(f"could not build a tokenizer from the metadata of {self.file} "
                                 f"({type(e).__name__}: {e}); pass tokenizer=<a Hugging Face "
                                 "tokenizer directory>") from e
            _write_atomically(path, tok.save_pretrained)
        return path


def _dump_json(data: dict, scratch: str) -> None:
    with open(scratch, "w", encoding="utf-8") as f:
        json.dump(data, f)


def _read_index(file: str) -> dict:
    """Parse the file once with gguf.GGUFReader: the config dict and each tensor's location."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(file)
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise ValueError(f"{file} is not a readable GGUF file ({type(e).__name__}: {e})") from None
    if reader.byte_order != "I":
        raise ValueError(f"{file} is a big-endian GGUF file; nanovllm reads little-endian ones")
    meta = {}
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.ggml.") or key.endswith("_id"):  # skip the vocabulary
            meta[key] = field.contents()
    tensors = {}
    for t in reader.tensors:
        tensors[t.name] = dict(type=t.tensor_type.name, shape=[int(d) for d in reversed(t.shape)],
                               raw=list(t.data.shape), dtype=str(t.data.dtype),
                               offset=int(t.data_offset), nbytes=int(t.data.nbytes))
    return dict(version=INDEX_VERSION, config=config_dict(meta, tensors, file), tensors=tensors)
