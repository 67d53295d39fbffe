"""A GGUF file's tensors under Hugging Face's names, dequantized by the `gguf` package to
float32 (the loader then copies them into the model's dtype, as from safetensors)."""
import functools
import os
import re
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from nanovllm.utils.gguf_file import GGUFCheckpoint

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


def gguf_weights(ckpt: GGUFCheckpoint,
                 read_data: bool = True) -> Iterator[tuple[str, list[int], object]]:
    """(Hugging Face name, shape, read) of every tensor; read() -> the dequantized tensor
    (None for a tensor the model does not know). A mixture-of-experts tensor is split
    into one entry per expert."""
    entries = list(_entries(ckpt, np.memmap(ckpt.file, mode="r") if read_data else None))
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


def _entries(ckpt: GGUFCheckpoint, mm) -> Iterator[tuple[str, list[int], object]]:
    """gguf_weights()'s entries, read() reading from the memory map `mm`."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    arch = ckpt.config["architectures"][0]
    heads = ckpt.config["num_attention_heads"]
    kv_heads = ckpt.config["num_key_value_heads"]

    def read(t: dict) -> torch.Tensor:
        raw = mm[t["offset"]: t["offset"] + t["nbytes"]].view(t["dtype"]).reshape(t["raw"])
        # np.array: dequantize returns a view of the read-only map for F32 tensors.
        return torch.from_numpy(np.array(dequantize(raw, GGMLQuantizationType[t["type"]]),
                                         dtype=np.float32))

    for gname, t in ckpt.tensors.items():
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
