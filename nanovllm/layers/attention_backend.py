"""The attention seam: three interchangeable implementations and the chooser.

Every backend offers rope_and_store / store_kv / prefill / decode over the paged cache layout
[num_blocks, block_size, num_kv_heads, head_dim]; callers never branch on which one runs. An fp8
cache comes with its per-kv-head scales (k_scale / v_scale, fp32 [Hkv]; None for a cache in the
model's dtype), an int8 cache with a scale per row (fp32, indexed [num_blocks, block_size,
num_kv_heads]); torch and triton take them and flash refuses both (see choose_backend). A prefill
without cached context attends to its own K/V unquantized (see exact_chunk), as vLLM does.
"""
import importlib.util
import logging

import torch

from nanovllm.kernels import torch_ref
from nanovllm.layers.kv_mix import hadamard_mix
from nanovllm.utils.context import Context

logger = logging.getLogger(__name__)


class TorchBackend:
    """Plain-torch reference: the CPU path and the oracle the others are tested against."""

    name = "torch"
    # Whether q and k are multiplied by a Hadamard matrix after RoPE (see hadamard_mix);
    # ModelRunner turns it on for an fp8 cache with calibrated scales and for an int8 cache.
    mix_kv = False
    decode_new = None  # or a method: a pure decode step in one call (TritonBackend's)

    def rope_and_store(self, q, k, v, positions, rope, q_norm, k_norm, k_cache, v_cache,
                       ctx: Context, k_scale=None, v_scale=None, k_feedback=None):
        """Per-head q/k norm (when given), RoPE, then the K/V store; returns (q, k)."""
        q, k = norm_and_rotate(q, k, positions, rope, q_norm, k_norm, self.mix_kv)
        self.store_kv(k, v, k_cache, v_cache, ctx, k_scale, v_scale, k_feedback)
        return q, k

    def store_kv(self, k, v, k_cache, v_cache, ctx: Context, k_scale=None,
                 v_scale=None, k_feedback=None) -> None:
        """Write this step's K/V rows to their cache slots (quantizing for an 8-bit cache)."""
        torch_ref.store_kvcache_torch(k, v, k_cache, v_cache, ctx.slot_mapping, k_scale,
                                      v_scale, k_feedback)

    def prefill(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float, k_scale=None,
                v_scale=None) -> torch.Tensor:
        """Causal attention of the step's prefill rows over their cached and new keys."""
        tables = ctx.block_tables
        if exact_chunk(ctx, k_scale):
            k_cache, v_cache, tables = chunk_as_cache(k, v, ctx)
            k_scale = v_scale = None
        return torch_ref.prefill_attention_torch(q, k_cache, v_cache, ctx.cu_seqlens_q,
                                                 ctx.cu_seqlens_k, tables, scale,
                                                 k_scale, v_scale)

    def decode(self, q, k_cache, v_cache, ctx: Context, scale: float, k_scale=None,
               v_scale=None) -> torch.Tensor:
        """One query row a sequence over its cached keys."""
        return torch_ref.decode_attention_torch(q, k_cache, v_cache, ctx.context_lens,
                                                ctx.block_tables, scale, k_scale, v_scale)


