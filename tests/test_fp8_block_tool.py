"""tools/fp8_block_checkpoint.quantize_blocks: Qwen's block-scaled fp8 as nanovllm reads it
(each block's largest |w| at 448; values x scales within e4m3's rounding of w)."""
import torch

from nanovllm.layers.quant.fp8 import dequantize
from tools.fp8_block_checkpoint import quantize_blocks


def test_blocks_scale_to_448_and_dequantize_near_the_weight():
    w = torch.randn(200, 300, generator=torch.Generator().manual_seed(0))
    w[64:128, 128:256] = 0  # an all-zero block keeps a usable scale
    values, scale = quantize_blocks(w, 64, 128)
    assert values.dtype == torch.float8_e4m3fn and values.shape == w.shape
    assert scale.shape == (4, 3) and scale[1, 1] == 1
    tops = torch.zeros(4, 3)
    for i in range(4):
        for j in range(3):
            tops[i, j] = values[i * 64:(i + 1) * 64, j * 128:(j + 1) * 128].float().abs().max()
    assert torch.equal(tops[torch.arange(4) != 1], torch.full((3, 3), 448.0))
    back = dequantize(values, scale, (64, 128))
    # e4m3 keeps 3 mantissa bits: a value rounds within 1/16 of itself, or of the smallest
    # normal step (2^-9 of the block's scale) near zero.
    bound = (w.abs() / 16).maximum(2.0 ** -9 * scale.repeat_interleave(64, 0)[:200]
                                   .repeat_interleave(128, 1)[:, :300])
    assert ((back - w).abs() <= bound).all()
