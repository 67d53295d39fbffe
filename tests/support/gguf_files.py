"""Small GGUF files for tests, written with the `gguf` package from a random HF checkpoint.

Written the way llama.cpp's converter writes them (its tensor names, llama's permuted q/k rows,
merged expert tensors), so that transformers' own GGUF loader can serve as the oracle.
"""
import json
import os

import numpy as np
import torch

# llama.cpp architecture name of each HF architecture.
GGUF_ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
             "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3moe"}
_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
          "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
          "mlp.gate": "ffn_gate_inp"}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's converter's q/k row order (rotary halves interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def gguf_tensors(hf_dir: str, cfg: dict) -> dict[str, np.ndarray]:
    """The checkpoint's tensors under llama.cpp's names, fp32."""
    from safetensors.torch import load_file

    sd = {}
    for f in sorted(os.listdir(hf_dir)):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(hf_dir, f)))
    arch = cfg["architectures"][0]
    out, experts = {}, {}
    for name, t in sd.items():
        t = t.float()
        if name in _GLOBAL:
            out[_GLOBAL[name]] = t
            continue
        parts = name.split(".")
        layer, rest = parts[2], ".".join(parts[3:])
        if ".experts." in name:  # model.layers.L.mlp.experts.E.gate_proj.weight
            e, proj = int(parts[5]), parts[6]
            experts.setdefault((layer, proj), {})[e] = t
            continue
        module, kind = rest.rsplit(".", 1)
        if arch == "LlamaForCausalLM" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            heads = cfg["num_attention_heads"] if "q_proj" in module else cfg["num_key_value_heads"]
            t = _permute(t, heads)
        out[f"blk.{layer}.{_LAYER[module]}.{kind}"] = t
    for (layer, proj), by_e in experts.items():
        kind = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                "down_proj": "ffn_down_exps"}[proj]
        out[f"blk.{layer}.{kind}.weight"] = torch.stack([by_e[e] for e in sorted(by_e)])
    return {k: v.numpy() for k, v in out.items()}


def write_gguf(hf_dir: str, path: str, quant: str = "Q8_0", arch_name: str | None = None,
               extra_tensors: dict | None = None, tensor_types: dict | None = None) -> str:
    """hf_dir's checkpoint as a GGUF file: 2-D weights quantized to `quant`, the rest F32.
    arch_name / extra_tensors / tensor_types override what is written (for error tests)."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    arch = arch_name or GGUF_ARCH[cfg["architectures"][0]]
    w = GGUFWriter(path, arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    rope = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_eos_token_id(cfg["eos_token_id"])
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    tensors = gguf_tensors(hf_dir, cfg)
    tensors.update(extra_tensors or {})
    for name, t in tensors.items():
        qtype = (tensor_types or {}).get(name)
        if qtype is None:
            qtype = quant if t.ndim >= 2 else "F32"
        plain = {"F32": np.float32, "I8": np.int8}  # written as they are, typed by numpy
        if qtype in plain:
            w.add_tensor(name, t.astype(plain[qtype]))
        else:
            q = GGMLQuantizationType[qtype]
            w.add_tensor(name, quantize(t, q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
