"""Sizing and allocating the paged KV cache of one rank (and the scales of an fp8 or int8
one)."""
import gc
import logging

import torch

from nanovllm.config import Config
from nanovllm.kernels.decode_config import CONFIG_FP8
from nanovllm.kernels.kv_feedback import feedback_wanted, identity_feedback
from nanovllm.layers.kv_mix import mix_kv_wanted
from nanovllm.models.safetensors_io import read_kv_scales

logger = logging.getLogger(__name__)

# KV cache the CPU path gets when num_kvcache_blocks is left at -1.
CPU_KV_CACHE_BYTES = 1 << 30
# Config.kv_cache_dtype -> the cache's element type ("auto": the model's dtype).
FP8_KV_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
                 "fp8_e5m2": torch.float8_e5m2}
KV_DTYPES = dict(FP8_KV_DTYPES, int8=torch.int8)
# An int8 cache keeps one fp32 scale per (token, kv head) beside K and beside V.
INT8_SCALE_DTYPE = torch.float32


def kv_cache_dtype(config: Config, model_dtype: torch.dtype,
                   device: torch.device) -> torch.dtype:
    """The element type the cache stores (fp8 on a GPU needs Triton's fp8: Ada or Hopper)."""
    dtype = KV_DTYPES.get(config.kv_cache_dtype, model_dtype)
    if dtype in FP8_KV_DTYPES.values() and device.type == "cuda" and (
            torch.cuda.get_device_capability(device) < (8, 9)):
        raise ValueError(f"kv_cache_dtype={config.kv_cache_dtype!r} needs a GPU of compute "
                         f"capability >= 8.9 (Ada, Hopper); this one is "
                         f"{torch.cuda.get_device_capability(device)}: use 'auto'")
    return dtype


