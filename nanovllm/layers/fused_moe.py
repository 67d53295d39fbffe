"""Mixture-of-experts layer: top-k routing and one layer's experts packed in two tensors.

Tensor parallelism splits every expert's intermediate dimension across ranks (vLLM's default):
each rank holds a slice of every expert's gate/up rows and down columns, computes a partial
output for all tokens, and an all-reduce sums the slices, as for a dense MLP.
"""
import torch
import torch.distributed as dist
from torch import nn

from nanovllm.kernels.torch_ref import fused_moe_torch
from nanovllm.utils.dist import tp_rank, tp_size
from nanovllm.layers.weights import check_weight_shape


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    """Softmax over all experts (fp32), the top_k of them, optionally rescaled to sum to one
    (norm_topk_prob). Returns (weights float32 [T, k], expert ids int32 [T, k])."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids.int()


def fused_moe(x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """The fused Triton kernel on a GPU, the plain-torch one elsewhere (same function)."""
    if x.is_cuda:
        from nanovllm.kernels.triton_moe import fused_moe as triton_fused_moe

        return triton_fused_moe(x, w13, w2, topk_weights, topk_ids)
    return fused_moe_torch(x, w13, w2, topk_weights, topk_ids)


class FusedMoE(nn.Module):
    """num_experts SwiGLU experts: w13 [E, 2I/tp, H] (gate rows, then up rows), w2 [E, H, I/tp].

    The loader fills them from per-expert checkpoint tensors with shard ids (expert, 0 gate |
    1 up) for w13 and (expert, None) for w2.
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, quant_method=None):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.top_k, self.renormalize = top_k, renormalize
        self.num_experts, self.hidden_size = num_experts, hidden_size
        # Config checked that tensor_parallel_size divides moe_intermediate_size.
        self.inter = intermediate_size // self.tp_size
        # Chosen by the model builder (None: plain weights); owns the experts' storage.
        self.quant_method = quant_method
        if quant_method is not None:
            quant_method.create_weights(self)
            return
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * self.inter, hidden_size),
                                       requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, self.inter),
                                      requires_grad=False)
        self.w13_weight.weight_loader = self.weight_loader
        self.w2_weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: tuple) -> None:
        """Copy one expert's gate, up or down weight (its TP slice) into the stacked experts."""
        if self.quant_method is not None:
            return self.quant_method.load(self, param, loaded, shard)
        expert, half = shard
        n, mine = self.inter, self.tp_rank * self.inter
        if param is self.w2_weight:  # down_proj [H, I]: this rank's columns
            check_weight_shape(loaded, (param.shape[1], n * self.tp_size))
            param.data[expert].copy_(loaded.narrow(1, mine, n))
        else:  # gate_proj / up_proj [I, H]: this rank's rows, into the gate or the up half
            check_weight_shape(loaded, (n * self.tp_size, param.shape[2]))
            param.data[expert].narrow(0, half * n, n).copy_(loaded.narrow(0, mine, n))

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """Each token through its top_k experts, weighted by the router."""
        weights, ids = select_experts(router_logits, self.top_k, self.renormalize)
        fp8 = (self.quant_method.kernel_operands(self)
               if self.quant_method is not None and x.is_cuda else None)
        if fp8 is not None:  # the kernel reads the fp8 experts (no dequantized copy)
            from nanovllm.kernels.triton_moe import fused_moe as triton_fused_moe

            w13, w2, s13, s2, block = fp8
            y = triton_fused_moe(x, w13, w2, weights, ids, w13_scale=s13, w2_scale=s2,
                                 block=block)
        else:
            w13, w2 = ((self.w13_weight, self.w2_weight) if self.quant_method is None
                       else self.quant_method.weights(self, x.dtype))
            y = fused_moe(x, w13, w2, weights, ids)
        if self.tp_size > 1:
            dist.all_reduce(y)
        return y
