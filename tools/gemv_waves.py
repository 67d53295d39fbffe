"""How many waves each one-row GEMV launch of a model shape takes on an H100 / H200 (132 SMs),
from the registers the installed Triton gives its kernel compiled for sm_90 (no GPU needed).

    python tools/gemv_waves.py [--model-shape qwen3-8b] [--sms 132]

Every program of the GEMV (kernels/gemv.py) walks all of K, so a grid that fits the GPU at once
takes one program's time and one that does not takes two: the 8B's fp8 gate_up went 24.6 ->
30.2 us on an H200 when its registers went 40 -> 50 (docs/PERF_NOTES.md, sixty-sixth
session). Compiler versions differ (Triton 3.6 gives that kernel 40, 3.9 gives 47), so run this
after an upgrade; gemv.ONE_WAVE caps registers at one wave's share where it matters.
"""
import argparse
import os
import subprocess
import sys
import tempfile

if __name__ == "__main__":  # (kernels compiled, not interpreted; imported by a test, as is)
    os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from nanovllm.kernels import gemv  # noqa: E402
from nanovllm.utils.model_shapes import SHAPES, linear_shapes  # noqa: E402


def compile_one_row(n: int, k: int, fp8: bool, gated: bool):
    """The one-row GEMV for W [n, k] (e4m3 with row scales, or bf16) as the engine launches it
    under PDL, compiled for sm_90; (its config, the compiled kernel)."""
    cfg = gemv.choose_config(n, k, 1 if fp8 else 2, 1)
    fn = gemv._gemv_kernel
    names = fn.arg_names
    const = dict(ROW_SCALED=fp8, BLOCK_SCALED=False, GROUP_SCALED=False, SCALE_BN=1,
                 SCALE_BK=1, HAS_BIAS=False, EVEN_K=k % cfg["BLOCK_K"] == 0, ROWS=1,
                 GROUP=cfg["GROUP"], W_EVICT=cfg["W_EVICT"], W_VEC=cfg["W_VEC"], PEEL=True,
                 GDC=2, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GATED=gated)
    ptrs = dict(x_ptr="*bf16", w_ptr="*fp8e4nv" if fp8 else "*bf16", s_ptr="*fp32",
                b_ptr="*bf16", y_ptr="*bf16")
    sig = {a: "constexpr" if a in const else ptrs.get(a, "i32") for a in names}
    ints = dict(N=n // 2 if gated else n, K=k, stride_xm=k, stride_ym=n, stride_wn=k)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names
             if a in ptrs or (ints.get(a, 0) % 16 == 0 and ints.get(a, 0))}
    src = ASTSource(fn, sig, constexprs={(names.index(a),): v for a, v in const.items()},
                    attrs=attrs)
    return cfg, triton.compile(src, target=GPUTarget("cuda", 90, 32),
                               options=dict(num_warps=cfg["num_warps"],
                                            num_stages=cfg["num_stages"]))


def registers(kernel) -> int:
    """Registers a thread, from the cubin (cuobjdump comes with Triton's wheel)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    return int(out.split("REG:")[1].split()[0])


def per_sm(regs: int, warps: int, shared: int) -> int:
    """Programs an SM holds: 32 at most, 64 warps, 65,536 registers (eight a thread at a
    time), 227 KB of shared memory (1 KB a program reserved)."""
    by_regs = 65536 // (-(-regs // 8) * 8 * 32 * warps)
    return min(32, 64 // warps, by_regs, 232448 // (shared + 1024))


def main():
    """A line per layer and weight kind: tile, programs, registers, programs an SM, waves."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-shape", choices=list(SHAPES), default="qwen3-8b")
    ap.add_argument("--sms", type=int, default=132)
    args = ap.parse_args()
    print("triton", triton.__version__, "sm_90,", args.sms, "SMs")
    for layer, (n, k) in linear_shapes(args.model_shape).items():
        for fp8 in (True, False):
            if layer == "lm_head" and fp8:
                continue
            gated = layer == "gate_up"
            cfg, kernel = compile_one_row(n, k, fp8, gated)
            programs = triton.cdiv(n, cfg["BLOCK_N"])
            regs = registers(kernel)
            fit = per_sm(regs, cfg["num_warps"], kernel.metadata.shared)
            print(f"{layer:8s} {'fp8 ' if fp8 else 'bf16'} tile ({cfg['BLOCK_N']}, "
                  f"{cfg['BLOCK_K']}): {programs:5d} programs, {regs:3d} registers, {fit:2d} an "
                  f"SM, {programs / (fit * args.sms):.2f} waves (one-wave cap "
                  f"{gemv.one_wave_regs(programs, cfg['num_warps'], args.sms) or '-'})",
                  flush=True)


if __name__ == "__main__":
    main()