def kv_shape(attn_layers: list, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """[K/V, layer, block, slot, kv head, head dim]: one tensor for every layer's cache."""
    attn = attn_layers[0]
    return (2, len(attn_layers), num_blocks, block_size, attn.num_kv_heads, attn.head_dim)


def kv_bytes_per_block(attn_layers: list, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block of every layer's K and V takes (an int8 cache's row scales included)."""
    per_block = torch.Size(kv_shape(attn_layers, 1, block_size)).numel()
    extra = 0
    if dtype == torch.int8:
        extra = per_block // attn_layers[0].head_dim * INT8_SCALE_DTYPE.itemsize
    return per_block * dtype.itemsize + extra


def count_blocks(config: Config, bytes_per_block: int, device: torch.device,
                 max_blocks_per_seq: int) -> int:
    """Blocks this rank can hold: configured, or what memory allows after the warm-up."""
    if config.num_kvcache_blocks > 0:
        return config.num_kvcache_blocks
    if device.type == "cuda":
        # Memory this process holds for nothing would read as used by others.
        hand_back_freed_memory()
        free, total = torch.cuda.mem_get_info(device)
        stats = torch.cuda.memory_stats(device)
        peak, current = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
        # Budget = utilisation share of the card, minus what others and our weights use
        # (total - free) and the activation peak the warm-up measured.
        budget = total * config.gpu_memory_utilization - (total - free) - (peak - current)
        if budget < bytes_per_block:
            gib = 2 ** 30
            logger.warning("KV cache budget %.2f GiB = gpu_memory_utilization %.2f x %.2f GiB "
                           "- %.2f GiB in use (weights, other processes) - %.2f GiB warm-up "
                           "activation peak", budget / gib, config.gpu_memory_utilization,
                           total / gib, (total - free) / gib, (peak - current) / gib)
        return int(budget) // bytes_per_block
    most = config.max_num_seqs * max_blocks_per_seq  # more could never be used
    return min(CPU_KV_CACHE_BYTES // bytes_per_block, most)


def hand_back_freed_memory(at_shutdown: bool = False) -> None:
    """Collect unreachable tensors (an engine's KV cache after its shutdown, freed once its
    reference cycles go) and return the allocator's free segments to the driver. Called at
    shutdown too: a freed cache segment left cached could hold any later long-lived tensor
    (a rope table, a workspace), and one such tensor keeps the whole segment from the next
    engine (H200: 2 MiB pinned 125 GiB). At shutdown a CUDA error (a context broken by a
    device-side assert) is logged, not raised: it must not hide the error that ended the
    engine."""
    gc.collect()
    try:
        torch.cuda.empty_cache()
    except RuntimeError:
        if not at_shutdown:
            raise
        logger.warning("could not return the engine's freed GPU memory", exc_info=True)


def agree_on_blocks(num_blocks: int, device: torch.device) -> int:
    """Every tensor-parallel rank must use the same number of blocks: the smallest."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return num_blocks
    t = torch.tensor([num_blocks], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def allocate_kv_cache(config: Config, attn_layers: list, dtype: torch.dtype,
                      device: torch.device, max_blocks_per_seq: int, log: bool,
                      extra: int = 0) -> torch.Tensor:
    """Allocate the cache (elements of `dtype`) and give each Attention layer its K and V
    views. An fp8 cache holds twice the tokens of a bf16 one in the same memory; an int8
    cache a little less (its row scales take their share). `extra`: bytes each block needs
    elsewhere (a draft model's K/V), counted when sizing."""
    bs = config.kvcache_block_size
    bytes_per_block = kv_bytes_per_block(attn_layers, bs, dtype)
    num_blocks = agree_on_blocks(count_blocks(config, bytes_per_block + extra, device,
                                              max_blocks_per_seq), device)
    if num_blocks < 1:
        raise ValueError("no memory left for the KV cache: raise gpu_memory_utilization or "
                         "lower max_num_batched_tokens / max_num_seqs")
    cache = torch.empty(kv_shape(attn_layers, num_blocks, bs), dtype=dtype, device=device)
    for i, layer in enumerate(attn_layers):
        layer.k_cache, layer.v_cache = cache[0, i], cache[1, i]
    if log:
        logger.info("KV cache: %d blocks of %d tokens = %d tokens (%.2f GiB, %s)", num_blocks,
                    bs, num_blocks * bs, num_blocks * bytes_per_block / 2**30,
                    str(dtype).removeprefix("torch."))
    return cache


def allocate_kv_scales(attn_layers: list, device: torch.device,
                       loaded: torch.Tensor | None) -> torch.Tensor:
    """fp32 [2, layer, kv head] scales of an fp8 cache, from the checkpoint (`loaded`, this
    rank's heads) or ones until the first prefill calibrates them; each layer gets its views."""
    shape = (2, len(attn_layers), attn_layers[0].num_kv_heads)
    scales = torch.ones(shape, dtype=torch.float32, device=device)
    if loaded is not None:
        scales.copy_(loaded)
    for i, layer in enumerate(attn_layers):
        layer.k_scale, layer.v_scale = scales[0, i], scales[1, i]
    return scales


def allocate_row_scales(attn_layers: list, kv_cache: torch.Tensor) -> torch.Tensor:
    """The row scales of an int8 cache, stored [K/V, layer, block, kv head, slot]; each layer
    gets its K and V views indexed [block, slot, kv head] like its cache (as k_scale /
    v_scale). Head-major within a block: a decode tile's scales (one kv head, consecutive
    slots) are then one contiguous run, not a load strided by the head count."""
    two, layers, blocks, block_size, heads, _ = kv_cache.shape
    scales = torch.ones(two, layers, blocks, heads, block_size, dtype=INT8_SCALE_DTYPE,
                        device=kv_cache.device)
    for i, layer in enumerate(attn_layers):
        layer.k_scale, layer.v_scale = (s.transpose(1, 2) for s in scales[:, i])
    return scales


def checkpoint_kv_scales(config: Config, rank: int, local_heads: int) -> torch.Tensor | None:
    """This rank's heads (local_heads of them) of the checkpoint's k_scale/v_scale, or None
    (calibrate on the first prefill)."""
    if config.load_format == "dummy":
        return None
    hf = config.hf_config
    scales = read_kv_scales(config.model, hf.num_hidden_layers, hf.num_key_value_heads)
    if scales is None:
        return None
    if rank == 0:
        logger.info("fp8 KV cache: k/v scales from the checkpoint")
    return scales[:, :, rank * local_heads:(rank + 1) * local_heads]


def set_up_8bit_cache(config: Config, rank: int, attn_layers: list, kv_cache: torch.Tensor,
                      backend) -> tuple[torch.Tensor, bool]:
    """An 8-bit cache's scales, its Hadamard mixing (backend.mix_kv) and an e4m3 cache's K
    error feedback: (the scales, whether the first real prefill must calibrate them)."""
    head_dim = attn_layers[0].head_dim
    if kv_cache.dtype == torch.int8:
        # A scale per (token, kv head), set by each store: nothing to calibrate. Mixing
        # makes a rotated row near-Gaussian, so its max is a few sigma, not an outlier's.
        backend.mix_kv = mix_kv_wanted(head_dim)
        return allocate_row_scales(attn_layers, kv_cache), False
    tile = CONFIG_FP8["V_TILE"]
    if backend.name == "triton" and tile:
        if config.kvcache_block_size % tile == 0:
            tile_v_pages(attn_layers, tile)
        elif rank == 0:  # a decode tile's keys must lie in one page
            logger.info("fp8 KV cache: kvcache_block_size=%d is not a multiple of %d; V's "
                        "pages keep the usual layout (a slower decode)",
                        config.kvcache_block_size, tile)
    loaded = checkpoint_kv_scales(config, rank, attn_layers[0].num_kv_heads)
    scales = allocate_kv_scales(attn_layers, kv_cache.device, loaded)
    # Hadamard-mixed q/k (kv_mix.hadamard_mix) only under scales calibrated on
    # mixed keys: a checkpoint's scales were measured on plain ones.
    backend.mix_kv = loaded is None and mix_kv_wanted(head_dim)
    if loaded is None and kv_cache.dtype == torch.float8_e4m3fn and feedback_wanted():
        # The identity until the first prefill fits it: plain rounding meanwhile.
        for layer in attn_layers:
            layer.k_feedback = identity_feedback(layer.num_kv_heads, head_dim, kv_cache.device)
            layer.feedback_moments = torch.zeros(layer.num_kv_heads, head_dim, head_dim,
                                                 device=kv_cache.device)
    return scales, loaded is None


def tile_v_pages(attn_layers: list, tile: int) -> None:
    """View each layer's V cache [blocks, block_size, Hkv, D] as [blocks, Hkv, block_size /
    tile, D, tile]: the same memory, its pages holding each kv head's V in tile-key tiles,
    a tile's V^T one contiguous run (triton_kv.v_tile_of). The fp8 decode then reads V
    whole and hands the PV dot keys side by side, instead of a byte at a time. Zeroed: the
    decode reads a partial last tile whole too (decode_tiles' V_LAST 2), so the slots past
    a context must hold no NaN codes (the stores never write one)."""
    for layer in attn_layers:
        blocks, block_size, heads, dim = layer.v_cache.shape
        layer.v_cache = layer.v_cache.view(blocks, heads, block_size // tile, dim, tile)
        layer.v_cache.zero_()


def allocate_kv(config: Config, rank: int, attn_layers: list, dtype: torch.dtype,
                device: torch.device, max_blocks_per_seq: int, backend,
                extra: int = 0) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """A rank's cache and, for an 8-bit one, its scales (see allocate_kv_cache and
    set_up_8bit_cache): (cache, scales or None, whether the first prefill calibrates them)."""
    kv_cache = allocate_kv_cache(config, attn_layers, dtype, device, max_blocks_per_seq,
                                 log=rank == 0, extra=extra)
    if dtype.itemsize != 1:
        return kv_cache, None, False
    return kv_cache, *set_up_8bit_cache(config, rank, attn_layers, kv_cache, backend)
