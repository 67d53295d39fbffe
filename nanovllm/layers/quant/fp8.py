"""fp8 (e4m3) linear weights: storage, loading (sharded like the weight) and the reference
matmul: on a GPU the Triton kernels of kernels/fp8_gemm.py; elsewhere a reference that
dequantizes to the activation dtype, which is what CI runs and the kernels' test oracle.

Scales are stored in one of two forms: per output row (fp32 [out]; a per-tensor scale is
broadcast to its rows, so packed q/k/v keep their own) or per block (fp32 [ceil(out / bn),
ceil(in / bk)]). Dequantized weight = fp8 value * scale, in both checkpoint formats.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.layers.linear import LinearBase
from nanovllm.layers.weights import (CheckpointTensorError, Placement, check_weight_shape,
                                     copy_placed)

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-row fp8: (e4m3 values, fp32 scales [rows]) with w ~= values * scales."""
    amax = w.float().abs().amax(dim=1)
    # An all-zero row would divide by zero; any positive scale represents it exactly.
    scale = (amax / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    q = (w.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def expand_blocks(scale: torch.Tensor, block: tuple[int, int], rows: int, cols: int):
    """Block scales [..., ceil(rows/bn), ceil(cols/bk)] broadcast to one value per weight
    element [..., rows, cols]."""
    bn, bk = block
    return scale.repeat_interleave(bn, -2)[..., :rows, :].repeat_interleave(bk, -1)[..., :cols]


def dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None):
    """fp32 weight [..., rows, cols] from fp8 values and row scales [..., rows] (block None)
    or block scales (leading dims: experts)."""
    if block is None:
        return weight.float() * scale[..., None]
    return weight.float() * expand_blocks(scale, block, *weight.shape[-2:])


def check_block_placement(p: Placement, block: tuple[int, int], prefix: str, shard) -> None:
    """ValueError unless placement `p` starts on a block boundary and ends on one (or at the
    tensor's end): otherwise one scale would belong to two shards or ranks."""
    b = block[p.dim]
    if p.src % b or p.dst % b or (p.size % b and p.src + p.size != p.full):
        part = "" if shard is None else f" ({shard})"
        if p.size == p.full:  # (the whole part on this rank: its packing, not the split)
            raise ValueError(
                f"{prefix}{part}: block-wise fp8 packs this layer's parts into one matmul, and "
                f"this part starts at row {p.dst}, not a multiple of the {b}-wide scale blocks: "
                "this model's sizes (heads x head_dim, intermediate_size) do not fit the "
                "checkpoint's weight_block_size; use a per-channel fp8 checkpoint, or "
                "quantization='fp8' on the bf16 one")
        raise ValueError(
            f"{prefix}{part}: block-wise fp8 needs every tensor-parallel shard on a {b}-wide "
            f"block boundary, but this rank's slice is [{p.src}, {p.src + p.size}) of "
            f"{p.full} along dim {p.dim} (packed at {p.dst}): use a tensor_parallel_size "
            "that splits it into whole blocks")


def load_input_scale(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """A static activation scale; several (packed shards, experts) keep the largest, which
    keeps every one's activations in range."""
    check_weight_shape(loaded.reshape(-1), (1,))
    param.data.copy_(torch.maximum(param.data, loaded.float().reshape(())))


class Fp8LinearMethod:
    """One linear layer's fp8 weight, its scales and its matmul."""

    def __init__(self, scheme, prefix: str):
        """`scheme`: the model's nanovllm.quant_config.Fp8Scheme; `prefix`: the layer's
        checkpoint name, for error messages."""
        self.scheme, self.prefix = scheme, prefix
        self.block = scheme.block_size if scheme.strategy == "block" else None
        # The scale parameter's name: the checkpoint's (weight_scale_inv / weight_scale).
        self.scale_name = scheme.scale_name or "weight_scale"

    def create_weights(self, layer: LinearBase) -> None:
        """Register fp8 `weight`, its scales and (static activations) `input_scale`."""
        out, inp = layer.out_features, layer.in_features
        layer.weight = self._param(torch.empty(out, inp, dtype=FP8), layer)
        if self.block is None:
            scale = torch.ones(out, dtype=torch.float32)
        else:
            self._check_blocks(layer)
            bn, bk = self.block
            scale = torch.ones(math.ceil(out / bn), math.ceil(inp / bk), dtype=torch.float32)
        layer.register_parameter(self.scale_name, self._param(scale, layer))
        # Quantized at load: the scales come with the weight, not from the checkpoint.
        getattr(layer, self.scale_name).computed = self.scheme.at_load
        if self.scheme.activations == "static":
            layer.input_scale = self._param(torch.zeros((), dtype=torch.float32), layer)

    @staticmethod
    def _param(t: torch.Tensor, layer: LinearBase) -> nn.Parameter:
        p = nn.Parameter(t, requires_grad=False)
        p.weight_loader = layer.weight_loader
        return p

    def _check_blocks(self, layer: LinearBase) -> None:
        """Every shard of this rank must start on a block boundary (and end on one, unless it
        ends the tensor), or its scales would be shared with another shard or rank."""
        for sid in layer.shard_ids():
            check_block_placement(layer.placement(sid), self.block, self.prefix, sid)

    def load(self, layer: LinearBase, param: nn.Parameter, loaded: torch.Tensor,
             p: Placement) -> None:
        """Load the checkpoint tensor `loaded` into `param` (weight, scale or input_scale)."""
        scale = getattr(layer, self.scale_name)
        if param is layer.weight:
            self.load_weight(param, scale, loaded, p)
        elif param is getattr(layer, "input_scale", None):
            load_input_scale(param, loaded)
        else:
            self.load_scale(scale, loaded, p)

    def load_weight(self, weight: torch.Tensor, scale: torch.Tensor, loaded: torch.Tensor,
                    p: Placement) -> None:
        """A checkpoint weight into `weight` (fp8): copied, or quantized per row first when
        the scheme quantizes at load (its scales go to `scale`)."""
        if not self.scheme.at_load:
            if not loaded.is_meta and loaded.dtype != FP8:
                raise CheckpointTensorError(
                    f"has dtype {loaded.dtype}, but quantization_config says fp8 weights "
                    "(float8_e4m3fn)")
            return copy_placed(weight, loaded, p)
        if loaded.is_meta:
            return copy_placed(weight, loaded, p)
        # Rows are quantized whole before the split, so every rank's shard has the scales
        # one rank would use.
        q, row_scale = quantize_rows(loaded)
        copy_placed(weight, q, p)
        copy_placed(scale, row_scale, p)

    def load_scale(self, scale: torch.Tensor, loaded: torch.Tensor, p: Placement) -> None:
        """A checkpoint scale tensor into `scale`, split like the weight it belongs to."""
        if self.block is not None:
            b = self.block[p.dim]
            blocks = Placement(p.dim, math.ceil(p.full / b), p.src // b, p.dst // b,
                               math.ceil(p.size / b))
            return copy_placed(scale, loaded.float(), blocks)
        # Row scales: a per-tensor scale (one value) stands for each of its rows.
        rows = p.full if p.dim == 0 else scale.size(0)
        t = loaded.float().reshape(-1)
        if t.numel() == 1 and self.scheme.strategy == "tensor":
            t = t.expand(rows)
        copy_placed(scale, t, p)

    def gemm_operands(self, layer: LinearBase):
        """(weight, scale, block) as kernels/skinny_gemm.gemm takes them, or None where the
        Triton kernels do not take these scales."""
        from nanovllm.kernels.fp8_gemm import takes  # CPU-only installs may have no triton

        if not takes(self.block):
            return None
        return layer.weight, getattr(layer, self.scale_name), self.block

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None):
        """On a GPU the fp8 Triton GEMM (kernels/fp8_gemm.py); elsewhere the reference:
        dequantize to x's dtype, then a plain matmul."""
        scale = getattr(layer, self.scale_name)
        if x.is_cuda:  # imported here: CPU-only installs may have no triton
            from nanovllm.kernels import fp8_gemm

            if fp8_gemm.takes(self.block):
                return fp8_gemm.fp8_gemm(x, layer.weight, scale, self.block, bias)
        w = dequantize(layer.weight, scale, self.block)
        return F.linear(x, w.to(x.dtype), bias)
