"""A GGUF file's metadata as the Hugging Face config.json dict the engine reads (no torch)."""

# general.architecture -> the Hugging Face architecture we run it as.
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                      "qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM"}


def config_dict(meta: dict, tensors: dict, source: str) -> dict:
    """A Hugging Face config.json dict from GGUF metadata (and which tensors exist)."""
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{source}: GGUF architecture {arch!r} is not supported; nanovllm "
                         f"loads GGUF files of {', '.join(GGUF_ARCHITECTURES)}")
    if "rope_freqs.weight" in tensors:
        raise ValueError(f"{source}: per-frequency RoPE factors (rope_freqs, e.g. Llama 3.1's "
                         "llama3 RoPE) are not supported from GGUF; load the safetensors "
                         "checkpoint instead")

    def get(key: str, default=None):
        return meta.get(f"{arch}.{key}", default)

    kv_heads = get("attention.head_count_kv")
    if isinstance(kv_heads, list):
        raise ValueError(f"{source}: a different KV head count per layer is not supported")
    embed = tensors.get("token_embd.weight", {}).get("shape", [None])
    d = dict(architectures=[GGUF_ARCHITECTURES[arch]], hidden_size=get("embedding_length"),
             intermediate_size=get("feed_forward_length"), num_hidden_layers=get("block_count"),
             num_attention_heads=get("attention.head_count"), num_key_value_heads=kv_heads,
             head_dim=get("attention.key_length"), vocab_size=get("vocab_size", embed[0]),
             max_position_embeddings=get("context_length"), rope_theta=get("rope.freq_base"),
             rms_norm_eps=get("attention.layer_norm_rms_epsilon"),
             tie_word_embeddings="output.weight" not in tensors,
             attention_bias="blk.0.attn_q.bias" in tensors,
             mlp_bias="blk.0.ffn_gate.bias" in tensors, torch_dtype="bfloat16",
             eos_token_id=_eos_ids(meta))
    scaling = get("rope.scaling.type")
    if scaling not in (None, "none"):
        d["rope_scaling"] = {"rope_type": scaling, "factor": get("rope.scaling.factor")}
    if arch == "qwen3moe":
        layers = d["num_hidden_layers"] or 0
        d.update(num_experts=get("expert_count"), num_experts_per_tok=get("expert_used_count"),
                 moe_intermediate_size=get("expert_feed_forward_length"),
                 # llama.cpp's qwen3moe always renormalizes the top-k routing weights.
                 norm_topk_prob=True, decoder_sparse_step=1,
                 mlp_only_layers=[i for i in range(layers)
                                  if f"blk.{i}.ffn_gate_exps.weight" not in tensors])
        d["intermediate_size"] = d["intermediate_size"] or d["moe_intermediate_size"]
    return {k: v for k, v in d.items() if v is not None or k == "eos_token_id"}


def _eos_ids(meta: dict) -> int | list[int] | None:
    """The end-of-sequence token, plus llama.cpp's end-of-turn tokens where the file has them."""
    ids = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    ids = list(dict.fromkeys(int(i) for i in ids if i is not None))
    return None if not ids else ids[0] if len(ids) == 1 else ids
