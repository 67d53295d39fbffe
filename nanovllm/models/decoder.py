"""The decoder skeleton Qwen2, Qwen3, Llama and Qwen3-MoE share: GQA attention, a SwiGLU MLP,
pre-norm blocks and a causal-LM head. Each model file only says how its layers differ."""
import functools
import os

import torch
from torch import nn

from nanovllm.config import ModelConfig
from nanovllm.layers import fp8_rows
from nanovllm.layers.activation import SiluAndMul
from nanovllm.layers.attention import Attention
from nanovllm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanovllm.layers.rotary_embedding import get_rope
from nanovllm.models import one_launch
from nanovllm.models.quantization import linear_method


class DecoderAttention(nn.Module):
    """GQA self-attention with RoPE; optional q/k/v bias, o bias and per-head q/k RMSNorm.
    `prefix` is the checkpoint's module name (model.layers.<i>.self_attn)."""

    def __init__(self, cfg: ModelConfig, qkv_bias: bool = False, o_bias: bool = False,
                 qk_norm: bool = False, prefix: str = ""):
        super().__init__()
        d = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, d, cfg.num_attention_heads, cfg.num_key_value_heads,
            bias=qkv_bias, quant_method=linear_method(cfg, prefix, ["q_proj", "k_proj", "v_proj"]))
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        self.head_dim = d
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * d, cfg.hidden_size, bias=o_bias,
                                        quant_method=linear_method(cfg, prefix, ["o_proj"]))
        self.rotary_emb = get_rope(d, cfg.max_position_embeddings, cfg.rope_theta,
                                   cfg.rope_scaling)
        self.attn = Attention(self.num_heads, d, d ** -0.5, self.num_kv_heads)
        if qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, positions: torch.Tensor, x: torch.Tensor | fp8_rows.Fp8Rows):
        """qkv projection, then attention and the output projection."""
        if isinstance(x, fp8_rows.Fp8Rows):  # (the norm quantized it: layers/fp8_rows.py)
            return self.attend(positions, fp8_rows.matmul(self.qkv_proj, x))
        return self.attend(positions, self.qkv_proj(x))

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """Attention and the output projection, from the packed q/k/v projection."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], -1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        o = self.attn(q, k, v, positions, self.rotary_emb, self.q_norm, self.k_norm)
        return self.o_proj(o.flatten(1, -1))


class GatedMLP(nn.Module):
    """SwiGLU feed-forward with packed gate/up projection; `cfg` and `prefix` (the
    checkpoint's model.layers.<i>.mlp) choose quantized weights, if config.json has them."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False,
                 cfg: ModelConfig | None = None, prefix: str = ""):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=bias,
            quant_method=linear_method(cfg, prefix, ["gate_proj", "up_proj"]))
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias,
                                           quant_method=linear_method(cfg, prefix, ["down_proj"]))
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor | fp8_rows.Fp8Rows) -> torch.Tensor:
        """down(SiLU(gate(x)) * up(x))."""
        if isinstance(x, fp8_rows.Fp8Rows):  # (the norm quantized it: layers/fp8_rows.py)
            return fp8_rows.mlp(self.gate_up_proj, self.down_proj, x)
        act = self.gate_up_proj.silu_mul_matmul(x)  # (one launch where the GEMV takes it)
        if act is None:
            act = self.act_fn(self.gate_up_proj(x))
        return self.down_proj(act)


