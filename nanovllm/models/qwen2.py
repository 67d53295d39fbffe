"""Qwen2 / Qwen2.5: the shared decoder with a bias on q, k and v (none on o), no q/k norm."""
from nanovllm.config import ModelConfig
from nanovllm.models.decoder import CausalLM, DecoderAttention, DecoderLayer, GatedMLP


class Qwen2ForCausalLM(CausalLM):
    """Hugging Face Qwen2ForCausalLM (Qwen2, Qwen2.5)."""

    def make_layer(self, cfg: ModelConfig, layer: int) -> DecoderLayer:
        """A Qwen2 decoder layer (qkv with bias)."""
        prefix = f"model.layers.{layer}"
        return DecoderLayer(cfg, DecoderAttention(cfg, qkv_bias=True, prefix=f"{prefix}.self_attn"),
                            GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg=cfg,
                                     prefix=f"{prefix}.mlp"))
