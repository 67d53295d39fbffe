"""bench.py --structured-output: the schema on every request, and the unconstrained run of
the same prompts at the same lengths that the ratio is taken against."""
import time
from dataclasses import replace


# One string field: every token goes through the grammar, and an output ends once the model
# draws a closing quote (with random weights: lengths ~geometric, mean ~200 tokens). A
# "minLength" that kept outputs open to max_tokens was tried on the H100: 31.3 s against 6.5 s
# unconstrained (21%), ~30 ms a step; on CPU its fill + accept cost 4x a plain string's per
# row (xgrammar's counted repetition), so it measured the grammar, not the engine.
BENCH_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}},
                "required": ["text"]}


def same_lengths_unconstrained(llm, prompts, params, outputs, result: dict) -> None:
    """Time the same prompts without the schema, each run to the length its constrained output
    reached: a grammar that closes early shortens outputs, and fewer decode tokens per prompt
    would lower throughput by themselves, so only equal lengths compare the grammar's cost."""
    free = [replace(p, structured_outputs=None, max_tokens=max(1, len(o.outputs[0].token_ids)))
            for p, o in zip(params, outputs)]
    t = time.perf_counter()
    plain = llm.generate(prompts, free, use_tqdm=False)
    elapsed = time.perf_counter() - t
    total = sum(len(o.outputs[0].token_ids) for o in plain)
    result["unconstrained_same_lengths_tok_s"] = round(total / elapsed, 1)
    ratio = result["throughput_tok_s"] / result["unconstrained_same_lengths_tok_s"]
    result["structured_vs_unconstrained"] = round(ratio, 3)
    print(f"Unconstrained, same lengths: {total}tok, Time: {elapsed:.2f}s, "
          f"Throughput: {total / elapsed:.2f}tok/s (structured: {ratio:.1%} of it)")
