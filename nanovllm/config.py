"""Engine configuration and the model's config.json, validated up front."""
import json
import os
from dataclasses import dataclass, field, fields

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM",
                           "Qwen3MoeForCausalLM")
# RoPE variants the rotary embedding implements, and the fields each needs from config.json.
ROPE_TYPES = {"default": (), "linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings")}
# Mixture-of-experts fields with no sensible default (Qwen3MoeForCausalLM).
MOE_FIELDS = ("moe_intermediate_size", "num_experts_per_tok")
DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
ATTENTION_BACKENDS = ("auto", "flash", "triton", "torch")
# "auto" stores K/V in the model's dtype; the fp8 kinds store them in 8 bits with per-layer,
# per-kv-head scales ("fp8" is vLLM's name for fp8_e4m3).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# Where data-parallel replicas run: processes of this host ("mp") or Ray actors ("ray").
EXECUTOR_BACKENDS = ("mp", "ray")
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
        archs = d.get("architectures") or []
        if not isinstance(archs, list):
            raise ValueError(f"{source}: architectures={archs!r} must be a list of names, "
                             f"e.g. {list(SUPPORTED_ARCHITECTURES)}")
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(f"{source}: unsupported architecture "
                             f"{archs or d.get('model_type')!r}: nanovllm runs "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)}")
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
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: hidden_act={d['hidden_act']!r} is not supported "
                             "(only 'silu')")
        if d.get("use_sliding_window"):
            raise ValueError(f"{source}: use_sliding_window=true is not supported (nanovllm "
                             "attends over the full context); set it to false")
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


@dataclass(frozen=True)
class Config:
    """Everything `LLM(...)` accepts; names and defaults follow nano-vLLM / vLLM."""

    model: str  # an os.PathLike is accepted and turned into a str
    max_num_batched_tokens: int = 16384
    max_num_seqs: int = 512
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    # Replicas of the whole engine (each with its own tensor-parallel group), requests spread
    # over them; distributed_executor_backend says where they run.
    data_parallel_size: int = 1
    distributed_executor_backend: str = "mp"
    enforce_eager: bool = False
    kvcache_block_size: int = 256
    num_kvcache_blocks: int = -1
    eos: int | list[int] = -1
    device: str | None = None
    dtype: str = "auto"
    enable_prefix_caching: bool = True
    load_format: str = "auto"
    attention_backend: str = "auto"
    kv_cache_dtype: str = "auto"
    seed: int = 0
    skip_tokenizer_init: bool = False
    async_scheduling: bool | None = None
    hf_config: ModelConfig = field(init=False, repr=False)

    def __post_init__(self):
        # Frozen once validated: what the engine learns later (the KV block count, the eos
        # ids) is passed along as results, never written back here.
        model = self.model
        if isinstance(model, (str, os.PathLike)):
            model = os.path.expanduser(os.fspath(model))
        if not isinstance(model, str) or not os.path.isdir(model):
            raise ValueError(f"model={self.model!r} is not a directory: give the path of a "
                             "Hugging Face model directory (config.json + *.safetensors)")
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "hf_config", ModelConfig.from_pretrained(model))
        self._check_int("max_num_batched_tokens", 1)
        self._check_int("max_num_seqs", 1)
        self._check_int("max_model_len", 2)
        self._check_int("tensor_parallel_size", 1, 8)
        self._check_int("data_parallel_size", 1)
        if self.distributed_executor_backend not in EXECUTOR_BACKENDS:
            raise ValueError(f"distributed_executor_backend={self.distributed_executor_backend!r}"
                             f" must be one of {EXECUTOR_BACKENDS} ('mp': replicas are "
                             "processes of this host; 'ray': Ray actors, across machines)")
        bs = self.kvcache_block_size
        if not isinstance(bs, int) or bs < 16 or bs & (bs - 1):
            raise ValueError(f"kvcache_block_size={bs!r} must be a power of two >= 16")
        if not isinstance(self.num_kvcache_blocks, int) or (
            self.num_kvcache_blocks != -1 and self.num_kvcache_blocks < 1
        ):
            raise ValueError(f"num_kvcache_blocks={self.num_kvcache_blocks!r} must be -1 (auto) "
                             "or >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization!r} must be "
                             "in (0, 1]")
        for name, allowed in (("dtype", DTYPES), ("load_format", LOAD_FORMATS),
                              ("attention_backend", ATTENTION_BACKENDS),
                              ("kv_cache_dtype", KV_CACHE_DTYPES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} must be one of {allowed}")
        for name in ("enforce_eager", "enable_prefix_caching", "skip_tokenizer_init"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.device is not None and not (
            isinstance(self.device, str) and (self.device == "cpu" or self.device.startswith("cuda"))
        ):
            raise ValueError(f"device={self.device!r} must be None (auto), 'cpu' or 'cuda'")
        eos = self.eos if isinstance(self.eos, (list, tuple)) else [self.eos]
        if self.eos != -1 and (not eos or any(
                not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in eos)):
            raise ValueError(f"eos={self.eos!r} must be -1 (from the tokenizer and config.json), "
                             "a token id or a list of token ids")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling={self.async_scheduling!r} must be None (on for "
                             "one GPU), True or False")
        if self.async_scheduling and self.tensor_parallel_size > 1:
            raise ValueError("async_scheduling=True is not supported with "
                             "tensor_parallel_size > 1 yet; leave it unset or False")
        self._check_tensor_parallel()
        object.__setattr__(self, "max_model_len",
                           min(self.max_model_len, self.hf_config.max_position_embeddings))

    def _check_tensor_parallel(self) -> None:
        """Every rank holds an equal share of the heads and of the MLP (of each expert's)."""
        hf, n = self.hf_config, self.tensor_parallel_size
        for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size",
                     "moe_intermediate_size"):
            if getattr(hf, name) % n:
                raise ValueError(f"{name}={getattr(hf, name)} is not divisible by "
                                 f"tensor_parallel_size={n}")

    def _check_int(self, name: str, lo: int, hi: int | None = None):
        v = getattr(self, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
            raise ValueError(f"{name}={v!r} must be an integer {rng}")

    @classmethod
    def from_kwargs(cls, model: str | os.PathLike, **kwargs) -> "Config":
        """Build a Config, refusing unknown keyword arguments instead of dropping them."""
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown argument(s) {unknown} to LLM(); known: {sorted(known)}")
        return cls(model, **kwargs)
