"""GPU micro-benchmark of the nanovllm attention kernels (Qwen3-0.6B shapes: 16 q / 8 kv heads,
d=128).

Usage: PYTHONPATH=. python tools/bench_kernels.py [--sweep] [--fp8 [BEST.json]] [--order] [--int8]
--order: only the decode kernel's launch orders (HEAD_FAST, longest first) on mixed lengths.
--fp8: only the decode kernel, bf16 vs fp8 caches (effective KV-read bandwidth = cache bytes
read / time, so an fp8 cache reading 2x the tokens per byte shows as the same GB/s at 2x speed).
--int8: only the decode kernel, bf16 vs fp8 vs int8 caches (row scales), with int8 tile variants.
--int8-mixed: fp8 vs int8 decode at mixed context lengths, int8 variants.
Times: 'ms' = triton.testing.do_bench median (L2 flushed, Python launch overhead included);
'graph' = do_bench_cudagraph median over calls rotating through enough distinct KV caches to
exceed the 50 MB L2 (how the engine runs decode: inside CUDA graphs, cold cache).
"""
import itertools
import sys

import torch
import triton
from triton.testing import do_bench, do_bench_cudagraph

from nanovllm.kernels import triton_decode, triton_prefill
from nanovllm.kernels.torch_ref import decode_attention_torch, prefill_attention_torch
from nanovllm.kernels.triton_decode import choose_num_splits, decode_attention
from nanovllm.kernels.triton_kv import store_kvcache
from nanovllm.kernels.triton_prefill import prefill_attention

H, HKV, D, BS = 16, 8, 128, 256
DT = torch.bfloat16


def make_decode(batch, ctx):
    nblk = triton.cdiv(ctx, BS)
    k_cache = torch.randn(batch * nblk, BS, HKV, D, dtype=DT, device="cuda")
    v_cache = torch.randn_like(k_cache)
    bt = torch.randperm(batch * nblk, device="cuda").int().view(batch, nblk)  # scattered pages
    q = torch.randn(batch, H, D, dtype=DT, device="cuda")
    ctx_t = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, ctx_t, bt, D ** -0.5


def kv_bytes(batch, ctx):
    return batch * ctx * HKV * D * 2 * 2 + 2 * batch * H * D * 2


def rotating_cases(batch, ctx):
    """Enough independent inputs that one pass over them (>= 256 MB) cannot live in L2."""
    copies = min(64, triton.cdiv(2 ** 28, kv_bytes(batch, ctx)))
    return [make_decode(batch, ctx) for _ in range(copies)]


def graph_ms(cases, **kw):
    """CUDA-graph timing of decode_attention, each captured call on the next case."""
    it = itertools.cycle(cases)
    return do_bench_cudagraph(lambda: decode_attention(*next(it), **kw), return_mode="median")


def bench_decode():
    copy = torch.empty(2 ** 29, dtype=torch.uint8, device="cuda")
    ms = do_bench(lambda: copy.clone(), return_mode="median")
    print(f"copy bandwidth (read+write 512MiB): {2 * copy.numel() / ms / 1e6:.0f} GB/s")
    copy = None
    print("\n== decode (block 256, bf16, 16/8/128) ==")
    print(f"{'batch':>5} {'ctx':>5} {'splits':>6} {'ms':>8} {'GB/s':>7} {'graph ms':>9} "
          f"{'graph GB/s':>10} {'torch ms':>9}")
    for batch in (1, 32, 256):
        for ctx in (512, 1024, 2048, 4096):
            cases = rotating_cases(batch, ctx)
            args = cases[0]
            ms = do_bench(lambda: decode_attention(*args), return_mode="median")
            gms = graph_ms(cases)
            tms = float("nan")
            if batch <= 32 and ctx == 1024:
                tms = do_bench(lambda: decode_attention_torch(*args), rep=50, return_mode="median")
            gb = kv_bytes(batch, ctx)
            print(f"{batch:>5} {ctx:>5} {choose_num_splits(batch, HKV):>6} {ms:8.4f} "
                  f"{gb / ms / 1e6:7.0f} "
                  f"{gms:9.4f} {gb / gms / 1e6:10.0f} {tms:9.3f}")
            args = cases = None


