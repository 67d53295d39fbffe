"""Which decoder layers run a batch-1 decode step as one launch (kernels/layer_kernel.py),
and that launch's arguments from a layer's modules (models/decoder.DecoderLayer)."""
import functools
import os

import torch

from nanovllm.utils.context import get_context

# Under TRITON_INTERPRET=1 (tests without a GPU) the kernel runs on CPU tensors too, when forced.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def layer_kernel_mode() -> str:
    """NANOVLLM_LAYER_KERNEL: each dense layer of a batch-1 decode step as one launch
    (kernels/layer_kernel.py). Unset: on a GPU; "1": also under the Triton interpreter on a
    CPU (tests); "0": off (a launch per op)."""
    value = os.environ.get("NANOVLLM_LAYER_KERNEL", "")
    if value not in ("", "0", "1"):
        raise ValueError(f"NANOVLLM_LAYER_KERNEL={value!r}: use 1 (a batch-1 decode layer in "
                         "one launch, also in the interpreter), 0 (a launch per op) or leave "
                         "it unset (one launch on a GPU)")
    return value


def eligible(layer, hidden_size: int) -> bool:
    """Whether a dense DecoderLayer can run as one launch: wanted (forced, or on by default
    with a GPU: a CPU-only install may have no Triton to import), one rank, a power-of-two
    head_dim, no MLP bias, weights all plain or all fp8 with row scales, and per-program
    tiles the kernel takes."""
    mode = layer_kernel_mode()
    if not (mode == "1" or (mode == "" and torch.cuda.is_available())):
        return False
    attn, mlp = layer.self_attn, layer.mlp
    if (mlp.gate_up_proj.bias is not None or mlp.down_proj.bias is not None
            or attn.qkv_proj.tp_size != 1 or attn.head_dim & (attn.head_dim - 1)
            or operands(layer) is None):
        return False
    from nanovllm.kernels.layer_kernel import fits

    return fits(hidden_size, attn.num_heads, attn.num_kv_heads, attn.head_dim,
                mlp.gate_up_proj.output_sizes[0])


def operands(layer):
    """(weights, row scales or None) of qkv, o, gate_up and down for the layer kernel, or
    None where it cannot read them (block scales, a mix of weight kinds)."""
    attn, mlp = layer.self_attn, layer.mlp
    ops = [p.gemm_operands() for p in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj,
                                       mlp.down_proj)]
    if any(op is None or op[2] is not None for op in ops):
        return None
    if len({op[0].dtype for op in ops}) != 1 or len({op[1] is None for op in ops}) != 1:
        return None
    weights = [op[0] for op in ops]
    return weights, None if ops[0][1] is None else [op[1] for op in ops]


def forward(layer, positions, x, residual):
    """layer.forward as one kernel launch for a decode step of one row, or None where that
    step is not one (a prefill, a cache not in the model's dtype, no cache yet, a CPU tensor
    unless forced)."""
    if not (x.is_cuda or (_INTERPRET and layer_kernel_mode() == "1")):
        return None
    from nanovllm.kernels.layer_kernel import decode_layer

    ctx = get_context()
    attn = layer.self_attn
    core = attn.attn
    if (ctx.is_prefill or core.k_cache.numel() == 0 or core.k_cache.dtype != x.dtype
            or core.backend.mix_kv):
        return None
    (w_qkv, w_o, w_gu, w_down), scales, w_next = _launch_operands(layer)
    return decode_layer(
        x, residual, w_in=layer.input_layernorm.weight, w_qkv=w_qkv,
        b_qkv=attn.qkv_proj.bias, q_norm=None if attn.q_norm is None else attn.q_norm.weight,
        k_norm=None if attn.k_norm is None else attn.k_norm.weight, w_o=w_o,
        b_o=attn.o_proj.bias, w_post=layer.post_attention_layernorm.weight, w_gu=w_gu,
        w_down=w_down, scales=scales, eps=layer.input_layernorm.eps, num_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim, scale=core.scale,
        cos_sin=attn.rotary_emb.cos_sin_cache.view(-1, attn.head_dim),
        positions=positions, slot_mapping=ctx.slot_mapping, context_lens=ctx.context_lens,
        block_tables=ctx.block_tables, k_cache=core.k_cache, v_cache=core.v_cache,
        w_next=w_next)


def _launch_operands(layer):
    """operands(layer) and the next layer's qkv weight, found once per layer (after the
    weights are loaded: the first forward) rather than on every eager decode step."""
    cached = layer.__dict__.get("_launch_operands")
    if cached is None:
        weights, scales = operands(layer)
        nxt = layer.next_qkv[0].gemm_operands()[0] if layer.next_qkv else None
        cached = layer.__dict__["_launch_operands"] = (weights, scales, nxt)
    return cached
