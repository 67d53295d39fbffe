"""Engine configuration and the model's config.json, validated up front."""
import json
import os
from dataclasses import dataclass, field, fields

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM",)
DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
ATTENTION_BACKENDS = ("auto", "flash", "triton", "torch")


@dataclass
class ModelConfig:
    """The fields of a Hugging Face Qwen3 config.json that the engine uses."""

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
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool
    torch_dtype: str
    eos_token_id: int | list[int] | None

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Parse a config.json dict (transformers 4.x or 5.x layout)."""
        archs = d.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(f"unsupported architecture {archs or d.get('model_type')!r}: "
                             f"nanovllm runs {', '.join(SUPPORTED_ARCHITECTURES)}")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        # transformers 5.x moved rope_theta inside rope_parameters.
        theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise ValueError(f"rope type {rope_type!r} is not supported (only default RoPE)")
        heads = d["num_attention_heads"]
        kv_heads = d.get("num_key_value_heads") or heads
        if heads % kv_heads:
            # Grouped-query attention shares each KV head among a whole number of query heads.
            raise ValueError(f"config.json: num_attention_heads={heads} is not a multiple of "
                             f"num_key_value_heads={kv_heads}")
        return cls(
            architecture=arch,
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            vocab_size=d["vocab_size"],
            max_position_embeddings=d.get("max_position_embeddings", 40960),
            rope_theta=float(theta),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            torch_dtype=d.get("torch_dtype") or d.get("dtype") or "bfloat16",
            eos_token_id=d.get("eos_token_id"),
        )

    @classmethod
    def from_pretrained(cls, path: str) -> "ModelConfig":
        """Read <path>/config.json."""
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ValueError(f"{path!r} has no config.json: give a Hugging Face model directory")
        with open(cfg_path) as f:
            return cls.from_dict(json.load(f))


@dataclass
class Config:
    """Everything `LLM(...)` accepts; names and defaults follow nano-vLLM / vLLM."""

    model: str
    max_num_batched_tokens: int = 16384
    max_num_seqs: int = 512
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    kvcache_block_size: int = 256
    num_kvcache_blocks: int = -1
    eos: int | list[int] = -1
    device: str | None = None
    dtype: str = "auto"
    enable_prefix_caching: bool = True
    load_format: str = "auto"
    attention_backend: str = "auto"
    seed: int = 0
    hf_config: ModelConfig = field(init=False, repr=False)

    def __post_init__(self):
        if isinstance(self.model, str):
            self.model = os.path.expanduser(self.model)
        if not isinstance(self.model, str) or not os.path.isdir(self.model):
            raise ValueError(f"model={self.model!r} is not a directory: give the path of a "
                             "Hugging Face model directory (config.json + *.safetensors)")
        self.hf_config = ModelConfig.from_pretrained(self.model)
        self._check_int("max_num_batched_tokens", 1)
        self._check_int("max_num_seqs", 1)
        self._check_int("max_model_len", 2)
        self._check_int("tensor_parallel_size", 1, 8)
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
                              ("attention_backend", ATTENTION_BACKENDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} must be one of {allowed}")
        if self.device is not None and not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device={self.device!r} must be None (auto), 'cpu' or 'cuda'")
        self.max_model_len = min(self.max_model_len, self.hf_config.max_position_embeddings)

    def _check_int(self, name: str, lo: int, hi: int | None = None):
        v = getattr(self, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
            raise ValueError(f"{name}={v!r} must be an integer {rng}")

    @classmethod
    def from_kwargs(cls, model: str, **kwargs) -> "Config":
        """Build a Config, refusing unknown keyword arguments instead of dropping them."""
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown argument(s) {unknown} to LLM(); known: {sorted(known)}")
        return cls(model, **kwargs)