def sweep_decode():
    """Split counts and tile configs on a few representative shapes."""
    print("\n== decode split sweep (graph GB/s) ==")
    for batch, ctx in ((1, 1024), (1, 4096), (8, 2048), (32, 1024), (64, 1024), (128, 1024),
                       (256, 512)):
        cases = rotating_cases(batch, ctx)
        row = []
        for s in (1, 2, 4, 8, 16, 32, 64):
            row.append(f"{s}:{kv_bytes(batch, ctx) / graph_ms(cases, num_splits=s) / 1e6:.0f}")
        print(f"b={batch:<3} ctx={ctx:<5} default={choose_num_splits(batch, HKV):<3} "
              + " ".join(row))
        cases = None
    print("\n== decode config sweep (graph GB/s, default splits) ==")
    base = dict(triton_decode.CONFIG)
    shapes = ((1, 4096), (32, 1024), (128, 1024), (256, 2048))
    all_cases = [rotating_cases(b, c) for b, c in shapes]
    for bn, warps, stages in ((64, 4, 3), (128, 4, 2), (32, 4, 3), (64, 4, 2), (128, 4, 3),
                              (128, 8, 3), (64, 8, 3)):
        triton_decode.CONFIG.update(BLOCK_N=bn, num_warps=warps, num_stages=stages)
        row = []
        for (b, c), cases in zip(shapes, all_cases):
            try:
                row.append(f"b{b}/c{c}:{kv_bytes(b, c) / graph_ms(cases) / 1e6:.0f}")
            except Exception as e:  # e.g. out of shared memory
                row.append(f"b{b}/c{c}:ERR({type(e).__name__})")
        print(f"BN={bn:<3} warps={warps} stages={stages}  " + " ".join(row))
    triton_decode.CONFIG.clear()
    triton_decode.CONFIG.update(base)
    all_cases = None
    print("\n== prefill config sweep (TFLOP/s) ==")
    base = dict(triton_prefill.CONFIG)
    triton_prefill.SHORT_Q = -1  # sweep one config for every length
    for bm, bn, warps, stages in ((128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3),
                                  (128, 64, 4, 3), (128, 128, 8, 3), (64, 128, 4, 2),
                                  (128, 64, 8, 4)):
        triton_prefill.CONFIG.update(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
        row = []
        for name, seqs, bs in PREFILL_CASES[:3]:
            try:
                row.append(f"{name}:{prefill_case(seqs, bs)[1]:.0f}")
            except Exception as e:
                row.append(f"{name}:ERR({type(e).__name__})")
        print(f"BM={bm:<3} BN={bn:<3} warps={warps} stages={stages}  " + "  ".join(row))
    triton_prefill.CONFIG.clear()
    triton_prefill.CONFIG.update(base)
    triton_prefill.SHORT_Q = 512


PREFILL_CASES = (("4x2048 fresh", [(2048, 2048)] * 4, 256),
                 ("16x512 fresh", [(512, 512)] * 16, 256),
                 ("8x512 chunk@4096", [(512, 4096)] * 8, 256),
                 ("4x2048 fresh bs16", [(2048, 2048)] * 4, 16))


def prefill_inputs(seqs, bs):
    nblk = [triton.cdiv(sk, bs) for _, sk in seqs]
    k_cache = torch.randn(sum(nblk), bs, HKV, D, dtype=DT, device="cuda")
    v_cache = torch.randn_like(k_cache)
    bt = torch.randperm(sum(nblk), device="cuda").int().view(len(seqs), -1)
    q = torch.randn(sum(sq for sq, _ in seqs), H, D, dtype=DT, device="cuda")
    cu_q = torch.tensor([0] + [sq for sq, _ in seqs]).cumsum(0).int().cuda()
    cu_k = torch.tensor([0] + [sk for _, sk in seqs]).cumsum(0).int().cuda()
    return q, k_cache, v_cache, cu_q, cu_k, bt, D ** -0.5


def prefill_case(seqs, bs):
    """(ms, TFLOP/s, args) of the Triton prefill kernel; causal FLOPs = 4*D per visible (q, k)
    pair."""
    args = prefill_inputs(seqs, bs)
    ms = do_bench(lambda: prefill_attention(*args, max(sq for sq, _ in seqs)), return_mode="median")
    pairs = sum(sq * (sk - sq) + sq * (sq + 1) / 2 for sq, sk in seqs)
    return ms, 4 * D * H * pairs / ms / 1e9, args


def bench_prefill():
    print("\n== prefill (16/8/128, bf16) ==")
    print(f"{'case':>20} {'ms':>8} {'TFLOP/s':>8} {'torch ms':>9} {'sdpa ms':>8}")
    for name, seqs, bs in PREFILL_CASES:
        ms, tflops, args = prefill_case(seqs, bs)
        tms = do_bench(lambda: prefill_attention_torch(*args), rep=50, return_mode="median")
        sdpa = float("nan")
        if all(sq == sk for sq, sk in seqs):  # dense flash SDPA on contiguous K/V as a yardstick
            b, s = len(seqs), seqs[0][0]
            qd = torch.randn(b, H, s, D, dtype=DT, device="cuda")
            kd = torch.randn(b, H, s, D, dtype=DT, device="cuda")
            sdpa = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                qd, kd, kd, is_causal=True), return_mode="median")
        print(f"{name:>20} {ms:8.4f} {tflops:8.1f} {tms:9.3f} {sdpa:8.4f}")


