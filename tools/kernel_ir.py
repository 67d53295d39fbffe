"""Compile the paged decode kernel for an H100 (sm_90) on any machine, GPU or not, and count
what the compiler made of its loop: async copies (software pipelining through shared memory),
barriers, global loads. Triton's wheel carries ptxas, so no CUDA device is needed.

    python tools/kernel_ir.py [--cache bf16|fp8|int8] [--stages N] [--dump DIR]
                              [--sass]

Pass the launch's specializations (done here): without the divisibility hints a launch
gives, no load vectorizes and the loop looks unpipelinable (a first try of this tool said so,
wrongly). With them (triton 3.9, bench.py's shapes): at 2-5 stages every cache's K/V tiles go
through shared memory by cp.async; at 5 stages bf16 and fp8 make 11 async copies in the loop,
int8 17 (its K and V row scales and their page lookups besides), 2669 PTX lines against
fp8's 2876; at 1 stage nothing is pipelined.

--sass counts the tile loop's SASS instructions (64 keys a loop): bf16 416 at 3 stages, fp8
669 at 5 (64 of them LDS.U8: V's 8-bit tile reaches the PV dot's registers a byte a load,
since the dot contracts over the keys and V's bytes lie dim after dim), int8 963. Fewer
instructions did not mean a faster kernel: V pages transposed (a dim's keys side by side)
cut fp8's loop to 468 and ran 11% slower on an H200 (docs/PERF_NOTES.md, 32nd session).
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from nanovllm.kernels import triton_decode  # noqa: E402

CACHE_PTR = {"bf16": "*bf16", "fp8": "*fp8e4nv", "int8": "*i8"}


def compile_decode(cache: str, stages: int, warps: int = 4, v_words: bool = False,
                   v_tile: int = 0, v_last: int = 0, fuse: bool = False, splits: int = 1,
                   gdc: bool = False):
    """The compiled kernel at bench.py's shapes (16 / 8 heads of 128, block 256, 64-key
    tiles, one split unless `splits`, the engine's launch order); fuse: with decode_rope's
    prologue (Qwen3's q/k norms); gdc: under PDL."""
    fn = triton_decode._decode_partial_kernel
    const = dict(NUM_SPLITS=splits, NUM_KV_HEADS=8, G=2, G_PAD=16, RED_GP=2, RED_CHUNK=16,
                 HEAD_DIM=128, BLOCK_SIZE=256, BLOCK_N=64, PAGE_TILE=True, USE_DOT=True,
                 DIRECT=splits == 1,
                 DOT_PREC="tf32", KV_FP8=cache == "fp8", FP16_DOT=cache == "fp8",
                 KV_INT8=cache == "int8", INT8_F16=False, PV_F32=False, HEAD_FAST=True,
                 ORDERED=True, V_WORDS=v_words and cache == "fp8", V_TILE=v_tile,
                 V_LAST=v_last, FUSE=fuse, QK_NORM=fuse, GDC=gdc)
    if not fuse:  # (the unfused launch passes None there)
        const.update(qw_ptr=None, kw_ptr=None)
    ptrs = dict(q_ptr="*bf16", k_cache_ptr=CACHE_PTR[cache], v_cache_ptr=CACHE_PTR[cache],
                ctx_ptr="*i32", bt_ptr="*i32", o_ptr="*bf16", lse_ptr="*fp32",
                out_ptr="*bf16", cnt_ptr="*i32", k_scale_ptr="*fp32", v_scale_ptr="*fp32",
                order_ptr="*i32", qkv_ptr="*bf16", pos_ptr="*i64", slot_ptr="*i32",
                cos_sin_ptr="*fp32", qw_ptr="*bf16", kw_ptr="*bf16")
    names = fn.arg_names
    sig = {n: "constexpr" if n in const else ptrs.get(n, "fp32" if n in ("qk_scale", "eps")
                                                      else "i32")
           for n in names}
    # What a launch specializes on: pointers and integers divisible by 16 are marked so
    # (without it no load vectorizes, and the loop looks unpipelinable), integers equal to 1
    # become constants. The integers are the engine's strides at these shapes.
    ints = dict(stride_qb=2048, stride_qh=128, stride_kblk=256 * 8 * 128, stride_kslot=8 * 128,
                stride_kh=128, stride_sblk=8 * 256, stride_sslot=1, stride_sh=256,
                stride_btb=16, stride_ob=2048, stride_oh=128, stride_os=0, stride_lb=0,
                stride_lh=0, stride_outb=2048, stride_outh=128, stride_qkv=4096)
    attrs, consts = {}, dict(const)
    for n in names:
        if (n in ptrs and n not in const) or (n in ints and ints[n] % 16 == 0 and ints[n]):
            attrs[(names.index(n),)] = [["tt.divisibility", 16]]
        if ints.get(n) == 1:
            sig[n], consts[n] = "constexpr", 1
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, num_stages=stages))


def loop_mix(cubin: bytes) -> tuple[int, collections.Counter]:
    """SASS instructions of the kernel's longest loop (a backward branch's span: the K/V
    tile loop), and their count by opcode; nvdisasm comes with Triton's wheel."""
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                            "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    labels, ops, loop = {}, [], (0, -1)
    for line in sass.splitlines():
        if m := re.match(r"\s*\.(L_x_\d+):", line):
            labels[m.group(1)] = len(ops)
        elif m := re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?);", line):
            text = re.sub(r"^@!?U?P\w+\s+", "", m.group(1))
            target = re.search(r"BRA\s.*?(L_x_\d+)", text)
            if target and labels.get(target.group(1), len(ops)) < len(ops):
                start = labels[target.group(1)]
                if len(ops) - start > loop[1] - loop[0]:
                    loop = (start, len(ops))
            ops.append(text.split()[0])
    body = ops[loop[0]: loop[1] + 1]
    return len(body), collections.Counter(body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", choices=sorted(CACHE_PTR), default="int8")
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3, 5])
    ap.add_argument("--sass", action="store_true",
                    help="also the tile loop's SASS instructions and their commonest opcodes")
    ap.add_argument("--dump", help="write each variant's TTGIR and PTX here")
    ap.add_argument("--v-words", action="store_true", help="fp8: V read as words (V_WORDS)")
    ap.add_argument("--v-tile", type=int, default=0, help="V pages tiled (V_TILE), e.g. 64")
    ap.add_argument("--v-last", type=int, default=0, help="V_TILE's last tile: decode_tiles")
    ap.add_argument("--fuse", action="store_true", help="decode_rope's prologue (FUSE_ROPE)")
    args = ap.parse_args()
    print("triton", triton.__version__)
    for stages in args.stages:
        k = compile_decode(args.cache, stages, v_words=args.v_words, v_tile=args.v_tile,
                           v_last=args.v_last, fuse=args.fuse)
        ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
        print(f"{args.cache} num_stages={stages}: async copies "
              f"{ttgir.count('async_copy_global_to_local')}, cp.async {ptx.count('cp.async')}, "
              f"bar.sync {ptx.count('bar.sync')}, ld.global {ptx.count('ld.global')}, "
              f"PTX lines {ptx.count(chr(10))}")
        if args.sass:
            n, mix = loop_mix(k.asm["cubin"])
            print(f"  tile loop: {n} SASS instructions; " +
                  ", ".join(f"{op} {c}" for op, c in mix.most_common(8)))
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            for ext, text in (("ttgir", ttgir), ("ptx", ptx)):
                with open(os.path.join(args.dump, f"{args.cache}_s{stages}.{ext}"), "w") as f:
                    f.write(text)


if __name__ == "__main__":
    main()
