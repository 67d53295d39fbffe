"""GGUF checkpoints (llama.cpp's format): config, tensors and tokenizer from one .gguf file.

Weights are dequantized at load time, by the `gguf` package, to the model's dtype; the model
then runs as if loaded from safetensors. Reading a GGUF's metadata with `gguf.GGUFReader` takes
seconds (it parses the whole vocabulary), so the first start writes what later starts need to
a cache directory keyed by the file's path, size and modification time: `index.json` (the
model config and where each tensor's bytes lie) and the tokenizer transformers converts from
the file. Later starts memory-map the file and read no metadata at all.
"""
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from nanovllm.utils.gguf_config import config_dict

logger = logging.getLogger(__name__)

# Tensor types we dequantize (all through gguf.quants.dequantize).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                   "Q4_K", "Q5_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                   "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS")
# Bump when index.json's layout changes: older caches are then rebuilt, not misread.
INDEX_VERSION = 1

# llama.cpp's per-layer tensor names (after "blk.N.") -> Hugging Face's (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "ffn_gate_inp": "mlp.gate",
}
# Mixture-of-experts tensors: one GGUF tensor holds every expert's matrix (leading dim).
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj",
                 "ffn_down_exps": "down_proj"}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


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
    """One GGUF file: its model config (a config.json dict), tensors and tokenizer."""

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

    def weights(self, read_data: bool = True) -> Iterator[tuple[str, list[int], object]]:
        """(Hugging Face name, shape, read) of every tensor; read() -> the dequantized tensor
        (None for a tensor the model does not know). A mixture-of-experts tensor is split
        into one entry per expert."""
        entries = list(self._entries(np.memmap(self.file, mode="r") if read_data else None))
        if not read_data:
            yield from entries
            return
        # Dequantizing is numpy work that releases the GIL: a few tensors ahead on a thread
        # pool use every core (2 cores: ~1.7x), holding only a few tensors at once.
        workers = min(4, os.cpu_count() or 1)
        ahead: dict[int, Future] = {}
        with ThreadPoolExecutor(workers) as pool:
            for i, (name, shape, read) in enumerate(entries):
                for j in range(i, min(i + 2 * workers, len(entries))):
                    if j not in ahead and entries[j][2] is not None:
                        ahead[j] = pool.submit(entries[j][2])
                yield name, shape, None if read is None else ahead.pop(i).result

    def _entries(self, mm) -> Iterator[tuple[str, list[int], object]]:
        """weights()'s entries, read() reading from the memory map `mm`."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        arch = self.config["architectures"][0]
        heads = self.config["num_attention_heads"]
        kv_heads = self.config["num_key_value_heads"]

        def read(t: dict) -> torch.Tensor:
            raw = mm[t["offset"]: t["offset"] + t["nbytes"]].view(t["dtype"]).reshape(t["raw"])
            # np.array: dequantize returns a view of the read-only map for F32 tensors.
            return torch.from_numpy(np.array(dequantize(raw, GGMLQuantizationType[t["type"]]),
                                             dtype=np.float32))

        for gname, t in self.tensors.items():
            hname, experts = _hf_name(gname)
            if hname is None:
                yield gname, t["shape"], None  # unknown: the loader reports it as unused
            elif experts:
                whole = functools.cache(lambda t=t: read(t))  # one dequantization per tensor
                lock = threading.Lock()  # ... even when the pool asks for two experts at once

                def expert(e, whole=whole, lock=lock):
                    with lock:
                        return whole()[e]

                for e in range(t["shape"][0]):
                    yield hname.format(e), t["shape"][1:], functools.partial(expert, e)
            else:
                permute = None
                if arch == "LlamaForCausalLM" and gname.startswith("blk."):
                    # llama.cpp stores llama's q/k rows permuted for its rotary layout: undo it.
                    permute = {"attn_q": heads, "attn_k": kv_heads}.get(gname.split(".")[2])

                def load(t=t, permute=permute):
                    x = read(t)
                    return x if permute is None else _unpermute(x, permute)

                yield hname, t["shape"], load

    def load_tokenizer(self):
        """The tokenizer transformers converts from this file's metadata (chat template
        included), cached after the first conversion."""
        from transformers import AutoTokenizer

        path = os.path.join(self.cache, "tokenizer")
        if not os.path.isdir(path):
            logger.info("converting the tokenizer of %s (cached in %s)", self.file, path)
            try:
                tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(self.file)),
                                                    gguf_file=os.path.basename(self.file))
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ValueError(f"could not build a tokenizer from the metadata of {self.file} "
                                 f"({type(e).__name__}: {e}); pass tokenizer=<a Hugging Face "
                                 "tokenizer directory>") from e
            _write_atomically(path, tok.save_pretrained)
        return AutoTokenizer.from_pretrained(path)


def _dump_json(data: dict, scratch: str) -> None:
    with open(scratch, "w", encoding="utf-8") as f:
        json.dump(data, f)


def _hf_name(gname: str) -> tuple[str | None, bool]:
    """GGUF tensor name -> (Hugging Face name, with "{}" for the expert if it holds experts)."""
    if gname in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gname], False
    m = _LAYER_TENSOR.match(gname)
    if m is None:
        return None, False
    layer, part, kind = m.groups()
    if part in _EXPERT_NAMES and kind == "weight":
        return f"model.layers.{layer}.mlp.experts.{{}}.{_EXPERT_NAMES[part]}.weight", True
    if part in _LAYER_NAMES:
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}", False
    return None, False


def _unpermute(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """Invert llama.cpp's q/k permutation: within each head, its converter interleaves the two
    rotary halves (rows i and i + d/2 become rows 2i and 2i + 1); put them back in halves."""
    rows = x.shape[0]
    return x.reshape(n_head, rows // n_head // 2, 2, *x.shape[1:]).transpose(1, 2).reshape(
        x.shape)


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