def bench_store():
    print("\n== store_kvcache (8/128 bf16) ==")
    for t in (256, 8192):
        k = torch.randn(t, HKV, D, dtype=DT, device="cuda")
        v = torch.randn_like(k)
        kc = torch.empty(t // 16 + 16, BS, HKV, D, dtype=DT, device="cuda")
        vc = torch.empty_like(kc)
        slots = torch.randperm(kc.shape[0] * BS, device="cuda")[:t].int()
        ms = do_bench(lambda: store_kvcache(k, v, kc, vc, slots), return_mode="median")
        print(f"tokens={t:<5} {ms * 1e3:8.1f} us  {4 * k.numel() * 2 / ms / 1e6:6.0f} GB/s")


def fp8_case(batch, ctx, dtype):
    """make_decode's case with its cache quantized to `dtype` (unit scales; values ~N(0, 1))."""
    q, k_cache, v_cache, ctx_t, bt, scale = make_decode(batch, ctx)
    ones = torch.ones(HKV, device="cuda")
    return (q, k_cache.to(dtype), v_cache.to(dtype), ctx_t, bt, scale, None, None, ones, ones)


FP8_SHAPES = ((1, 4096), (32, 1024), (64, 2048), (128, 1024), (256, 1024), (256, 2048))
FP8_SWEEP = ((64, 4, 3), (64, 4, 4), (64, 4, 5), (128, 4, 2), (128, 4, 3), (128, 4, 4),
             (128, 8, 3), (256, 4, 2), (256, 8, 2), (256, 8, 3))


def bench_decode_fp8(json_path=None):
    """Decode kernel, bf16 vs fp8 caches (do_bench: L2 flushed, launch included); then an fp8
    tile sweep. Effective KV-read bandwidth = cache bytes read / time. Writes the fastest fp8
    config on the large-batch shapes (where the benchmark spends its decode time) to json_path."""
    # do_bench rather than graph timing: do_bench_cudagraph hit illegal addresses here on
    # 256-sequence cases (the engine's own graphs run the same kernel fine).
    print("\n== decode, bf16 vs fp8_e4m3 cache (block 256, 16/8/128) ==", flush=True)
    bf_ms, totals = {}, {}
    cfg0 = dict(triton_decode.CONFIG_FP8)
    variants = [("default", {}), ("bf16-dot", dict(FP16_DOT=False))] + [
        (f"BN{bn}/w{w}/s{st}", dict(BLOCK_N=bn, num_warps=w, num_stages=st))
        for bn, w, st in FP8_SWEEP]
    for batch, ctx in FP8_SHAPES:
        args = make_decode(batch, ctx)
        bf_ms[batch, ctx] = do_bench(lambda: decode_attention(*args), return_mode="median")
        kv = batch * ctx * HKV * D * 2
        args = None
        args = fp8_case(batch, ctx, torch.float8_e4m3fn)
        row = []
        for name, cfg in variants:
            triton_decode.CONFIG_FP8.update(cfg0, **cfg)
            try:
                ms = do_bench(lambda: decode_attention(*args), return_mode="median")
                row.append(f"{name}:{ms * 1e3:.0f}us/{kv / ms / 1e6:.0f}GB/s/"
                           f"x{bf_ms[batch, ctx] / ms:.2f}")
                if batch >= 64:
                    totals[name] = totals.get(name, 0.0) + ms
            except Exception as e:  # e.g. out of shared memory
                row.append(f"{name}:ERR({type(e).__name__})")
                totals[name] = float("inf")
        triton_decode.CONFIG_FP8.update(cfg0)
        args = None
        print(f"b={batch:<4} ctx={ctx:<5} bf16:{bf_ms[batch, ctx] * 1e3:.0f}us/"
              f"{2 * kv / bf_ms[batch, ctx] / 1e6:.0f}GB/s  "
              + "  ".join(row), flush=True)
    best = min(totals, key=totals.get)
    print(f"fastest fp8 config on b>=64: {best}")
    if json_path:
        import json

        cfg = dict(cfg0, **dict(variants)[best])
        with open(json_path, "w") as f:
            json.dump(cfg, f)


def int8_case(batch, ctx):
    """make_decode's case with its cache as int8 codes and head-major row scales (the engine's
    layout, worker/kv_cache.allocate_row_scales)."""
    from nanovllm.kernels.torch_ref import quantize_rows

    q, k_cache, v_cache, ctx_t, bt, scale = make_decode(batch, ctx)
    out = []
    for cache in (k_cache, v_cache):
        codes, scales = quantize_rows(cache)
        out += [codes, scales.transpose(1, 2).contiguous().transpose(1, 2)]
    return (q, out[0], out[2], ctx_t, bt, scale, None, None, out[1], out[3])


INT8_SWEEP = ((64, 4, 4), (128, 4, 3))


def bench_decode_int8():
    """Decode kernel, bf16 vs fp8_e4m3 vs int8 caches at the bench's shapes (do_bench), then
    int8 tile variants; GB/s = bytes of K/V codes read (scales not counted) / time."""
    print("\n== decode, bf16 vs fp8_e4m3 vs int8 cache (block 256, 16/8/128) ==", flush=True)
    cfg0 = dict(triton_decode.CONFIG_INT8)
    variants = [("default", {}), ("fp16-dots", dict(FP16_DOT=True))] + [
        (f"BN{bn}/w{w}/s{st}", dict(BLOCK_N=bn, num_warps=w, num_stages=st))
        for bn, w, st in INT8_SWEEP]
    totals = {}
    for batch, ctx in FP8_SHAPES:
        kv = batch * ctx * HKV * D * 2
        args = make_decode(batch, ctx)
        bf = do_bench(lambda: decode_attention(*args), return_mode="median")
        args = fp8_case(batch, ctx, torch.float8_e4m3fn)
        f8 = do_bench(lambda: decode_attention(*args), return_mode="median")
        args = int8_case(batch, ctx)
        row = []
        for name, cfg in variants:
            triton_decode.CONFIG_INT8.update(cfg0, **cfg)
            try:
                ms = do_bench(lambda: decode_attention(*args), return_mode="median")
                row.append(f"{name}:{ms * 1e3:.0f}us/{kv / ms / 1e6:.0f}GB/s")
                if batch >= 64:
                    totals[name] = totals.get(name, 0.0) + ms
            except Exception as e:  # e.g. out of shared memory
                row.append(f"{name}:ERR({type(e).__name__})")
                totals[name] = float("inf")
        triton_decode.CONFIG_INT8.update(cfg0)
        args = None
        print(f"b={batch:<4} ctx={ctx:<5} bf16:{bf * 1e3:.0f}us fp8:{f8 * 1e3:.0f}us/"
              f"{kv / f8 / 1e6:.0f}GB/s  int8 " + "  ".join(row), flush=True)
    print(f"fastest int8 config on b>=64: {min(totals, key=totals.get)}")


def bench_decode_order():
    """Launch order of the decode programs (HEAD_FAST grid, longest-first `order`) on batches
    of mixed context lengths, bf16 and fp8 caches; effective GB/s = bytes of the contexts read."""
    print("\n== decode launch order (do_bench, L2 flushed; ctx: uniform in [lo, hi]) ==",
          flush=True)
    base, base8 = dict(triton_decode.CONFIG), dict(triton_decode.CONFIG_FP8)
    variants = (("seq", False, False), ("seq+lpt", False, True), ("head", True, False),
                ("head+lpt", True, True))
    for batch, lo, hi in ((256, 2048, 2048), (256, 100, 2048), (128, 100, 2048), (64, 100, 2048)):
        q, k_cache, v_cache, _, bt, scale = make_decode(batch, hi)
        g = torch.Generator().manual_seed(batch)
        ctx = torch.randint(lo, hi + 1, (batch,), generator=g).int().cuda()
        order = torch.argsort(ctx, descending=True).int()
        tokens = int(ctx.sum())
        for name, dtype in (("bf16", DT), ("fp8", torch.float8_e4m3fn)):
            kc, vc = (k_cache, v_cache) if dtype == DT else (k_cache.to(dtype), v_cache.to(dtype))
            ones = torch.ones(HKV, device="cuda")
            scales = dict(k_scale=ones, v_scale=ones) if dtype != DT else {}
            nbytes = tokens * HKV * D * 2 * kc.element_size()
            row = []
            for label, head_fast, lpt in variants:
                for cfg in (triton_decode.CONFIG, triton_decode.CONFIG_FP8):
                    cfg.update(HEAD_FAST=head_fast, LPT=lpt)
                kw = dict(scales, order=order)
                ms = do_bench(lambda: decode_attention(q, kc, vc, ctx, bt, scale, **kw),
                              return_mode="median")
                row.append(f"{label}:{ms * 1e3:.0f}us/{nbytes / ms / 1e6:.0f}GB/s")
            print(f"b={batch:<4} ctx={lo}-{hi} {name}: " + "  ".join(row), flush=True)
            kc = vc = None
        q = k_cache = v_cache = None
    triton_decode.CONFIG.update(base)
    triton_decode.CONFIG_FP8.update(base8)


def bench_decode_int8_mixed():
    """int8 vs fp8 decode at mixed context lengths (the bench's spread), the engine's configs
    (head-fast grid, longest first) and int8 variants."""
    from nanovllm.kernels.torch_ref import quantize_rows

    print("\n== decode, mixed lengths (ctx uniform in [lo, hi]): fp8 vs int8 ==", flush=True)
    cfg0 = dict(triton_decode.CONFIG_INT8)
    # s1 / s2: fewer loads in flight (tools/kernel_ir.py: at 5 stages int8's loop makes 17
    # async copies, fp8's 11: the row scales and their page lookups are pipelined too).
    variants = [("default", {}), ("s1", dict(num_stages=1)), ("s2", dict(num_stages=2)),
                ("fp16-dots", dict(FP16_DOT=True)),
                ("BN32", dict(BLOCK_N=32))]
    for batch, lo, hi in ((256, 100, 1100), (256, 600, 600), (256, 2048, 2048), (128, 100, 2048)):
        q, k_cache, v_cache, _, bt, scale = make_decode(batch, hi)
        g = torch.Generator().manual_seed(batch)
        ctx = torch.randint(lo, hi + 1, (batch,), generator=g).int().cuda()
        order = torch.argsort(ctx, descending=True).int()
        nbytes = int(ctx.sum()) * HKV * D * 2
        ones = torch.ones(HKV, device="cuda")
        kc, vc = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
        f8 = do_bench(lambda: decode_attention(q, kc, vc, ctx, bt, scale, k_scale=ones,
                                               v_scale=ones, order=order), return_mode="median")
        kc = vc = None
        codes = []
        for cache in (k_cache, v_cache):
            c, sc = quantize_rows(cache)
            codes += [c, sc.transpose(1, 2).contiguous().transpose(1, 2)]
        row = []
        for name, cfg in variants:
            triton_decode.CONFIG_INT8.update(cfg0, **cfg)
            ms = do_bench(lambda: decode_attention(q, codes[0], codes[2], ctx, bt, scale,
                                                   k_scale=codes[1], v_scale=codes[3],
                                                   order=order), return_mode="median")
            row.append(f"{name}:{ms * 1e3:.0f}us/{nbytes / ms / 1e6:.0f}GB/s")
        triton_decode.CONFIG_INT8.update(cfg0)
        print(f"b={batch:<4} ctx={lo}-{hi} fp8:{f8 * 1e3:.0f}us/{nbytes / f8 / 1e6:.0f}GB/s  "
              "int8 " + "  ".join(row), flush=True)
        q = k_cache = v_cache = codes = None


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__)
    if "--order" in sys.argv:
        bench_decode_order()
        sys.exit(0)
    if "--int8-mixed" in sys.argv:
        bench_decode_int8_mixed()
        sys.exit(0)
    if "--int8" in sys.argv:
        bench_decode_int8()
        sys.exit(0)
    if "--fp8" in sys.argv:
        bench_decode_fp8(sys.argv[sys.argv.index("--fp8") + 1] if sys.argv[-1] != "--fp8"
                         else None)
        sys.exit(0)
    bench_decode()
    bench_store()
    bench_prefill()
    if "--sweep" in sys.argv:
        sweep_decode()
