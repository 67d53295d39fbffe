"""Qwen3: the shared decoder with per-head q/k RMSNorm."""
from nanovllm.config import ModelConfig
from nanovllm.models.decoder import CausalLM, DecoderAttention, DecoderLayer, GatedMLP


def qwen3_attention(cfg: ModelConfig, layer: int) -> DecoderAttention:
    """Qwen3's attention (also Qwen3-MoE's): q/k norm; attention_bias on q, k, v and o."""
    return DecoderAttention(cfg, qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias,
                            qk_norm=True, prefix=f"model.layers.{layer}.self_attn")


class Qwen3ForCausalLM(CausalLM):
    """Hugging Face Qwen3ForCausalLM (dense Qwen3)."""

    def make_layer(self, cfg: ModelConfig, layer: int) -> DecoderLayer:
        """A Qwen3 decoder layer (q/k norms, no bias)."""
        return DecoderLayer(cfg, qwen3_attention(cfg, layer),
                            GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg=cfg,
                                     prefix=f"model.layers.{layer}.mlp"))
