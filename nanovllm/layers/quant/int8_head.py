"""An 8-bit copy of the LM head (opt-in: Config.lm_head_quantization="int8"): the head's weight
quantized at load to int8 codes with one fp32 scale per row and block of up to 128 columns, read
by the skinny GEMM in steps of up to 16 rows, where reading the head is a large share of a step
(the Qwen3-8B shape's bf16 head: 1.24 GB, ~0.41 ms of a ~4.2 ms token with fp8 layers; H100,
bench.py --single: 250.1 vs 239.8 tok/s, 1.60x bf16's 156.0 instead of 1.54x).

Why int8 in blocks, not e4m3: the head's rounding lands on the logits directly. On
SmolLM2-135M-Instruct (fp32, CPU, tools/fp8_text.txt teacher-forced against the unquantized
head): e4m3 with row scales mean / max |Δlogprob| 0.113 / 0.54, top-1 agreement 0.928; int8
with row scales 0.033 / 0.19, 0.985 (bf16's own rounding of the same matmul: 0.020); smaller
blocks cut it further. Codes are |c| <= 127, exact in bf16, so the kernel widens them to x's
dtype and applies each block's scale to its fp32 partial products.

Larger steps (prefills' last positions, batched decode) keep reading the checkpoint's head:
there the matmul is no longer bound by reading the weight, and a dequantizing pass would write
the head again. So the copy costs memory (+half the head's bf16 bytes) rather than replacing it.
"""
import torch
import torch.nn.functional as F

MAX_ROWS = 16  # the skinny GEMM's reach (kernels/skinny_gemm.MAX_M)
BLOCKS = (128, 64, 32, 16)  # the widest that divides K (tl.dot takes 16-column tiles)


def block_for(k: int) -> int:
    """Columns per scale block for a head of K columns."""
    block = next((b for b in BLOCKS if k % b == 0), None)
    assert block is not None, f"K={k}: Config checks hidden_size % 16"
    return block


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(codes int8 [N, K], scales fp32 [N, K / block], block): each row's blocks of `block`
    columns scaled so their largest magnitude maps to 127, rounded to nearest."""
    n, k = weight.shape
    block = block_for(k)
    codes = torch.empty(n, k, dtype=torch.int8, device=weight.device)
    scales = torch.empty(n, k // block, dtype=torch.float32, device=weight.device)
    # In slices of rows: the fp32 temporaries of a whole 150K-row head would be GiBs.
    for r in range(0, n, 8192):
        w = weight[r:r + 8192].float().view(-1, k // block, block)
        s = w.abs().amax(-1) / 127
        # An all-zero block keeps scale 0 (its codes are 0): divide by 1 there instead.
        q = torch.round(w / torch.where(s > 0, s, 1.0)[..., None]).clamp_(-127, 127)
        codes[r:r + 8192] = q.view(-1, k).to(torch.int8)
        scales[r:r + 8192] = s
    return codes, scales, block


def dequantize(codes: torch.Tensor, scales: torch.Tensor, block: int,
               dtype: torch.dtype) -> torch.Tensor:
    """codes * scale per block, rounded once to `dtype` (the reference the kernel matches)."""
    n, k = codes.shape
    w = codes.float().view(n, k // block, block) * scales[..., None]
    return w.view(n, k).to(dtype)


def matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
           block: int) -> torch.Tensor:
    """x @ dequantize(codes, scales)^T in x's dtype for up to MAX_ROWS rows: on a GPU the
    GEMV (up to kernels/gemv.INT8_HEAD_MAX_M rows) or the skinny GEMM, else the reference."""
    if x.is_cuda:  # imported here: CPU-only installs may have no triton
        from nanovllm.kernels import gemv
        from nanovllm.kernels.skinny_gemm import gemm

        if 0 < x.numel() <= gemv.INT8_HEAD_MAX_M * x.shape[-1]:
            return gemv.gemv(x, codes, scales, (1, block))
        return gemm(x, codes, scale=scales, block=(1, block))
    return F.linear(x, dequantize(codes, scales, block, x.dtype))