class TritonBackend:
    """Our Triton paged kernels: the GPU default when flash-attn is absent."""

    name = "triton"
    mix_kv = False  # as TorchBackend.mix_kv, inside the fused RoPE kernel
    needs_new_k = False  # prefill reads the new keys back from the cache
    # A prefill without cached context attends to its own K/V unquantized (exact_chunk),
    # as the torch path always does; switchable to measure what it costs.
    exact_prefill = True

    def __init__(self):
        from nanovllm.kernels import (decode_config, decode_rope, triton_decode, triton_kv,
                                      triton_prefill, triton_rope)

        self._rope_store = triton_rope.norm_rope_store
        self._store = triton_kv.store_kvcache
        self._prefill = triton_prefill.prefill_attention
        self._prefill_own = triton_prefill.prefill_attention_contiguous
        self._decode = triton_decode.decode_attention
        self._new_token = decode_rope.new_token_of
        if not decode_config.CONFIG["FUSE_ROPE"]:  # (read once: the graphs keep either path)
            self.decode_new = None

    def rope_and_store(self, q, k, v, positions, rope, q_norm, k_norm, k_cache, v_cache,
                       ctx: Context, k_scale=None, v_scale=None, k_feedback=None):
        """The same as the torch path in one kernel (returned k is None unless prefill
        needs it)."""
        weights = (None, None, 0.0) if q_norm is None else (q_norm.weight, k_norm.weight,
                                                             q_norm.eps)
        # Only prefill reads the rotated keys back (decode steps never pay for writing them).
        new_k = self.needs_new_k or (self.exact_prefill and exact_chunk(ctx, k_scale))
        out = self._rope_store(q, k, v, positions, rope.cos_sin_cache, *weights, k_cache,
                               v_cache, ctx.slot_mapping, return_k=new_k,
                               k_scale=k_scale, v_scale=v_scale, mix=self.mix_kv,
                               k_feedback=k_feedback)
        return out if new_k else (out, None)

    def store_kv(self, k, v, k_cache, v_cache, ctx: Context, k_scale=None,
                 v_scale=None) -> None:
        """Write this step's K/V rows to their cache slots (quantizing for an 8-bit cache)."""
        self._store(k, v, k_cache, v_cache, ctx.slot_mapping, k_scale, v_scale)

    def prefill(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float, k_scale=None,
                v_scale=None) -> torch.Tensor:
        """Causal attention of the step's prefill rows over their cached and new keys."""
        if self.exact_prefill and exact_chunk(ctx, k_scale):
            # Rows of the step's own K/V, read like pages (as one-token pages: 3x slower).
            return self._prefill_own(q, k, v, ctx.cu_seqlens_q, scale, ctx.max_seqlen_q)
        return self._prefill(q, k_cache, v_cache, ctx.cu_seqlens_q, ctx.cu_seqlens_k,
                             ctx.block_tables, scale, ctx.max_seqlen_q, k_scale=k_scale,
                             v_scale=v_scale)

    def decode(self, q, k_cache, v_cache, ctx: Context, scale: float, k_scale=None,
               v_scale=None) -> torch.Tensor:
        """One query row a sequence over its cached keys (split-K Triton kernel)."""
        return self._decode(q, k_cache, v_cache, ctx.context_lens, ctx.block_tables, scale,
                            k_scale=k_scale, v_scale=v_scale, order=ctx.decode_order)

    def decode_new(self, q, k, v, positions, rope, q_norm, k_norm, k_cache, v_cache,
                   ctx: Context, scale: float) -> torch.Tensor | None:
        """rope_and_store then decode in one kernel (decode_rope), or None where it cannot."""
        new = self._new_token(q, k, v, positions, rope.cos_sin_cache, q_norm, k_norm,
                              ctx.slot_mapping)
        return None if new is None else self._decode(
            q, k_cache, v_cache, ctx.context_lens, ctx.block_tables, scale,
            order=ctx.decode_order, new=new)


class FlashBackend(TritonBackend):
    """flash-attn's varlen and kv-cache kernels, called exactly as nano-vLLM calls them."""

    name = "flash"
    decode_new = None  # flash-attn's decode reads q rotated (rope_and_store first)
    needs_new_k = True  # varlen prefill without cached context attends to the new k/v

    def __init__(self, flash_attn=None):
        super().__init__()  # the KV-store stays our Triton kernel, as in nano-vLLM
        if flash_attn is None:
            import flash_attn
        self.fa = flash_attn

    def prefill(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float, k_scale=None,
                v_scale=None) -> torch.Tensor:
        """Causal attention of the step's prefill rows through flash-attn (varlen)."""
        assert k_scale is None, "choose_backend never gives flash an fp8 cache"
        if ctx.has_cached_context:  # earlier tokens live in the cache: read through the table
            k, v, block_table = k_cache, v_cache, ctx.block_tables
        else:
            block_table = None
        return self.fa.flash_attn_varlen_func(
            q, k, v, max_seqlen_q=ctx.max_seqlen_q, cu_seqlens_q=ctx.cu_seqlens_q,
            max_seqlen_k=ctx.max_seqlen_k, cu_seqlens_k=ctx.cu_seqlens_k,
            softmax_scale=scale, causal=True, block_table=block_table)

    def decode(self, q, k_cache, v_cache, ctx: Context, scale: float, k_scale=None,
               v_scale=None) -> torch.Tensor:
        """One query row a sequence over its cached keys through flash-attn."""
        assert k_scale is None, "choose_backend never gives flash an fp8 cache"
        o = self.fa.flash_attn_with_kvcache(
            q.unsqueeze(1), k_cache, v_cache, cache_seqlens=ctx.context_lens,
            block_table=ctx.block_tables, softmax_scale=scale, causal=True)
        return o.squeeze(1)


