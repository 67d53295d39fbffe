"""What caps the skinny GEMM on fp8 weights at a few rows: the widening or the bytes.

    python tools/fp8_widen_check.py [--models qwen3-8b,qwen3-0.6b] [--m 1,16]

Per layer and M, µs of a call (each call reads another weight copy; one CUDA graph):
- fp8: today's kernel, e4m3 widened to bf16 by integer ops (_common.e4m3_to_bf16), bf16 dots;
- fp8/f16: the same weights with x in fp16: Triton's one cvt per two values, fp16 dots;
- bytes: bf16 weights of the same bytes ([N, K/2]) and tile bytes, no widening at all;
- cuBLAS: bf16 weights of the real shape (what fp8 weights replace).
The GB/s beside each counts the weight bytes alone (cuBLAS's: bf16's, twice fp8's).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels import skinny_config, skinny_gemm  # noqa: E402
from nanovllm.utils.model_shapes import linear_shapes  # noqa: E402
from tools.bench_gemm import make_weights, time_cublas, time_skinny  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen3-8b,qwen3-0.6b")
    ap.add_argument("--m", default="1,16")
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    for model in args.models.split(","):
        for name, (n, k) in linear_shapes(model).items():
            if name == "lm_head":
                continue
            fp8 = make_weights(n, k, "fp8_row")
            half = make_weights(n, k // 2, "bf16")
            wbytes = n * k
            cfg = skinny_config.choose_config(n, k, torch.float8_e4m3fn)
            cfg_half = dict(cfg, BLOCK_K=cfg["BLOCK_K"] // 2)
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                w0, s0, _ = fp8[0]
                ref = F.linear(x.float(), w0.float() * s0[:, None])
                y16 = skinny_gemm.gemm(x.half(), w0, None, s0).float()
                err = ((y16 - ref).abs().max() / ref.abs().max()).item()
                t = {"fp8": time_skinny(x, fp8), "fp8/f16": time_skinny(x.half(), fp8),
                     "bytes": time_skinny(x[:, :k // 2].contiguous(), half, cfg_half),
                     "cuBLAS": time_cublas(m, n, k)}
                cells = "  ".join(f"{key} {v * 1e3:5.1f} "
                                  f"({wbytes * (2 if key == 'cuBLAS' else 1) / v / 1e6:4.0f})"
                                  for key, v in t.items())
                print(f"{model:10s} {name:8s} N={n:5d} K={k:5d} M={m:2d}  {cells}  "
                      f"f16 rel err {err:.1e}", flush=True)
            del fp8, half
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
