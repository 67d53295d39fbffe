"""Qwen3-MoE: Qwen3's attention; a sparse mixture-of-experts block in place of the MLP on the
layers config.json selects (mlp_only_layers, decoder_sparse_step), a dense MLP on the rest."""
import torch
from torch import nn

from nanovllm.config import ModelConfig
from nanovllm.layers.fused_moe import FusedMoE
from nanovllm.layers.linear import ReplicatedLinear
from nanovllm.models.decoder import CausalLM, DecoderLayer, GatedMLP
from nanovllm.models.qwen3 import qwen3_attention
from nanovllm.models.quantization import moe_method


class Qwen3MoeSparseMoeBlock(nn.Module):
    """The router (`gate`, replicated on every rank, never quantized) and the layer's
    experts; `prefix` is the checkpoint's model.layers.<i>.mlp."""

    def __init__(self, cfg: ModelConfig, prefix: str = ""):
        super().__init__()
        self.gate = ReplicatedLinear(cfg.num_experts, cfg.hidden_size)
        self.experts = FusedMoE(cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                                cfg.moe_intermediate_size, cfg.norm_topk_prob,
                                quant_method=moe_method(cfg, prefix))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Route each token, then run it through its experts."""
        return self.experts(x, self.gate(x))


class Qwen3MoeForCausalLM(CausalLM):
    """Hugging Face Qwen3MoeForCausalLM (e.g. Qwen3-30B-A3B)."""

    # <prefix>.experts.<e>.<name>.weight -> <prefix>.experts.<param>, shard (e, half)
    expert_modules_mapping = {
        "gate_proj": ("w13_weight", 0),
        "up_proj": ("w13_weight", 1),
        "down_proj": ("w2_weight", None),
    }

    def make_layer(self, cfg: ModelConfig, layer: int) -> DecoderLayer:
        """A Qwen3-MoE decoder layer: sparse experts where the config says, else a dense MLP."""
        prefix = f"model.layers.{layer}.mlp"
        mlp = (Qwen3MoeSparseMoeBlock(cfg, prefix) if cfg.is_moe_layer(layer)
               else GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg=cfg, prefix=prefix))
        return DecoderLayer(cfg, qwen3_attention(cfg, layer), mlp)
