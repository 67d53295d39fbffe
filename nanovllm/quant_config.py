"""Quantized-weight schemes: a checkpoint's `quantization_config` (or `LLM(quantization=...)`)
parsed into one small description the model builder hands to each linear layer.

Torch-free on purpose, like model_config.py: the front end validates config.json without torch.

Supported (everything else is a ValueError naming what is):
- quant_method "fp8" (Qwen's *-FP8 checkpoints, DeepSeek's layout): e4m3 `weight` plus fp32
  `weight_scale_inv` per weight_block_size block (the factor that dequantizes: w = q * s), or
  without weight_block_size one fp32 `weight_scale` per tensor (AutoFP8).
- quant_method "compressed-tensors" (llm-compressor), format "float-quantized": one config group
  of 8-bit float weights, strategy "tensor", "channel" or "block", `weight_scale` (w = q * s);
  activations dynamic per token, static per tensor (`input_scale`) or none (W8A16).
- LLM(quantization="fp8") on an unquantized checkpoint: per-output-channel scales computed at
  load (dynamic), as vLLM does.
"""
import re
from dataclasses import dataclass

# LLM(quantization=...) values besides None.
QUANTIZATIONS = ("fp8",)
QUANT_METHODS = ("fp8", "compressed-tensors")
STRATEGIES = ("tensor", "channel", "block")


@dataclass(frozen=True)
class Fp8Scheme:
    """How a model's linear weights are stored: e4m3 values and fp32 dequantization scales."""

    # "tensor" | "channel" (one scale per output row) | "block" (one per block_size block)
    strategy: str
    # The checkpoint's scale tensor name beside each `weight` ("" when computed at load).
    scale_name: str
    # (rows, columns) of a block for strategy "block", else None.
    block_size: tuple[int, int] | None = None
    # "dynamic" (per token at run time), "static" (the checkpoint's input_scale) or "none"
    # (weight-only, W8A16). The CPU reference keeps activations in their dtype either way.
    activations: str = "dynamic"
    # Module names (or "re:<regex>") left unquantized, in the checkpoint's names.
    ignore: tuple[str, ...] = ()
    # Quantize a float checkpoint while loading (LLM(quantization="fp8")).
    at_load: bool = False

    def quantizes(self, module: str) -> bool:
        """Whether the checkpoint module `module` (e.g. model.layers.0.self_attn.q_proj) is fp8."""
        for pat in self.ignore:
            if pat.startswith("re:"):
                if re.fullmatch(pat[3:], module):
                    return False
            elif module == pat or module.endswith("." + pat):
                return False
        return True


DYNAMIC_FP8 = Fp8Scheme(strategy="channel", scale_name="", at_load=True)


def _names(q: dict, key: str, source: str) -> tuple[str, ...]:
    v = q.get(key) or []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise ValueError(f"{source}: quantization_config.{key}={v!r} must be a list of "
                         "module names")
    return tuple(v)


def _fp8(q: dict, source: str) -> Fp8Scheme:
    """quant_method "fp8": block-wise with weight_scale_inv, or per-tensor weight_scale."""
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"{source}: quantization_config.fmt={fmt!r} is not supported (only "
                         "'e4m3')")
    act = q.get("activation_scheme", "dynamic")
    if act not in ("dynamic", "static"):
        raise ValueError(f"{source}: quantization_config.activation_scheme={act!r} must be "
                         "'dynamic' or 'static'")
    ignore = (_names(q, "ignored_layers", source) + _names(q, "modules_to_not_convert", source))
    block = q.get("weight_block_size")
    if block is None:
        return Fp8Scheme("tensor", "weight_scale", activations=act, ignore=ignore)
    if (not isinstance(block, list) or len(block) != 2
            or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in block)):
        raise ValueError(f"{source}: quantization_config.weight_block_size={block!r} must be "
                         "two integers >= 1, e.g. [128, 128]")
    if act != "dynamic":
        raise ValueError(f"{source}: quantization_config.activation_scheme={act!r} with "
                         "weight_block_size is not supported (block-wise fp8 quantizes "
                         "activations dynamically); use 'dynamic'")
    return Fp8Scheme("block", "weight_scale_inv", tuple(block), "dynamic", ignore)


