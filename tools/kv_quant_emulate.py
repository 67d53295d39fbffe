"""Emulate KV-cache quantization schemes on a real model before building them (CPU, torch path).

The engine runs with an fp32 model and an fp32 cache; the torch backend's store is patched to
round K/V through the scheme being tested (quantize, then dequantize back to fp32), q/k are
Hadamard-mixed as the fp8 cache mixes them, and a prefill without cached tokens attends to its
own K/V unquantized (as the engine's fp8 path does). Teacher-forced logprobs of real text are
compared with the plain fp32 cache (tools/fp8_accuracy.logprob_errors).

    PYTHONPATH=. python tools/kv_quant_emulate.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --schemes e4m3 int8k int8kv --text tools/fp8_text.txt
"""
import argparse

import torch

from nanovllm import LLM
from nanovllm.kernels import torch_ref
from nanovllm.layers import attention_backend
from nanovllm.layers.attention import Attention
from tools.fp8_accuracy import context_logits, logprob_errors, text_ids


def e4m3_row(x: torch.Tensor) -> torch.Tensor:
    """e4m3 with a per-(token, head) scale (a float format: the scale barely matters)."""
    s = x.abs().amax(-1, keepdim=True).clamp(min=1e-30) / 448.0
    return (x / s).to(torch.float8_e4m3fn).float() * s


def e4m3_head(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 with the engine's per-kv-head scale (calibrated: margin 8 x the first prefill)."""
    return torch_ref.dequantize(torch_ref.quantize(x, scale, torch.float8_e4m3fn), scale)


def int_row(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Symmetric integer with a per-(token, head) scale amax / (2^(bits-1) - 1)."""
    qmax = 2 ** (bits - 1) - 1
    s = x.abs().amax(-1, keepdim=True).clamp(min=1e-30) * (1.0 / qmax)  # as quantize_rows
    return torch.round(x / s).clamp(-qmax, qmax) * s


SCHEMES = {
    # name: (K rounding, V rounding); None keeps fp32.
    "e4m3": (e4m3_row, e4m3_row),
    "int8k": (int_row, e4m3_row),
    "int8kv": (int_row, int_row),
    "int8k_only": (int_row, None),
    "int8v_only": (None, int_row),
    "e4m3k_only": (e4m3_row, None),
    "e4m3v_only": (None, e4m3_row),
    "bf16": (lambda x: x.bfloat16().float(), lambda x: x.bfloat16().float()),
}


def patch(backend, scheme: str, mix: bool) -> None:
    """Make the torch backend store K/V rounded by `scheme` and attend as the fp8 path does."""
    fk, fv = SCHEMES[scheme]
    backend.mix_kv = mix
    store = backend.store_kv

    def store_kv(k, v, k_cache, v_cache, ctx, k_scale=None, v_scale=None, k_feedback=None):
        k = k.float() if fk is None else fk(k.float())
        v = v.float() if fv is None else fv(v.float())
        store(k, v, k_cache, v_cache, ctx)

    backend.store_kv = store_kv
    backend.prefill = own_kv_prefill


def own_kv_prefill(q, k, v, k_cache, v_cache, ctx, scale, k_scale=None, v_scale=None):
    """The torch backend's prefill as the fp8 path runs it: a prefill without cached tokens
    attends to its own K/V unquantized."""
    tables = ctx.block_tables
    if not ctx.has_cached_context:
        k_cache, v_cache, tables = attention_backend.chunk_as_cache(k, v, ctx)
    return torch_ref.prefill_attention_torch(q, k_cache, v_cache, ctx.cu_seqlens_q,
                                             ctx.cu_seqlens_k, tables, scale)


def report(path: str, name: str, err: dict) -> None:
    """One line of logprob_errors' figures."""
    print(f"{path} {name}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in err.items()), flush=True)


def teacher_forced(model: str, ids: list[int], setup=None, kv: str = "auto") -> torch.Tensor:
    """context_logits of ids (first half prefilled) with an fp32 model on the CPU and a
    `kv` cache; setup(runner), when given, patches the runner first."""
    llm = LLM(model, dtype="float32", kv_cache_dtype=kv, device="cpu", enforce_eager=True,
              kvcache_block_size=64, max_model_len=len(ids) + 8,
              num_kvcache_blocks=-(-len(ids) // 64) + 1)
    try:
        if setup is not None:
            setup(llm.clients[0].core.executor.runner)
        return context_logits(llm, ids, len(ids) // 2)
    finally:
        llm.shutdown()


def run(model: str, ids: list[int], scheme: str | None, mix: bool, kv: str = "auto"):
    """teacher_forced with the plain fp32 cache (scheme None, kv "auto"), an emulated scheme,
    or the engine's own kv_cache_dtype `kv`."""
    def setup(runner):
        if scheme is not None:
            layer = next(m for m in runner.model.modules() if isinstance(m, Attention))
            patch(layer.backend, scheme, mix)
        elif kv != "auto":
            runner.attn_layers[0].backend.mix_kv = mix

    return teacher_forced(model, ids, setup, kv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--text", action="append", default=[])
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--schemes", nargs="+", default=["e4m3", "int8k", "int8kv"])
    ap.add_argument("--no-mix", action="store_true")
    ap.add_argument("--engine-fp8", action="store_true", help="also the engine's fp8_e4m3")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for path in args.text or ["tools/fp8_text.txt"]:
        ids = text_ids(args.gguf, path)[:args.max_tokens]
        ref = run(args.gguf, ids, None, False)
        runs = [(s, not args.no_mix, "auto") for s in args.schemes]
        if args.engine_fp8:
            runs.append((None, not args.no_mix, "fp8_e4m3"))
        for scheme, mix, kv in runs:
            got = run(args.gguf, ids, scheme, mix, kv)
            report(path, f"{scheme or 'engine ' + kv} mix={mix}",
                   logprob_errors(ref, got, ids, len(ids) // 2))


if __name__ == "__main__":
    main()
