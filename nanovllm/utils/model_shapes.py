"""The config.json of well-known checkpoints, shapes only, for benchmarks with random weights
(load_format="dummy"): `bench.py --model-shape NAME`; Qwen3-8B's with a Qwen3-0.6B draft for
`tools/bench_spec.py`; dummy_model_dir writes one to a directory."""
import json
import os
import tempfile

from nanovllm.utils.toy import QWEN3_0_6B, save_tokenizer

# name -> (architecture, config.json fields over the tiny defaults of nanovllm.utils.toy)
SHAPES = {
    "qwen3-0.6b": ("Qwen3ForCausalLM", dict(QWEN3_0_6B, eos_token_id=151645)),
    "qwen3-8b": ("Qwen3ForCausalLM", dict(
        QWEN3_0_6B, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, tie_word_embeddings=False, eos_token_id=151645)),
    "qwen2.5-0.5b": ("Qwen2ForCausalLM", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        eos_token_id=151645)),
    "llama-3.2-1b": ("LlamaForCausalLM", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
        rope_theta=None, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=8192),
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000,
        eos_token_id=128001)),
    "smollm2-135m": ("LlamaForCausalLM", dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2)),
    "qwen3-30b-a3b": ("Qwen3MoeForCausalLM", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], vocab_size=151936, max_position_embeddings=40960,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        eos_token_id=151645)),
}


def shape_config(name: str) -> dict:
    """The bf16 config.json dict of shape `name` (a key of SHAPES)."""
    from nanovllm.utils.toy import config_dict

    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}")
    arch, fields = SHAPES[name]
    return config_dict(arch, **fields, torch_dtype="bfloat16")


def dummy_model_dir(shape: str = "qwen3-0.6b") -> str:
    """config.json of a known model's shape (bf16) + a small tokenizer; weights come from
    load_format='dummy'."""
    config = shape_config(shape)
    path = os.path.join(tempfile.gettempdir(), f"nanovllm-{shape}-dummy")
    cfg_path = os.path.join(path, "config.json")
    if os.path.isfile(cfg_path):
        with open(cfg_path) as f:
            if json.load(f) == config:
                return path
    os.makedirs(path, exist_ok=True)
    save_tokenizer(path)
    with open(cfg_path, "w") as f:  # last: a directory with a config.json is complete
        json.dump(config, f, indent=1)
    return path


def linear_shapes(name: str, tp: int = 1) -> dict[str, tuple[int, int]]:
    """(N, K) of each dense linear layer of shape `name` on one of `tp` ranks: qkv, o,
    gate_up and down (MoE: the router instead) and lm_head; y = x[M, K] @ W[N, K]^T."""
    cfg = shape_config(name)
    hidden = cfg["hidden_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    inter = cfg["intermediate_size"]
    shapes = {"qkv": ((heads + 2 * kv_heads) * head_dim // tp, hidden),
              "o": (hidden, heads * head_dim // tp)}
    if "num_experts" not in cfg:
        shapes.update(gate_up=(2 * inter // tp, hidden), down=(hidden, inter // tp))
    else:  # the router (replicated); the experts are fused-MoE kernels, not linear layers
        shapes["router"] = (cfg["num_experts"], hidden)
    shapes["lm_head"] = (-(-cfg["vocab_size"] // tp), hidden)
    return shapes
