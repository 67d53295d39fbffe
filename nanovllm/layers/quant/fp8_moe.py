"""fp8 (e4m3) expert weights of a FusedMoE layer: w13 [E, 2I/tp, H] and w2 [E, H, I/tp] in
fp8 with per-expert scales (rows or blocks, as Fp8LinearMethod). On a GPU the fused MoE
kernel reads them as fp8 (kernel_operands); elsewhere the reference dequantizes every expert
before the plain-torch fused MoE."""
import math

import torch
from torch import nn

from nanovllm.layers.quant.fp8 import (FP8, Fp8LinearMethod, check_block_placement, dequantize,
                                       load_input_scale)
from nanovllm.layers.weights import Placement


class Fp8MoEMethod(Fp8LinearMethod):
    """One FusedMoE layer's fp8 experts; loads each expert's slice like a linear layer's."""

    def create_weights(self, layer) -> None:
        """Register fp8 w13_weight / w2_weight, their scales and (static) input scales."""
        e, n, h = layer.num_experts, layer.inter, layer.hidden_size
        layer.w13_weight = self._param(torch.empty(e, 2 * n, h, dtype=FP8), layer)
        layer.w2_weight = self._param(torch.empty(e, h, n, dtype=FP8), layer)
        for name, (rows, cols) in (("w13", (2 * n, h)), ("w2", (h, n))):
            if self.block is None:
                shape = (e, rows)
            else:
                shape = (e, math.ceil(rows / self.block[0]), math.ceil(cols / self.block[1]))
            scale = self._param(torch.ones(shape, dtype=torch.float32), layer)
            scale.computed = self.scheme.at_load
            layer.register_parameter(f"{name}_{self.scale_name}", scale)
            if self.scheme.activations == "static":
                layer.register_parameter(f"{name}_input_scale", self._param(
                    torch.zeros((), dtype=torch.float32), layer))
        if self.block is not None:
            for half in (0, 1):
                check_block_placement(self.placement(layer, True, half), self.block,
                                      f"{self.prefix} (w13)", ("gate", "up")[half])
            check_block_placement(self.placement(layer, False, None), self.block,
                                  f"{self.prefix} (w2)", None)

    @staticmethod
    def placement(layer, w13: bool, half) -> Placement:
        """Where an expert's checkpoint tensor goes in its [rows, cols] slice of w13 / w2."""
        n = layer.inter
        if w13:  # gate_proj / up_proj [I, H]: this rank's rows, into the gate or the up half
            return Placement(0, n * layer.tp_size, layer.tp_rank * n, half * n, n)
        return Placement(1, n * layer.tp_size, layer.tp_rank * n, 0, n)  # down_proj [H, I]

    def load(self, layer, param: nn.Parameter, loaded: torch.Tensor, shard: tuple) -> None:
        """An expert's weight, scale or input scale; shard = (expert, 0 gate | 1 up | None)."""
        expert, half = shard
        name = next(k for k, v in layer.named_parameters(recurse=False) if v is param)
        w13 = name.startswith("w13")
        if name.endswith("input_scale"):
            return load_input_scale(param, loaded)
        p = self.placement(layer, w13, half)
        scale = getattr(layer, f"{'w13' if w13 else 'w2'}_{self.scale_name}")
        if name.endswith("_weight"):
            return self.load_weight(param.data[expert], scale.data[expert], loaded, p)
        self.load_scale(scale.data[expert], loaded, p)

    def kernel_operands(self, layer):
        """(w13, w2, w13 scales, w2 scales, block) for kernels/triton_moe.fused_moe, which
        reads the fp8 experts as they are; None where its tiles cannot take these scales."""
        from nanovllm.kernels.fp8_gemm import takes  # CPU-only installs may have no triton

        if not takes(self.block):
            return None
        return (layer.w13_weight, layer.w2_weight, getattr(layer, f"w13_{self.scale_name}"),
                getattr(layer, f"w2_{self.scale_name}"), self.block)

    def weights(self, layer, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Every expert's w13 and w2, dequantized to `dtype` (the reference path)."""
        w13 = dequantize(layer.w13_weight, getattr(layer, f"w13_{self.scale_name}"), self.block)
        w2 = dequantize(layer.w2_weight, getattr(layer, f"w2_{self.scale_name}"), self.block)
        return w13.to(dtype), w2.to(dtype)
