"""Engine configuration (`Config`), validated up front.

The model's config.json (or a GGUF file's metadata) is parsed by
`nanovllm.model_config.ModelConfig`, re-exported here.
"""
import math
import os
from dataclasses import dataclass, field, fields, replace

from nanovllm.generation_config import GenerationDefaults, load_generation_defaults
from nanovllm.model_config import ModelConfig
from nanovllm.quant_config import resolve_quantization
from nanovllm.spec_config import SpeculativeConfig

__all__ = ["ATTENTION_BACKENDS", "DTYPES", "EXECUTOR_BACKENDS", "KV_CACHE_DTYPES", "LOAD_FORMATS",
           "Config", "ModelConfig"]

DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
ATTENTION_BACKENDS = ("auto", "flash", "triton", "torch")
# "auto" stores K/V in the model's dtype; the fp8 kinds store them in 8 bits with per-layer,
# per-kv-head scales ("fp8" is vLLM's name for fp8_e4m3); "int8" as integer codes with a scale
# per token and kv head (TensorRT-LLM's and LMDeploy's name).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")
# The piecewise graphs' default reach where they are on (Config.prefill_graph_tokens): a
# mixed step of 256 decodes and a 2048-token chunk fits.
STREAMING_PREFILL_GRAPH_TOKENS = 2560
# ... and LLM.generate's: short prompts (a single sequence, a chat turn) replay graphs, while
# its big batched prefill steps stay eager, where graphs gained nothing (vLLM V1 captures its
# piecewise graphs up to 512 tokens too). H100, batch 1 with a 32-token prompt
# (`bench.py --single`): 1,117 / 1,127 tok/s against 1,093 / 1,088 eager (Qwen3-0.6B).
OFFLINE_PREFILL_GRAPH_TOKENS = 512

# The LM head's optional second copy (Config.lm_head_quantization).
LM_HEAD_QUANTIZATIONS = (None, "int8")

# Where data-parallel replicas run: processes of this host ("mp") or Ray actors ("ray").
EXECUTOR_BACKENDS = ("mp", "ray")


