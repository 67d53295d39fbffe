"""The memory-bandwidth floor of bench.py's workload for any --model-shape (no GPU needed).

The floor follows ../shared/PERF.md: every decode step reads the weights once and the whole
KV cache of every running sequence, and prefill runs at the matmul peak. For a mixture of
experts a step reads only the experts its tokens were routed to: with B sequences in a step,
each picking top_k of E experts, a layer reads E * (1 - (1 - top_k / E) ** B) experts on
average (uniform routing, which the random "dummy" router gives); with 256 sequences that is
every expert, with 1 it is top_k of them.

    python tools/model_floor.py --model-shape qwen3-30b-a3b --bandwidth 4.3e12
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.utils.model_shapes import SHAPES, shape_config  # noqa: E402


def workload(num_seqs=256, min_in=100, max_in=1024, min_out=100, max_out=1024):
    """bench.py's prompt lengths and output lengths (the same random draws)."""
    random.seed(0)
    lens = []
    for _ in range(num_seqs):
        n = random.randint(min_in, max_in)
        for _ in range(n):
            random.randint(0, 10000)  # the token ids: drawn, not needed
        lens.append(n)
    outs = [random.randint(min_out, max_out) for _ in range(num_seqs)]
    return lens, outs


def floor(cfg: dict, lens: list[int], outs: list[int], bandwidth: float, flops_peak: float,
          bytes_per_param: int = 2) -> dict:
    """Seconds and output tok/s of the floor, with the counts behind them."""
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    attn = h * (heads + 2 * kv) * d + heads * d * h
    # The vocabulary matrix is read once per step (the LM head; the embedding only by rows).
    vocab = h * cfg["vocab_size"]
    experts, top_k = cfg.get("num_experts", 0), cfg.get("num_experts_per_tok", 0)
    skip = set(cfg.get("mlp_only_layers") or [])
    step = cfg.get("decoder_sparse_step", 1)
    moe_layers = sum(1 for i in range(layers)
                     if experts and i not in skip and (i + 1) % step == 0)
    dense = vocab + layers * attn + (layers - moe_layers) * 3 * h * cfg["intermediate_size"]
    dense += moe_layers * h * experts  # the routers
    expert = 3 * h * cfg.get("moe_intermediate_size", 0)
    kv_token = 2 * kv * d * bytes_per_param * layers
    kv_reads = sum(o * n + o * (o - 1) // 2 for n, o in zip(lens, outs))
    # Decode step j runs the sequences with more than j outputs (all fit at once here).
    weight_reads, touched = 0.0, []
    for j in range(max(outs)):
        b = sum(o > j for o in outs)
        per_layer = experts * (1 - (1 - top_k / experts) ** b) if experts else 0.0
        touched.append(per_layer)
        weight_reads += dense + moe_layers * per_layer * expert
    active = dense + moe_layers * top_k * expert
    flops = 2 * active * (sum(lens) + sum(outs))
    total_bytes = kv_reads * kv_token + weight_reads * bytes_per_param
    seconds = total_bytes / bandwidth + flops / flops_peak
    # params_counted: everything a step may read (the vocabulary matrix once, every expert).
    out = dict(params_counted=dense + moe_layers * experts * expert, params_active=active,
               kv_bytes_per_token=kv_token, kv_token_reads=kv_reads, decode_steps=len(touched),
               weight_bytes_read=weight_reads * bytes_per_param,
               kv_bytes_read=kv_reads * kv_token, prefill_flops=flops,
               floor_s=seconds, floor_tok_s=sum(outs) / seconds)
    if experts:
        out["experts_touched_per_layer_first_step"] = touched[0]
        out["steps_touching_90pct_of_experts"] = sum(t >= 0.9 * experts for t in touched)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model-shape", choices=list(SHAPES), default="qwen3-0.6b")
    ap.add_argument("--bandwidth", type=float, default=3.0e12, help="bytes/s (H100: 3.0e12)")
    ap.add_argument("--flops", type=float, default=786e12, help="bf16 matmul FLOP/s")
    ap.add_argument("--num-seqs", type=int, default=256)
    args = ap.parse_args()
    lens, outs = workload(args.num_seqs)
    res = floor(shape_config(args.model_shape), lens, outs, args.bandwidth, args.flops)
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()},
                     indent=1))


if __name__ == "__main__":
    main()
