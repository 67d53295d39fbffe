"""The model's config.json: the fields the engine uses, type-checked up front."""
import json
import os
from dataclasses import dataclass

from nanovllm.models import ARCHITECTURES
from nanovllm.quant_config import Fp8Scheme, parse_quantization_config

# The registry's names: config.json is refused before any model is built.
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)
# RoPE variants the rotary embedding implements, and the fields each needs from config.json.
ROPE_TYPES = {"default": (), "linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings")}
# Mixture-of-experts fields with no sensible default (Qwen3MoeForCausalLM).
MOE_FIELDS = ("moe_intermediate_size", "num_experts_per_tok")
# config.json fields with no sensible default: without them the model's shape is unknown.
REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "vocab_size")


def _positive_int(d: dict, name: str, source: str) -> int | None:
    """d[name] as an integer >= 1, or None when absent or null."""
    v = d.get(name)
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise ValueError(f"{source}: {name}={v!r} must be an integer >= 1")
    return v


def _positive_float(d: dict, name: str, source: str) -> float | None:
    """d[name] as a number > 0, or None when absent or null."""
    v = d.get(name)
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
        raise ValueError(f"{source}: {name}={v!r} must be a number > 0")
    return float(v)


def _flag(d: dict, name: str, source: str) -> bool:
    """d[name] as a boolean, False when absent or null."""
    v = d.get(name)
    if v is not None and not isinstance(v, bool):
        raise ValueError(f"{source}: {name}={v!r} must be true or false")
    return bool(v)


def _eos_token_id(d: dict, source: str) -> int | list[int] | None:
    v = d.get("eos_token_id")
    ids = v if isinstance(v, list) else [] if v is None else [v]
    if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in ids):
        raise ValueError(f"{source}: eos_token_id={v!r} must be a token id >= 0, a list of "
                         "them, or null")
    return v


def _rope_scaling(rope: dict, source: str) -> dict | None:
    """The RoPE variant from rope_parameters / rope_scaling: None for default RoPE, else its
    type and the fields ROPE_TYPES lists for it."""
    rope_type = rope.get("rope_type", rope.get("type")) or "default"
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{source}: rope type {rope_type!r} is not supported; nanovllm "
                         f"implements {', '.join(ROPE_TYPES)}")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{source}: partial_rotary_factor={rope['partial_rotary_factor']!r} "
                         "is not supported (only 1.0: RoPE over the whole head)")
    if rope_type == "default":
        return None
    missing = [k for k in ROPE_TYPES[rope_type] if rope.get(k) is None]
    if missing:
        raise ValueError(f"{source}: rope type {rope_type!r} needs {', '.join(missing)} in "
                         "rope_parameters (or rope_scaling)")
    out = {"rope_type": rope_type}
    for k in ROPE_TYPES[rope_type]:
        out[k] = _positive_float(rope, k, source)
    if rope_type == "llama3" and out["low_freq_factor"] >= out["high_freq_factor"]:
        raise ValueError(f"{source}: llama3 RoPE needs low_freq_factor < high_freq_factor, "
                         f"got {out['low_freq_factor']} and {out['high_freq_factor']}")
    return out


def _moe_fields(d: dict, source: str) -> dict:
    """The mixture-of-experts fields of a Qwen3-MoE config.json, checked."""
    missing = [k for k in MOE_FIELDS if d.get(k) is None]
    # transformers 5.x writes num_experts as num_local_experts.
    num_experts = (_positive_int(d, "num_experts", source)
                   or _positive_int(d, "num_local_experts", source))
    if num_experts is None:
        missing.append("num_experts")
    if missing:
        raise ValueError(f"{source} lacks required mixture-of-experts field(s) "
                         f"{', '.join(missing)}")
    top_k = _positive_int(d, "num_experts_per_tok", source)
    if top_k > num_experts:
        raise ValueError(f"{source}: num_experts_per_tok={top_k} must be at most "
                         f"num_experts={num_experts}")
    layers = d.get("mlp_only_layers") or []
    if not isinstance(layers, list) or any(
            not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in layers):
        raise ValueError(f"{source}: mlp_only_layers={layers!r} must be a list of layer "
                         "indices >= 0")
    return dict(num_experts=num_experts, num_experts_per_tok=top_k,
                moe_intermediate_size=_positive_int(d, "moe_intermediate_size", source),
                norm_topk_prob=_flag(d, "norm_topk_prob", source),
                decoder_sparse_step=_positive_int(d, "decoder_sparse_step", source) or 1,
                mlp_only_layers=tuple(layers))


def _architecture(d: dict, source: str) -> str:
    """The first supported name in `architectures`; a ValueError listing ours if none is."""
    archs = d.get("architectures") or []
    if not isinstance(archs, list):
        raise ValueError(f"{source}: architectures={archs!r} must be a list of names, "
                         f"e.g. {list(SUPPORTED_ARCHITECTURES)}")
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"{source}: unsupported architecture "
                         f"{archs or d.get('model_type')!r}: nanovllm runs "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    return arch