@dataclass(frozen=True)
class Config:
    """Everything `LLM(...)` accepts; names and defaults follow nano-vLLM / vLLM."""

    # A model directory, a .gguf file (or a directory holding one) or a hub id; an
    # os.PathLike is accepted. Resolved to a local path: the directory or the .gguf file.
    model: str
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
    # fp8 linear weights: None uses the checkpoint's own quantization_config (if any); "fp8"
    # also quantizes a float checkpoint at load (per-output-channel scales).
    quantization: str | None = None
    # "int8": the LM head also read as int8 codes (scales per row and block of up to 128
    # columns) by steps of up to 16 rows, where reading it is a large share of a decode step;
    # larger steps keep the checkpoint's head. None: the checkpoint's head only.
    lm_head_quantization: str | None = None
    seed: int = 0
    skip_tokenizer_init: bool = False
    async_scheduling: bool | None = None
    # The tokenizer's directory or hub id (None: the model's; a GGUF file's own metadata).
    tokenizer: str | None = None
    # generation_config.json's default sampling values and end ids: "auto" (the model's),
    # "none", or a directory holding one.
    generation_config: str = "auto"
    # Speculative decoding, vLLM's dict ({"method": "ngram", "num_speculative_tokens": 4,
    # ...}); parsed into a SpeculativeConfig. None: off.
    speculative_config: SpeculativeConfig | dict | None = None
    # Mixed steps (chunked-prefill piggybacking, as vLLM V1 and SGLang schedule): a step
    # decodes every running sequence and computes prompt chunks in the budget left over. They
    # replay piecewise graphs (prefill_graph_tokens). Off by default: on the HTTP benchmark
    # they have not measured better than separate steps (docs/PERF_NOTES.md, 2026-11-25).
    enable_mixed_steps: bool = False
    # Most prompt tokens a step that also decodes computes. None: max_num_batched_tokens for
    # batch generation (LLM.generate: throughput), 2048 for a streaming front end (AsyncLLM,
    # the server: time per output token; engine/scheduler.py says why).
    max_mixed_prefill_tokens: int | None = None
    # Prefill and mixed steps of up to this many tokens replay piecewise CUDA graphs (all
    # but attention, captured per bucketed token count: worker/piecewise_graph.py); 0: they
    # run eagerly. None: STREAMING_PREFILL_GRAPH_TOKENS for a streaming front end (AsyncLLM,
    # the server, chat: prompts arrive one by one, and an eager prefill step stalls every
    # stream) or with mixed steps on; OFFLINE_PREFILL_GRAPH_TOKENS for LLM.generate (its big
    # prefill steps gain nothing; short prompts do).
    prefill_graph_tokens: int | None = None
    hf_config: ModelConfig = field(init=False, repr=False)
    generation_defaults: GenerationDefaults = field(init=False, repr=False)

    def __post_init__(self):
        # Frozen once validated: what the engine learns later (the KV block count, the eos
        # ids) is passed along as results, never written back here.
        self._resolve_model()
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
        if self.max_mixed_prefill_tokens is not None:
            self._check_int("max_mixed_prefill_tokens", 1)
        if self.prefill_graph_tokens is not None:
            self._check_int("prefill_graph_tokens", 0, 16384)
        self._check_lm_head_quantization()
        for name in ("enforce_eager", "enable_prefix_caching", "skip_tokenizer_init",
                     "enable_mixed_steps"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.device is not None and not (
            isinstance(self.device, str)
            and (self.device == "cpu" or self.device.startswith("cuda"))
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
        object.__setattr__(self, "hf_config", replace(self.hf_config, quantization=(
            resolve_quantization(self.quantization, self.hf_config.quantization))))
        self._check_tensor_parallel()
        if self.speculative_config is not None:
            spec = SpeculativeConfig.from_dict(self.speculative_config)
            if spec.method == "draft_model" and self.tensor_parallel_size > 1:
                raise ValueError("speculative_config: method 'draft_model' with "
                                 "tensor_parallel_size > 1 is not supported yet; use 'ngram'")
            object.__setattr__(self, "speculative_config", spec)
        object.__setattr__(self, "max_model_len",
                           min(self.max_model_len, self.hf_config.max_position_embeddings))

    def _resolve_model(self) -> None:
        """model, tokenizer -> local paths; hf_config and generation defaults read from them."""
        from nanovllm.utils.gguf_file import GGUFCheckpoint, find_gguf
        from nanovllm.utils.hub import resolve_model_path

        model = self.model
        if not isinstance(model, (str, os.PathLike)):
            raise ValueError(f"model={model!r} must be a path or a Hugging Face hub id")
        model = resolve_model_path(os.fspath(model))
        gguf = find_gguf(model)
        if self.load_format == "gguf" and gguf is None:
            raise ValueError(f"load_format='gguf' but {model!r} is neither a .gguf file nor a "
                             "directory holding one")
        if self.load_format == "safetensors" and gguf is not None:
            raise ValueError(f"load_format='safetensors' but {model!r} is a GGUF checkpoint; "
                             "use load_format='auto' or 'gguf'")
        if gguf is not None:
            model, ckpt = gguf, GGUFCheckpoint(gguf)
            ckpt.check_types()
            hf_config = ModelConfig.from_dict(ckpt.config, source=gguf)
        else:
            hf_config = ModelConfig.from_pretrained(model)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "hf_config", hf_config)
        tokenizer = self.tokenizer
        if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
            raise ValueError(f"tokenizer={tokenizer!r} must be None (the model's), a tokenizer "
                             "directory or a hub id")
        tokenizer = model if tokenizer is None else resolve_model_path(os.fspath(tokenizer),
                                                                       "tokenizer")
        object.__setattr__(self, "tokenizer", tokenizer)
        folder = os.path.dirname(model) if gguf is not None else model
        object.__setattr__(self, "generation_defaults",
                           load_generation_defaults(self.generation_config, folder))

    def _check_lm_head_quantization(self) -> None:
        """lm_head_quantization is None or "int8", and int8 needs whole 16-column blocks."""
        value = self.lm_head_quantization
        if value not in LM_HEAD_QUANTIZATIONS:
            raise ValueError(f"lm_head_quantization={value!r} must be one of "
                             f"{LM_HEAD_QUANTIZATIONS} (None: the checkpoint's LM head)")
        hidden = self.hf_config.hidden_size
        if value == "int8" and hidden % 16:
            raise ValueError(f"lm_head_quantization='int8' needs a hidden_size divisible by 16, "
                             f"not {hidden}; leave it None for this model")

    def _check_tensor_parallel(self) -> None:
        """Every rank holds an equal share of the heads and of the MLP (of each expert's)."""
        hf, n = self.hf_config, self.tensor_parallel_size
        for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size",
                     "moe_intermediate_size"):
            if getattr(hf, name) % n:
                raise ValueError(f"{name}={getattr(hf, name)} is not divisible by "
                                 f"tensor_parallel_size={n}")
        scheme = hf.quantization
        if scheme is not None and scheme.block_size is not None and n > 1:
            # Each rank's slice of a block-quantized weight must hold whole scale blocks: the
            # output rows of q, k, v, gate, up (blocks of bn), the input columns of o, down (bk).
            bn, bk = scheme.block_size
            heads, kv = hf.num_attention_heads * hf.head_dim, hf.num_key_value_heads * hf.head_dim
            dense = any(not hf.is_moe_layer(i) for i in range(hf.num_hidden_layers))
            parts = [("num_attention_heads x head_dim", heads, math.lcm(bn, bk)),
                     ("num_key_value_heads x head_dim", kv, bn),
                     ("intermediate_size", hf.intermediate_size if dense else 0,
                      math.lcm(bn, bk)),
                     ("moe_intermediate_size", hf.moe_intermediate_size, math.lcm(bn, bk))]
            for name, size, block in parts:
                if (size // n) % block:
                    raise ValueError(
                        f"{name}={size} split over tensor_parallel_size={n} gives {size // n} "
                        f"per rank, not a multiple of the fp8 weight_block_size "
                        f"{list(scheme.block_size)}: use a tensor_parallel_size that keeps "
                        "whole blocks on each rank")

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
