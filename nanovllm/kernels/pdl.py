"""Programmatic dependent launch (PDL; compute capability 9.0+) for a decode layer's chain of
small kernels: RMSNorm, the GEMV (kernels/gemv.py), the RoPE store, decode attention,
SiLU·mul (a launch per op: models too large for the one-launch layer kernel, or batches of
two and more; a cuBLAS call in between just breaks the chain there). A kernel launched with
PDL may start while the one before it in the stream is still running: it issues what does
not depend on that kernel (the GEMV's first weight tile), then `gdc_wait` blocks until that
kernel has finished and its writes are visible. `gdc_launch_dependents` lets the next PDL
kernel start early in turn. Launch gaps and the first DRAM round trip then overlap the
previous kernel instead of following it (at batch 1 every kernel is a few µs, so those gaps
are a fixed share of the token).

On by default; NANOVLLM_PDL=0 turns it off. H200, Qwen3-8B shape at batch 1 (bench.py
--single), off / on: fp8 weights 355 / 382 tok/s, bf16 236 / 248; bench.py within 1%
either way (its large batches run cuBLAS between the small kernels). The GEMV releases the
next launch after its K loop (gemv.PDL_EARLY_RELEASE), the small kernels at their start.
Before their wait, kernels load what the host wrote (the norm's weight, RoPE's positions and
cos / sin rows, decode's row order and lengths): 8B batch 1 +1.3% (fp8 387 -> 392 tok/s).
Safe because no kernel of the chain writes those (they come from weights or the step's copies).
The skinny GEMM (3-16 rows) launches without it: with it (a wait before its K loop, the
release after) the 8B fp8 shape lost 1% at 4 and 16 sequences (1,136 / 1,125, 4,341 / 4,297).
Correctness does not depend on the order of kernels launched with and without it: a kernel
without PDL waits for its predecessor as always, and gdc_wait waits for the whole previous
grid.
"""
import functools
import os

import torch
import triton
import triton.language as tl

from nanovllm.kernels._common import INTERPRET

try:  # (a Triton without them: PDL stays off, and no kernel reaches these names)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    _HAS_GDC = True
except ImportError:
    _HAS_GDC = False

ON = os.environ.get("NANOVLLM_PDL", "1") != "0" and _HAS_GDC


@functools.lru_cache(maxsize=None)
def _hopper_or_later(index: int) -> bool:
    # (ROCm reports its own architecture numbers through the same call: NVIDIA only)
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9


def enabled(t: torch.Tensor) -> bool:
    """Whether kernels writing to t's device launch with PDL: the knob (ON), a GPU of compute
    capability 9.0 or later, not the interpreter."""
    return ON and not INTERPRET and t.is_cuda and _hopper_or_later(t.device.index or 0)


def launch_kwargs(on: bool) -> dict:
    """The launch option that makes Triton set the PDL launch attribute (and emit the
    griddepcontrol instructions), or nothing."""
    return {"launch_pdl": True} if on else {}


@triton.jit
def release_next(GDC: tl.constexpr):
    """Let the next kernel in the stream launch now (its own gdc_wait keeps it correct)."""
    if GDC:
        gdc_launch_dependents()


@triton.jit
def wait_previous(GDC: tl.constexpr):
    """Block until the previous kernel in the stream has finished (a no-op without PDL)."""
    if GDC:
        gdc_wait()
