"""Vocabulary-parallel token embedding and LM head."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nanovllm.utils.context import get_context
from nanovllm.utils.dist import tp_rank, tp_size
from nanovllm.layers.linear import dense_linear
from nanovllm.layers.quant import int8_head
from nanovllm.layers.weights import check_weight_shape


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a slice of the vocabulary; lookups outside it contribute zeros."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.num_embeddings = num_embeddings
        # Pad so every rank gets the same slice size (vocab sizes need not divide evenly).
        self.per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.per_rank * self.tp_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """Copy this rank's rows of the vocabulary (zeros past the vocabulary's end)."""
        check_weight_shape(loaded, (self.num_embeddings, param.size(1)))
        shard = loaded[self.vocab_start: self.vocab_start + self.per_rank]
        param.data.zero_()
        param.data[: shard.size(0)].copy_(shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids -> embeddings (under TP each rank looks up its rows; all-reduced)."""
        if self.tp_size == 1:
            return F.embedding(x, self.weight)
        local = x - self.vocab_start
        mask = (local >= 0) & (local < self.per_rank)
        y = F.embedding(local * mask, self.weight) * mask.unsqueeze(-1).to(self.weight.dtype)
        dist.all_reduce(y)
        return y


class ParallelLMHead(VocabParallelEmbedding):
    """Logits for each sequence's last token; shards are gathered on rank 0 only."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__(num_embeddings, embedding_dim)
        self.int8 = None  # (codes, scales, block) after quantize_int8

    def quantize_int8(self) -> None:
        """Keep an int8 copy of the head (layers/quant/int8_head) for steps of few rows."""
        self.int8 = int8_head.quantize(self.weight.data)

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """Logits of the sampling positions (a prefill's last row a sequence; None off rank 0)."""
        ctx = get_context()
        if ctx.is_prefill:
            x = x[ctx.cu_seqlens_q[1:] - 1]  # only the last position of each sequence samples
        return self.project(x)

    def project(self, x: torch.Tensor) -> torch.Tensor | None:
        """Logits of every row of x, gathered on rank 0 (None on the other ranks)."""
        few = self.int8 is not None and x.numel() <= int8_head.MAX_ROWS * x.shape[-1]
        logits = int8_head.matmul(x, *self.int8) if few else dense_linear(x, self.weight)
        if self.tp_size > 1:
            parts = ([torch.empty_like(logits) for _ in range(self.tp_size)]
                     if self.tp_rank == 0 else None)
            dist.gather(logits, parts, 0)
            logits = torch.cat(parts, -1) if self.tp_rank == 0 else None
        return None if logits is None else logits[..., : self.num_embeddings]