def norm_and_rotate(q, k, positions, rope, q_norm=None, k_norm=None, mix=False):
    """The unfused q/k norm + RoPE (modules of the model), as the torch path runs it; with
    mix, both then go through hadamard_mix."""
    if q_norm is not None:
        q, k = q_norm(q), k_norm(k)
    q, k = rope(positions, q, k)
    return (hadamard_mix(q), hadamard_mix(k)) if mix else (q, k)


def exact_chunk(ctx: Context, k_scale) -> bool:
    """Whether this step is a prefill over an 8-bit (fp8 or int8) cache that attends to nothing
    but its own new tokens: it then reads their K/V unquantized, not back from the cache.

    Reading them back quantized gave prefill positions decode's e4m3 error (SmolLM2 on CPU:
    0.068 nats mean, now 0; docs/PERF_NOTES.md). Decode, and prefills over cached tokens
    (prefix hits, later chunks), still read the fp8 cache."""
    return ctx.is_prefill and k_scale is not None and not ctx.has_cached_context


def chunk_as_cache(k: torch.Tensor, v: torch.Tensor, ctx: Context):
    """This step's own K/V [T, Hkv, D] laid out as a paged cache of one-token blocks, with the
    block tables that map each sequence to its tokens: the torch path's prefill attends to
    them unchanged (Triton reads the rows directly: prefill_attention_contiguous)."""
    num_tokens = k.shape[0]
    k_cache = k.contiguous().view(num_tokens, 1, *k.shape[1:])
    v_cache = v.contiguous().view(num_tokens, 1, *v.shape[1:])
    cu = ctx.cu_seqlens_q
    offsets = torch.arange(ctx.max_seqlen_q, dtype=cu.dtype, device=cu.device)
    # Rows shorter than the longest point past their end; the kernels never read there.
    tables = (cu[:-1, None] + offsets[None, :]).clamp_(max=num_tokens - 1)
    return k_cache, v_cache, tables


def flash_attn_available() -> bool:
    """Whether the flash_attn package can be imported."""
    return importlib.util.find_spec("flash_attn") is not None


def choose_backend(name: str, device: torch.device, block_size: int,
                   quantized_kv: bool = False):
    """Pick the attention backend: flash > triton on CUDA, torch on CPU ("auto").

    flash-attn's kernels read no 8-bit cache (fp8 or int8): with quantized_kv, "auto" takes
    triton (and says so when flash-attn is installed) and an explicit "flash" is refused."""
    if name == "auto":
        if device.type != "cuda":
            name = "torch"
        elif flash_attn_available() and block_size % 256 == 0 and not quantized_kv:
            name = "flash"
        else:
            if quantized_kv and flash_attn_available():
                logger.info("8-bit KV cache: attention runs on the Triton kernels (flash-attn "
                            "reads no fp8 or int8 cache)")
            name = "triton"
    if name == "flash" and quantized_kv:
        raise ValueError("attention_backend='flash' cannot read an fp8 KV cache (nor an int8 "
                         "one): use attention_backend='auto' or 'triton' with "
                         "kv_cache_dtype='fp8_*' or 'int8', or kv_cache_dtype='auto' with flash")
    if name in ("flash", "triton") and device.type != "cuda":
        raise ValueError(f"attention_backend={name!r} needs a CUDA GPU but the device is "
                         f"{device.type!r}; use 'torch' or 'auto' there")
    if name == "flash":
        if not flash_attn_available():
            raise ValueError("attention_backend='flash' needs the flash-attn package "
                             "(pip install nanovllm[flash]); use 'triton' or 'auto'")
        if block_size % 256:
            raise ValueError(f"attention_backend='flash' needs kvcache_block_size a multiple of "
                             f"256, got {block_size}")
        return FlashBackend()
    if name == "triton":
        return TritonBackend()
    return TorchBackend()