def _ct_weights(w: dict, where: str) -> tuple[str, tuple[int, int] | None]:
    """A compressed-tensors group's `weights` args -> (strategy, block size or None)."""
    if not isinstance(w, dict):
        raise ValueError(f"{where}.weights must be a JSON object")
    if w.get("type") != "float" or w.get("num_bits") != 8:
        raise ValueError(f"{where}.weights: type={w.get('type')!r}, num_bits="
                         f"{w.get('num_bits')!r} is not supported (only 8-bit 'float', fp8)")
    if w.get("symmetric", True) is not True or w.get("dynamic", False) is not False:
        raise ValueError(f"{where}.weights: only symmetric, static weight scales are supported")
    strategy = w.get("strategy")
    if strategy not in STRATEGIES:
        raise ValueError(f"{where}.weights.strategy={strategy!r} is not supported; nanovllm "
                         f"reads {', '.join(STRATEGIES)}")
    if strategy != "block":
        return strategy, None
    block = w.get("block_structure")
    if (not isinstance(block, list) or len(block) != 2
            or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in block)):
        raise ValueError(f"{where}.weights.block_structure={block!r} must be two integers "
                         ">= 1, e.g. [128, 128]")
    return strategy, tuple(block)


def _ct_activations(a, where: str) -> str:
    """A compressed-tensors group's `input_activations` -> "none", "dynamic" or "static"."""
    if a is None:
        return "none"
    if not isinstance(a, dict) or a.get("type") != "float" or a.get("num_bits") != 8:
        raise ValueError(f"{where}.input_activations must be null (W8A16) or 8-bit 'float' "
                         "(W8A8 fp8)")
    if a.get("dynamic"):
        return "dynamic"
    if a.get("strategy", "tensor") != "tensor":
        raise ValueError(f"{where}.input_activations: static strategy "
                         f"{a.get('strategy')!r} is not supported (only 'tensor')")
    return "static"


def _compressed_tensors(q: dict, source: str) -> Fp8Scheme:
    """quant_method "compressed-tensors", float-quantized fp8 with one config group."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise ValueError(f"{source}: quantization_config.config_groups must hold exactly one "
                         f"group, got {len(groups) if isinstance(groups, dict) else groups!r}")
    (name, g), = groups.items()
    where = f"{source}: quantization_config.config_groups.{name}"
    if not isinstance(g, dict):
        raise ValueError(f"{where} must be a JSON object")
    # Newer compressed-tensors may give the format per group instead of at the top.
    fmt = q.get("format") or g.get("format")
    if fmt != "float-quantized":
        raise ValueError(f"{source}: quantization_config.format={fmt!r} is not supported "
                         "(compressed-tensors: only 'float-quantized', fp8)")
    targets = g.get("targets")
    if targets != ["Linear"]:
        raise ValueError(f"{where}.targets={targets!r} is not supported (only ['Linear'])")
    strategy, block = _ct_weights(g.get("weights"), where)
    act = _ct_activations(g.get("input_activations"), where)
    return Fp8Scheme(strategy, "weight_scale", block, act, _names(q, "ignore", source))


def parse_quantization_config(q, source: str = "config.json") -> Fp8Scheme:
    """config.json's quantization_config -> the scheme; a ValueError names what is supported."""
    if not isinstance(q, dict):
        raise ValueError(f"{source}: quantization_config={q!r} must be a JSON object")
    method = q.get("quant_method")
    if method == "fp8":
        return _fp8(q, source)
    if method == "compressed-tensors":
        return _compressed_tensors(q, source)
    raise ValueError(f"{source}: quantization_config.quant_method={method!r} is not "
                     f"supported; nanovllm reads {', '.join(QUANT_METHODS)} (fp8 weights)")


def resolve_quantization(requested: str | None,
                         checkpoint: Fp8Scheme | None) -> Fp8Scheme | None:
    """The scheme the model is built with: the checkpoint's own, or LLM(quantization="fp8")
    quantizing a float checkpoint at load, or None."""
    if requested is not None and requested not in QUANTIZATIONS:
        raise ValueError(f"quantization={requested!r} must be None (the checkpoint's own) or "
                         f"one of {QUANTIZATIONS}")
    return checkpoint or (DYNAMIC_FP8 if requested == "fp8" else None)
