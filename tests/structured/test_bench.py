"""`nanovllm bench --structured-output`: the workload with a JSON schema on every request
(the H100 comparison with the unconstrained run); on the CPU, a tiny one."""
import argparse
import json
import random

from nanovllm.bench import add_bench_args, workload
from nanovllm.cli import main

WORKLOAD = ["--num-seqs", "3", "--min-input-len", "4", "--max-input-len", "8",
            "--min-output-len", "6", "--max-output-len", "9", "--max-model-len", "64",
            "--block-size", "16", "--enforce-eager", "--device", "cpu", "--dtype", "float32"]


def test_bench_with_a_schema_on_every_request(toy_models, tmp_path, capsys):
    result = tmp_path / "bench.json"
    state = random.getstate()  # the workload seeds the global `random`
    try:
        code = main(["bench", toy_models["tied_gqa4_d16_l4"], *WORKLOAD,
                     "--structured-output", "--json", str(result)])
        ap = argparse.ArgumentParser()
        add_bench_args(ap)
        _, params = workload(ap.parse_args(WORKLOAD), vocab=640)
    finally:
        random.setstate(state)
    assert code == 0, capsys.readouterr().err
    figures = json.loads(result.read_text())
    assert figures["structured_output"] is True
    # Every output starts {"text": " (at least 4 tokens) and may close before max_tokens.
    assert 3 * 4 <= figures["output_tokens"] <= sum(p.max_tokens for p in params)
    # The same prompts ran unconstrained to the same lengths, for the ratio the issue asks.
    assert figures["unconstrained_same_lengths_tok_s"] > 0
    assert figures["structured_vs_unconstrained"] == round(
        figures["throughput_tok_s"] / figures["unconstrained_same_lengths_tok_s"], 3)
