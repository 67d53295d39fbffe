"""Which decoder layers run a batch-1 decode step in one launch (kernels/layer_kernel.py),
and that launch's arguments from the layers' modules (models/decoder.DecoderLayer)."""
import functools
import os

import torch

from nanovllm.utils.context import get_context

# Under TRITON_INTERPRET=1 (tests without a GPU) the kernel runs on CPU tensors too, when forced.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def layer_kernel_mode() -> str:
    """NANOVLLM_LAYER_KERNEL: the dense layers of a batch-1 decode step in one launch
    (kernels/layer_kernel.py). Unset: on a GPU; "1": also under the Triton interpreter on
    a CPU (tests); "0": off (a launch per op)."""
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
    from nanovllm.kernels.layer_launch import fits

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


def forward(layers, positions, x):
    """The decoder layers (all eligible) of a decode step of one row as one kernel launch:
    (the last layer's output, its residual) as chaining DecoderLayer.forward gives them, or
    None where that step is not one (a prefill, a cache neither in the model's dtype nor fp8
    with scales, no cache yet, a CPU tensor unless forced)."""
    if not (x.is_cuda or (_INTERPRET and layer_kernel_mode() == "1")):
        return None
    ctx = get_context()
    attn = layers[0].self_attn
    core = attn.attn
    cache = core.k_cache.dtype
    fp8 = cache.is_floating_point and cache.itemsize == 1 and core.k_scale is not None
    if ctx.is_prefill or core.k_cache.numel() == 0 or not (cache == x.dtype or fp8):
        return None
    stack = _stack(layers)
    if stack is None:
        return None
    return _launch(layers, stack, x, positions, ctx.slot_mapping, ctx.context_lens,
                   ctx.block_tables)


def _launch(layers, stack, x, positions, slot_mapping, context_lens, block_tables):
    """layer_launch.decode_layers of the layers (their stack) for one row x."""
    from nanovllm.kernels.layer_launch import decode_layers

    attn = layers[0].self_attn
    return decode_layers(
        x, None, stack, eps=layers[0].input_layernorm.eps, num_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim, scale=attn.attn.scale,
        cos_sin=attn.rotary_emb.cos_sin_cache.view(-1, attn.head_dim), positions=positions,
        slot_mapping=slot_mapping, context_lens=context_lens, block_tables=block_tables,
        mix=attn.attn.backend.mix_kv)


def warm(layers, dtype: torch.dtype, block_size: int) -> None:
    """Launch the layers' kernel once on stand-in caches and step tensors, inside a
    compile_ahead block (utils/compile_ahead.py) that runs before the KV cache exists: its
    compile, the longest of a fresh start, then overlaps the prefill warm-up's. The stand-ins
    have a decode graph's dtypes, strides and 16-byte alignment, so that launch finds the
    kernel compiled."""
    from nanovllm.kernels.layer_launch import stack_layers

    attn = layers[0].self_attn
    device = layers[0].input_layernorm.weight.device
    cache = torch.empty(1, block_size, attn.num_kv_heads, attn.head_dim, dtype=dtype,
                        device=device)
    stack = stack_layers([dict(_tensors(layer), k_cache=cache, v_cache=cache)
                          for layer in layers])
    if stack is None:
        return
    i32 = dict(dtype=torch.int32, device=device)
    x = torch.empty(1, layers[0].input_layernorm.weight.shape[0], dtype=dtype, device=device)
    _launch(layers, stack, x, torch.zeros(1, **i32), torch.zeros(1, **i32),
            torch.ones(1, **i32), torch.zeros(1, 1, **i32))


def _stack(layers):
    """layer_launch.stack_layers of the layers' tensors, built once (after the weights are
    loaded: the first forward) and again only if the KV cache moves; None where the kernel
    cannot address them."""
    first = layers[0].self_attn.attn
    key = tuple(t.data_ptr() if t is not None else 0
                for t in (first.k_cache, first.v_cache, first.k_scale, first.k_feedback))
    cached = layers[0].__dict__.get("_layer_stack")
    if cached is None or cached[0] != key:
        from nanovllm.kernels.layer_launch import stack_layers

        cached = layers[0].__dict__["_layer_stack"] = (key, stack_layers(
            [_tensors(layer) for layer in layers]))
    return cached[1]


def _tensors(layer) -> dict:
    """A layer's tensors by layer_launch.COLUMNS' names."""
    attn, core = layer.self_attn, layer.self_attn.attn
    (w_qkv, w_o, w_gu, w_down), scales = operands(layer)
    s_qkv, s_o, s_gu, s_down = scales if scales is not None else (None,) * 4
    return dict(
        w_in=layer.input_layernorm.weight, w_qkv=w_qkv, b_qkv=attn.qkv_proj.bias,
        q_norm=None if attn.q_norm is None else attn.q_norm.weight,
        k_norm=None if attn.k_norm is None else attn.k_norm.weight, w_o=w_o,
        b_o=attn.o_proj.bias, w_post=layer.post_attention_layernorm.weight, w_gu=w_gu,
        w_down=w_down, s_qkv=s_qkv, s_o=s_o, s_gu=s_gu, s_down=s_down,
        k_cache=core.k_cache, v_cache=core.v_cache, k_scale=core.k_scale,
        v_scale=core.v_scale, k_fb=core.k_feedback)
