"""Linear layers sharded for tensor parallelism (vLLM's names and sharding math).

Each layer says where a checkpoint tensor's slice goes (`placement`); the weight, its bias and
a quantized layer's scales all load through that one description, so they split alike.
"""
import functools
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nanovllm.layers import fp8_rows, split_k
from nanovllm.layers.weights import Placement, copy_placed
from nanovllm.utils.dist import tp_rank, tp_size


def _divide(a: int, b: int) -> int:
    # Config validated divisibility by tensor_parallel_size already: this is an invariant.
    assert a % b == 0, f"{a} is not divisible by {b}"
    return a // b


@functools.cache
def skinny_gemm_enabled() -> bool:
    """NANOVLLM_SKINNY_GEMM: 1 (default) lets few-row matmuls on a GPU take the skinny Triton
    GEMM where it beats cuBLAS; 0 keeps cuBLAS for every bf16/fp16 weight (fp8 weights have no
    cuBLAS path and always take the Triton kernels). Read once per process."""
    value = os.environ.get("NANOVLLM_SKINNY_GEMM", "1")
    if value not in ("0", "1"):
        raise ValueError(f"NANOVLLM_SKINNY_GEMM={value!r}: use 1 (the skinny Triton GEMM for "
                         "decode-sized matmuls) or 0 (cuBLAS only)")
    return value == "1"


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """x @ weight.T (+ bias) for a plain (unquantized) weight: F.linear, or on a GPU the skinny
    Triton GEMM or the GEMV (kernels/gemv.takes_plain: one or two rows, four for small o / down
    projections) when x has few rows and the shape is one where it was measured faster, and
    the TMA GEMM (kernels/tma_gemm.py) at batched-decode sizes, 17-256 rows."""
    if x.is_cuda and weight.dtype in (torch.bfloat16, torch.float16) and skinny_gemm_enabled():
        # Imported here: CPU-only installs may have no triton.
        from nanovllm.kernels import gemv, tma_gemm
        from nanovllm.kernels.skinny_config import beats_cublas
        from nanovllm.kernels.skinny_gemm import MAX_M, gemm

        k = x.shape[-1]
        if gemv.takes_plain(x.numel() // k, weight.shape[0], k) and weight.stride(1) == 1:
            return gemv.gemv(x, weight, None, None, bias)
        if x.numel() <= MAX_M * k and beats_cublas(weight.shape[0], k):
            return gemm(x, weight, bias)
        if tma_gemm.takes(x, weight):
            return tma_gemm.tma_gemm(x, weight, bias)
    return F.linear(x, weight, bias)


class LinearBase(nn.Module):
    """A weight (and optional bias) whose rows or columns are this rank's shard.

    `quant_method` (chosen by the model builder from the config; None: plain weights) owns the
    weight's storage and the matmul, e.g. fp8 values and their scales."""

    def __init__(self, out_features: int, in_features: int, bias: bool = False,
                 quant_method=None):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.out_features, self.in_features = out_features, in_features
        self.quant_method = quant_method
        if quant_method is None:
            self.weight = nn.Parameter(torch.empty(out_features, in_features),
                                       requires_grad=False)
            self.weight.weight_loader = self.weight_loader
        else:
            quant_method.create_weights(self)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def shard_ids(self) -> list:
        """The shard ids checkpoint tensors of this layer come with (packed layers: several)."""
        return [None]

    def placement(self, shard_id=None) -> Placement:
        """Where the checkpoint tensor of `shard_id` goes (here: the whole weight, unsplit)."""
        return Placement(0, self.out_features, 0, 0, self.out_features)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        """Copy (or quantize) the checkpoint tensor of shard_id into this rank's part of param."""
        p = self.placement(shard_id)
        if self.quant_method is not None and param is not self.bias:
            self.quant_method.load(self, param, loaded, p)
        else:
            copy_placed(param, loaded, p)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ weight.T (+ bias), through the quantized method when there is one."""
        if self.quant_method is None:
            return dense_linear(x, self.weight, bias)
        return self.quant_method.apply(self, x, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x @ weight.T + bias."""
        return self.matmul(x, self.bias)

    def gemm_operands(self):
        """(weight, scale, block) for the skinny GEMM's prologues, or None (see
        prologue_matmul)."""
        if self.quant_method is None:
            return self.weight, None, None
        operands = getattr(self.quant_method, "gemm_operands", None)
        return operands(self) if operands is not None else None

    def prologue_matmul(self, x: torch.Tensor, bias: torch.Tensor | None, **prologue):
        """x @ weight.T (+ bias) with one of the skinny GEMM's prologues (RMSNorm of x plus a
        residual, or SiLU-and-mul; kernels/gemm_prologue.py) in the same launch. Only for
        few rows (decode) and layers whose gemm_operands() is not None."""
        from nanovllm.kernels.skinny_gemm import gemm  # CPU-only installs may have no triton

        weight, scale, block = self.gemm_operands()
        return gemm(x, weight, bias, scale, block, **prologue)

    def silu_mul_matmul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of this packed gate_up projection (bias included) in one launch:
        the GEMV's at one row (kernels/gemv_gated.py), the TMA GEMM's at 17-256 rows
        (kernels/tma_gemm.py); None where neither takes the call."""
        if not x.is_cuda:
            return None
        from nanovllm.kernels import gemv, gemv_gated, tma_gemm  # (CPU installs: no triton)

        operands = self.gemm_operands()  # (plain: only where the skinny GEMM may run)
        if operands is not None and (operands[1] is not None or skinny_gemm_enabled()):
            weight, scale, block = operands
            if tma_gemm.takes(x, weight, gated=True, scale=scale, block=block):
                return tma_gemm.tma_gemm(x, weight, self.bias, gated=True, scale=scale,
                                         block=block)
        if x.numel() != x.shape[-1] or not gemv_gated.GATED:  # (one row only past here)
            return None
        # Plain weights take it only where they would take the GEMV ungated (dense_linear).
        if operands is None or (operands[1] is None
                                and not (skinny_gemm_enabled() and gemv.PLAIN)):
            return None
        weight, scale, block = operands
        if not gemv_gated.takes(x, weight, block):
            return None
        return gemv.gemv(x, weight, scale, None, self.bias, gated=True)


class ReplicatedLinear(LinearBase):
    """The full weight on every rank."""


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; no communication in forward."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 quant_method=None):
        super().__init__(_divide(out_features, tp_size()), in_features, bias, quant_method)

    def placement(self, shard_id=None) -> Placement:
        """This rank's block of output rows."""
        n = self.out_features
        return Placement(0, n * self.tp_size, self.tp_rank * n, 0, n)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections packed into one matmul (gate_up_proj)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False,
                 quant_method=None):
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias, quant_method)

    def shard_ids(self) -> list:
        """One shard id a packed projection (0, 1, ...)."""
        return list(range(len(self.output_sizes)))

    def placement(self, shard_id=None) -> Placement:
        """This rank's rows of projection shard_id, at its offset in the packed weight."""
        size = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        return Placement(0, self.output_sizes[shard_id], self.tp_rank * size, offset, size)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections packed into one matmul; heads split across ranks."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, quant_method=None):
        n = tp_size()
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, n)
        self.num_kv_heads = _divide(num_kv_heads, n)
        super().__init__(hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, bias,
                         quant_method)

    def shard_ids(self) -> list:
        """q, k and v come as three checkpoint tensors."""
        return ["q", "k", "v"]

    def placement(self, shard_id=None) -> Placement:
        """This rank's heads of q, k or v, at their offset in the packed weight."""
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard_id]
        return Placement(0, size * self.tp_size, self.tp_rank * size, offset, size)


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial products summed with an all-reduce."""

    # Set by a block whose next op is an RMSNorm: forward may then return a SplitSum.
    split_ok = False

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 quant_method=None):
        super().__init__(out_features, _divide(in_features, tp_size()), bias, quant_method)

    def placement(self, shard_id=None) -> Placement:
        """This rank's block of input columns."""
        n = self.in_features
        return Placement(1, n * self.tp_size, self.tp_rank * n, 0, n)

    def forward(self, x: torch.Tensor | fp8_rows.Fp8Rows, act: str | None = None) -> torch.Tensor:
        """act="silu_mul": x is a packed gate_up whose SiLU-and-mul the matmul applies itself
        (prologue_matmul); Fp8Rows: e4m3 activation rows (layers/fp8_rows.py)."""
        # The bias is not split; rank 0 alone adds it.
        bias, rows = (self.bias if self.tp_rank == 0 else None), isinstance(x, fp8_rows.Fp8Rows)
        if (act is None and self.split_ok and self.tp_size == 1 and not rows
                and (self.quant_method is not None or skinny_gemm_enabled())):
            parts = split_k.matmul(self, x)  # (K split, the norm adds: layers/split_k.py)
            if parts is not None:
                return parts
        y = (fp8_rows.matmul(self, x, bias=bias is not None) if rows
             else self.matmul(x, bias) if act is None else self.prologue_matmul(x, bias, act=act))
        if self.tp_size > 1:
            dist.all_reduce(y)
        return y
