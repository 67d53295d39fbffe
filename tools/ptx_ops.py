"""Compile the decode kernel for Hopper (sm_90) on a machine without a GPU and count its PTX
instructions, per KV cache kind: a look at what a variant costs before a device is at hand
(conversions, loads, dots), and a check that it compiles at all.

    PYTHONPATH=. python tools/ptx_ops.py [--kinds bf16 fp8 int8 int8-fp16] [--all]

Pointers and integer strides are specialized as the JIT specializes them at the engine's
shapes (16-byte aligned, strides divisible by 16), so loads vectorize as they would there.
Counts are static instructions in the kernel body (the loop is unrolled over a tile, not over
the tiles), for 16 query / 8 kv heads, head_dim 128, blocks of 256, one split.
"""
import argparse
import collections
import os
import re

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, not the interpreter

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from nanovllm.kernels import triton_decode  # noqa: E402

KINDS = {  # name: (cache pointer type, KV_FP8, KV_INT8, FP16_DOT)
    "bf16": ("*bf16", False, False, False),
    "fp8": ("*fp8e4nv", True, False, True),
    "int8": ("*i8", False, True, False),
    "int8-fp16": ("*i8", False, True, True),
}
# The instructions that tell the variants apart (prefixes of PTX opcodes).
SHOWN = ("cvt.rn", "prmt", "sub.bf16", "add.f16", "or.b", "xor", "and.b", "mma", "ld.global",
         "cp.async.ca", "cp.async.cg", "ld.shared", "mul.f32", "div", "max.f32")


def compile_decode(kind: str):
    """The compiled decode kernel (direct, one split) for one cache kind."""
    cache, fp8, int8, fp16 = KINDS[kind]
    fn = triton_decode._decode_partial_kernel
    cfg = triton_decode.CONFIG_FP8 if fp8 else triton_decode.CONFIG_INT8 if int8 \
        else triton_decode.CONFIG
    consts = dict(NUM_SPLITS=1, NUM_KV_HEADS=8, G=2, G_PAD=16, RED_GP=2, RED_CHUNK=16, HEAD_DIM=128,
                  BLOCK_SIZE=256, BLOCK_N=cfg["BLOCK_N"], PAGE_TILE=True, USE_DOT=True,
                  DIRECT=True, DOT_PREC="tf32", KV_FP8=fp8, FP16_DOT=fp16, KV_INT8=int8,
                  INT8_F16=int8 and fp16, PV_F32=False, HEAD_FAST=True, ORDERED=True)
    types = {name: "*fp32" for name in fn.arg_names if name.endswith("_ptr")}
    types.update(q_ptr="*bf16", o_ptr="*bf16", out_ptr="*bf16", k_cache_ptr=cache,
                 v_cache_ptr=cache, ctx_ptr="*i32", bt_ptr="*i32", cnt_ptr="*i32",
                 order_ptr="*i32", qk_scale="fp32")
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            signature[name] = "constexpr"
            continue
        signature[name] = types.get(name, "i32")
        if name.endswith("_ptr") or name.startswith("stride_"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))


def opcodes(ptx: str) -> collections.Counter:
    """How many times each opcode appears in the PTX."""
    ops = collections.Counter()
    for line in ptx.splitlines():
        m = re.match(r"\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)", line)
        if m:
            ops[m.group(1)] += 1
    return ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--all", action="store_true", help="every opcode, not only SHOWN")
    args = ap.parse_args()
    counts = {kind: opcodes(compile_decode(kind).asm["ptx"]) for kind in args.kinds}
    names = sorted(set().union(*counts.values()))
    if not args.all:
        names = [n for n in names if n.startswith(SHOWN)]
    print(f"{'opcode':44s}" + "".join(f"{k:>11s}" for k in args.kinds))
    for name in names:
        print(f"{name:44s}" + "".join(f"{counts[k][name]:>11d}" for k in args.kinds))


if __name__ == "__main__":
    main()