class DecoderLayer(nn.Module):
    """Pre-norm block; the residual add is fused into the following RMSNorm."""

    def __init__(self, cfg: ModelConfig, self_attn: nn.Module, mlp: nn.Module):
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # o_proj and down_proj feed an RMSNorm (this block's, the next block's or the final
        # one), so they may leave split-K partials for it to add (layers/split_k.py).
        if isinstance(self_attn, DecoderAttention):
            self_attn.o_proj.split_ok = True
        if isinstance(mlp, GatedMLP):
            mlp.down_proj.split_ok = True
        # Whether the norms may hand qkv_proj and gate_up_proj e4m3 rows (fp8 weights:
        # layers/fp8_rows.py); both consume their norm's output and nothing else does.
        self.fp8_in = (isinstance(self_attn, DecoderAttention) and isinstance(mlp, GatedMLP)
                       and self_attn.qkv_proj.quant_method is not None)
        # Whether decode steps fold the norms and SiLU-and-mul into the matmuls that follow
        # them (forward_fused): the dense blocks, with weights the skinny GEMM takes.
        self.fusable = (fused_prologues_enabled() and isinstance(self_attn, DecoderAttention)
                        and isinstance(mlp, GatedMLP)
                        and all(p.gemm_operands() is not None for p in (
                            self_attn.qkv_proj, mlp.gate_up_proj, mlp.down_proj)))
        # Whether a batch-1 decode step may run this layer inside the one launch of all
        # layers (kernels/layer_kernel.py; models/one_launch.py says which layers can).
        self.one_launch = (isinstance(self_attn, DecoderAttention)
                           and isinstance(mlp, GatedMLP)
                           and one_launch.eligible(self, cfg.hidden_size))

    def forward(self, positions, x, residual):
        """Pre-norm attention and MLP; returns (output, residual), the add left to the next norm."""
        if self.fusable and fused_rows(x):
            return self.forward_fused(positions, x, residual)
        quantize = self.fp8_in and fp8_rows.takes(self.self_attn.qkv_proj, x)
        if residual is None:
            residual = x
            x = self.input_layernorm(x, quantize=quantize)
        else:
            x, residual = self.input_layernorm(x, residual, quantize=quantize)
        x = self.self_attn(positions, x)
        quantize = self.fp8_in and fp8_rows.takes(self.mlp.gate_up_proj, x, gated=True)
        x, residual = self.post_attention_layernorm(x, residual, quantize=quantize)
        return self.mlp(x), residual

    def forward_fused(self, positions, x, residual):
        """forward with each RMSNorm (and its residual add) run by the matmul after it and
        SiLU-and-mul by the down projection: two fewer launches per norm, one per MLP."""
        attn, mlp = self.self_attn, self.mlp
        qkv, residual = self._normed(attn.qkv_proj, self.input_layernorm, x, residual)
        x = attn.attend(positions, qkv)
        gate_up, residual = self._normed(mlp.gate_up_proj, self.post_attention_layernorm, x,
                                         residual)
        return mlp.down_proj(gate_up, act="silu_mul"), residual

    @staticmethod
    def _normed(proj, norm: RMSNorm, x, residual):
        """(proj(norm(x + residual)), x + residual); the first layer has no residual yet."""
        if residual is None:
            return proj.prologue_matmul(x, proj.bias, norm_weight=norm.weight,
                                        eps=norm.eps), x
        return proj.prologue_matmul(x, proj.bias, norm_weight=norm.weight, residual=residual,
                                    eps=norm.eps)


@functools.cache
def fused_prologues_enabled() -> bool:
    """NANOVLLM_FUSED_PROLOGUES=1 folds decode steps' RMSNorms and SiLU-and-mul into the
    skinny GEMM (kernels/gemm_prologue.py). Off by default until measured on a GPU."""
    value = os.environ.get("NANOVLLM_FUSED_PROLOGUES", "0")
    if value not in ("0", "1"):
        raise ValueError(f"NANOVLLM_FUSED_PROLOGUES={value!r}: use 1 (norms and SiLU-and-mul "
                         "inside the decode matmuls) or 0 (separate kernels)")
    return value == "1"


def fused_rows(x: torch.Tensor) -> bool:
    """Whether a step's hidden states x go through the fused path: a GPU and few rows."""
    from nanovllm.kernels.skinny_gemm import MAX_M

    return isinstance(x, torch.Tensor) and x.is_cuda and x.numel() <= MAX_M * x.shape[-1]


class DecoderModel(nn.Module):
    """Embedding, decoder layers and the final norm."""

    def __init__(self, cfg: ModelConfig, layers: list[nn.Module]):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layers)
        # A batch-1 decode step runs every layer in one launch when each one can.
        self.one_launch = bool(layers) and all(getattr(layer, "one_launch", False)
                                               for layer in layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token ids and positions -> final hidden states."""
        x, residual = self.embed_tokens(input_ids), None
        out = None
        if self.one_launch and x.shape[0] == 1:
            out = one_launch.forward(self.layers, positions, x)
        if out is not None:
            x, residual = out
        else:
            for layer in self.layers:
                x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x


class CausalLM(nn.Module):
    """A decoder with its LM head; subclasses build each layer (`make_layer`) and may add
    checkpoint-name mappings for the loader."""

    # HF name fragment -> (our packed module, shard id)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.model = DecoderModel(cfg, [self.make_layer(cfg, i)
                                        for i in range(cfg.num_hidden_layers)])
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def make_layer(self, cfg: ModelConfig, layer: int) -> DecoderLayer:
        """Decoder layer number `layer` of this architecture."""
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token ids and positions -> final hidden states."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits of the sampling positions (None on TP ranks other than 0)."""
        return self.lm_head(hidden)

    def compute_all_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits of every row of hidden, e.g. prompt positions (None on ranks other than 0)."""
        return self.lm_head.project(hidden)
