"""Llama (2, 3, 3.1, 3.2, 3.3): the shared decoder; attention_bias on q, k, v and o,
mlp_bias on the MLP; llama3 RoPE scaling comes from config.json."""
from nanovllm.config import ModelConfig
from nanovllm.models.decoder import CausalLM, DecoderAttention, DecoderLayer, GatedMLP


class LlamaForCausalLM(CausalLM):
    """Hugging Face LlamaForCausalLM."""

    def make_layer(self, cfg: ModelConfig, layer: int) -> DecoderLayer:
        """A Llama decoder layer (biases as the config says)."""
        bias, prefix = cfg.attention_bias, f"model.layers.{layer}"
        return DecoderLayer(cfg, DecoderAttention(cfg, qkv_bias=bias, o_bias=bias,
                                                  prefix=f"{prefix}.self_attn"),
                            GatedMLP(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias,
                                     cfg=cfg, prefix=f"{prefix}.mlp"))
