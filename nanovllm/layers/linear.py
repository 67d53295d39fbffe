"""Linear layers sharded for tensor parallelism (vLLM's names and sharding math)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nanovllm.utils.dist import tp_rank, tp_size
from nanovllm.layers.weights import check_weight_shape


def _divide(a: int, b: int) -> int:
    # Config validated divisibility by tensor_parallel_size already: this is an invariant.
    assert a % b == 0, f"{a} is not divisible by {b}"
    return a // b


class LinearBase(nn.Module):
    """A weight (and optional bias) whose rows or columns are this rank's shard."""

    def __init__(self, out_features: int, in_features: int, bias: bool = False):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, *args) -> None:
        check_weight_shape(loaded, param.shape)
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ReplicatedLinear(LinearBase):
    """The full weight on every rank."""


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; no communication in forward."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(_divide(out_features, tp_size()), in_features, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, *args) -> None:
        n = param.data.size(0)
        check_weight_shape(loaded, (n * self.tp_size, *param.shape[1:]))
        param.data.copy_(loaded.narrow(0, self.tp_rank * n, n))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections packed into one matmul (gate_up_proj)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int) -> None:
        check_weight_shape(loaded, (self.output_sizes[shard_id], *param.shape[1:]))
        size = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        mine = loaded.narrow(0, self.tp_rank * size, size)
        param.data.narrow(0, offset, size).copy_(mine)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections packed into one matmul; heads split across ranks."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False):
        n = tp_size()
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, n)
        self.num_kv_heads = _divide(num_kv_heads, n)
        super().__init__(hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str) -> None:
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard_id]
        check_weight_shape(loaded, (size * self.tp_size, *param.shape[1:]))
        mine = loaded.narrow(0, self.tp_rank * size, size)
        param.data.narrow(0, offset, size).copy_(mine)


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial products summed with an all-reduce."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(out_features, _divide(in_features, tp_size()), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, *args) -> None:
        if param.data.dim() == 1:  # the bias is not split; rank 0 alone adds it
            check_weight_shape(loaded, param.shape)
            param.data.copy_(loaded)
            return
        n = param.data.size(1)
        check_weight_shape(loaded, (param.data.size(0), n * self.tp_size))
        param.data.copy_(loaded.narrow(1, self.tp_rank * n, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None)
        if self.tp_size > 1:
            dist.all_reduce(y)
        return y
