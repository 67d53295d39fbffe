#!/usr/bin/env bash
# Mixed steps on one GPU (issue 31 item 3): the GPU tests, one step's cost by chunk size, then
# bench.py and the HTTP serving benchmark with mixed steps on and off. Run from the repo root;
# bench_serve needs fastapi, uvicorn and httpx. Each line prints its own figures.
set -euo pipefail
python3 -m pytest -q -m gpu tests/engine/test_mixed_steps.py tests/layers/test_mixed_attention.py \
    tests/engine/test_async_scheduling.py tests/kernels/test_triton_attention.py
python3 tools/bench_mixed_step.py
python3 bench.py
python3 bench.py --no-enable-mixed-steps
python3 tools/bench_serve.py --mode offline
python3 tools/bench_serve.py --mode http
python3 tools/bench_serve.py --mode http --engine-args '{"enable_mixed_steps": false}'
python3 tools/bench_serve.py --mode http --engine-args '{"max_mixed_prefill_tokens": 1024}'
python3 tools/bench_serve.py --mode http --engine-args '{"max_mixed_prefill_tokens": 4096}'