def _refuse_unsupported(d: dict, source: str) -> None:
    """ValueError for the config features our layers do not implement."""
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{source}: hidden_act={d['hidden_act']!r} is not supported "
                         "(only 'silu')")
    if d.get("use_sliding_window"):
        raise ValueError(f"{source}: use_sliding_window=true is not supported (nanovllm "
                         "attends over the full context); set it to false")


@dataclass
class ModelConfig:
    """The fields of a Hugging Face config.json (SUPPORTED_ARCHITECTURES) the engine uses."""

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    # None for default RoPE, else {"rope_type": ..., and that type's fields (ROPE_TYPES)}.
    rope_scaling: dict | None
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool
    torch_dtype: str
    eos_token_id: int | list[int] | None
    mlp_bias: bool = False
    # Mixture of experts (0 experts: a dense model).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # fp8 linear weights (quantization_config, or LLM(quantization="fp8")); None: unquantized.
    quantization: Fp8Scheme | None = None

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer `layer` has a sparse MoE block (else a dense MLP), as HF
        decides it: not in mlp_only_layers and every decoder_sparse_step-th layer."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @classmethod
    def from_dict(cls, d: dict, source: str = "config.json") -> "ModelConfig":
        """Parse a config.json dict (transformers 4.x or 5.x layout).

        Every field is type-checked here, so a bad file fails with a ValueError naming `source`
        and the field instead of deep inside model construction.
        """
        if not isinstance(d, dict):
            raise ValueError(f"{source} must hold a JSON object {{...}}, not a JSON "
                             f"{type(d).__name__}")
        arch = _architecture(d, source)
        missing = [name for name in REQUIRED_FIELDS if d.get(name) is None]
        if missing:
            raise ValueError(f"{source} lacks required field(s) {', '.join(missing)}")
        # transformers 5.x keeps rope_theta and the scaling inside rope_parameters; 4.x has
        # rope_theta at top level and the scaling (or null) in rope_scaling.
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise ValueError(f"{source}: rope_parameters={rope!r} must be a JSON object")
        theta = (_positive_float(d, "rope_theta", source)
                 or _positive_float(rope, "rope_theta", source) or 10000.0)
        _refuse_unsupported(d, source)
        hidden = _positive_int(d, "hidden_size", source)
        heads = _positive_int(d, "num_attention_heads", source)
        kv_heads = _positive_int(d, "num_key_value_heads", source) or heads
        if heads % kv_heads:
            # Grouped-query attention shares each KV head among a whole number of query heads.
            raise ValueError(f"{source}: num_attention_heads={heads} is not a multiple of "
                             f"num_key_value_heads={kv_heads}")
        dtype = d.get("torch_dtype") or d.get("dtype") or "bfloat16"
        if not isinstance(dtype, str):
            raise ValueError(f"{source}: torch_dtype={dtype!r} must be a string such as "
                             "'bfloat16'")
        return cls(
            architecture=arch,
            hidden_size=hidden,
            intermediate_size=_positive_int(d, "intermediate_size", source),
            num_hidden_layers=_positive_int(d, "num_hidden_layers", source),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=_positive_int(d, "head_dim", source) or hidden // heads,
            vocab_size=_positive_int(d, "vocab_size", source),
            max_position_embeddings=_positive_int(d, "max_position_embeddings", source) or 40960,
            rope_theta=theta,
            rope_scaling=_rope_scaling(rope, source),
            rms_norm_eps=_positive_float(d, "rms_norm_eps", source) or 1e-6,
            tie_word_embeddings=_flag(d, "tie_word_embeddings", source),
            attention_bias=_flag(d, "attention_bias", source),
            mlp_bias=_flag(d, "mlp_bias", source),
            torch_dtype=dtype,
            eos_token_id=_eos_token_id(d, source),
            **(_moe_fields(d, source) if arch == "Qwen3MoeForCausalLM" else {}),
            quantization=(None if d.get("quantization_config") is None
                          else parse_quantization_config(d["quantization_config"], source)),
        )

    @classmethod
    def from_pretrained(cls, path: str) -> "ModelConfig":
        """Read <path>/config.json; a file that is not JSON raises a ValueError naming it."""
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ValueError(f"{path!r} has no config.json: give a Hugging Face model directory")
        try:
            with open(cfg_path, encoding="utf-8") as f:
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{cfg_path} is not valid JSON: {e.msg} at line {e.lineno}, "
                             f"column {e.colno}") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{cfg_path} is not UTF-8 text ({e.reason} at byte "
                             f"{e.start})") from None
        return cls.from_dict(d, source=cfg_path)
