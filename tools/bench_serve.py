"""Online serving benchmark: bench.py's workload (256 random prompts, temperature 0.6,
ignore_eos) sent as concurrent streaming requests.

    python tools/bench_serve.py --mode async   # AsyncLLM in this process, no HTTP
    python tools/bench_serve.py --mode http    # the OpenAI server in a child process,
                                               # streaming clients in --clients processes
    python tools/bench_serve.py --mode offline # LLM.generate on the same model directory

Reports output tok/s over the whole run, time to first token (TTFT) and time per output
token after the first (TPOT = (last - first) / (tokens - 1), per request) at p50/p99.

    python tools/bench_serve.py --mode http --request-rate 32   # Poisson arrivals (32/s on
                                                                # average) instead of a burst
    python tools/bench_serve.py --mode http --repeat 3   # one server, the workload sent 3
                                                         # times: each run, then the medians
"""
import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
from random import Random, randint, seed

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def workload(n: int, max_in: int, max_out: int) -> list[tuple[list[int], int]]:
    """bench.py's prompts and output lengths (same seed, same draws)."""
    seed(0)
    prompts = [[randint(0, 10000) for _ in range(randint(100, max_in))] for _ in range(n)]
    return [(p, randint(100, max_out)) for p in prompts]


def summary(records: list[tuple[float, float, float, int]], elapsed: float) -> dict:
    """records: (start, first token, last token, tokens) per request."""
    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    ttft = [f - s for s, f, _, _ in records]
    tpot = [(last - f) / (n - 1) for _, f, last, n in records if n > 1]
    total = sum(n for *_, n in records)
    return {"requests": len(records), "output_tokens": total, "seconds": round(elapsed, 3),
            "throughput_tok_s": round(total / elapsed, 1),
            "ttft_ms_p50": round(1e3 * pct(ttft, 0.5), 1),
            "ttft_ms_p99": round(1e3 * pct(ttft, 0.99), 1),
            "tpot_ms_p50": round(1e3 * pct(tpot, 0.5), 2),
            "tpot_ms_p99": round(1e3 * pct(tpot, 0.99), 2)}


def serve_model_dir() -> str:
    """bench.py's dummy Qwen3-0.6B, but with a word-level tokenizer covering the whole
    vocabulary: with the demo tokenizer (400 tokens) almost every sampled id decodes to "",
    and a server sends no chunk for a delta without text, which would hide the stream."""
    import json
    import tempfile

    from nanovllm.utils.toy import QWEN3_0_6B, qwen3_config_dict

    path = os.path.join(tempfile.gettempdir(), "nanovllm-qwen3-0.6b-dummy-words")
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        return path
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(qwen3_config_dict(**QWEN3_0_6B, torch_dtype="bfloat16",
                                    eos_token_id=151645), f)
    n = QWEN3_0_6B["vocab_size"]
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(n)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="w151645").save_pretrained(path)
    return path


def run_offline(path: str, load_format: str, work, engine: dict) -> dict:
    """The same requests through LLM.generate (one batch): the figure to compare with."""
    from nanovllm import LLM, SamplingParams

    llm = LLM(path, load_format=load_format, max_model_len=4096, **engine)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=16), use_tqdm=False)  # warm-up
    sps = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for _, m in work]
    t = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in work], sps, use_tqdm=False)
    elapsed = time.perf_counter() - t
    llm.shutdown()
    total = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"requests": len(outs), "output_tokens": total, "seconds": round(elapsed, 3),
            "throughput_tok_s": round(total / elapsed, 1)}


# -- in-process AsyncLLM ---------------------------------------------------------------------
def run_async(path: str, load_format: str, work, switch, engine_process: bool,
              engine: dict) -> dict:
    from nanovllm import SamplingParams
    from nanovllm.async_llm import AsyncLLM

    llm = AsyncLLM(path, load_format=load_format, max_model_len=4096,
                   engine_process=engine_process, **engine)
    if switch:  # after AsyncLLM, which lowers Python's default itself
        sys.setswitchinterval(switch)

    async def one(prompt, max_tokens):
        sp = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=max_tokens)
        start, first, n = time.perf_counter(), None, 0
        async for out in llm.generate({"prompt_token_ids": prompt}, sp):
            got = sum(len(c.token_ids) for c in out.outputs)
            if got and first is None:
                first = time.perf_counter()
            n += got
        return start, first, time.perf_counter(), n

    async def main():
        await one([1, 2, 3], 16)  # warm-up
        t = time.perf_counter()
        records = await asyncio.gather(*(one(p, m) for p, m in work))
        return records, time.perf_counter() - t

    records, elapsed = asyncio.run(main())
    llm.shutdown()
    return summary(records, elapsed)


# -- HTTP ------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(path: str, load_format: str, port: int, switch: float | None,
          engine_process: bool, engine: dict) -> None:
    from nanovllm.server.app import run_server

    if switch:
        sys.setswitchinterval(switch)

    run_server(path, host="127.0.0.1", port=port, served_model_name="bench",
               load_format=load_format, max_model_len=4096, engine_process=engine_process,
               **engine)


def client_proc(port: int, work, start_at: float, queue) -> None:
    import httpx

    async def one(client, prompt, max_tokens, offset):
        body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.6,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        await asyncio.sleep(max(0.0, start_at + offset - time.time()))
        start, first, n = time.perf_counter(), None, 0
        async with client.stream("POST", "/v1/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    n = chunk["usage"]["completion_tokens"]
                elif first is None and chunk.get("choices"):
                    first = time.perf_counter()
        return start, first or time.perf_counter(), time.perf_counter(), n

    async def main():
        limits = httpx.Limits(max_connections=len(work) + 4)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600,
                                     limits=limits) as client:
            return await asyncio.gather(*(one(client, p, m, at) for p, m, at in work))

    queue.put(asyncio.run(main()))


def arrivals(n: int, rate: float | None) -> list[float]:
    """Seconds after the start at which each request is sent: all at once (rate None), or a
    Poisson process of `rate` requests a second (the same draws on every run)."""
    if rate is None:
        return [0.0] * n
    rng, at, out = Random(1), 0.0, []
    for _ in range(n):
        out.append(at)
        at += rng.expovariate(rate)
    return out


def medians(runs: list[dict]) -> dict:
    """Each metric's median over runs (the lower middle one of an even count), and the
    runs themselves; one run is returned as it is."""
    if len(runs) == 1:
        return runs[0]
    out = {k: sorted(r[k] for r in runs)[(len(runs) - 1) // 2] for k in runs[0]}
    out["runs"] = runs
    return out


def run_http(path: str, load_format: str, work, clients: int, switch: float | None,
             engine_process: bool, engine_flags: list[str], rate: float | None = None,
             repeat: int = 1) -> dict:
    import httpx

    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve-only", str(port),
                               "--model", path, "--load-format", load_format]
                              + (["--switch-interval", str(switch)] if switch else [])
                              + ([] if engine_process else ["--engine-thread"])
                              + engine_flags)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise RuntimeError("the server exited during start-up")
            time.sleep(0.5)
        warm = {"model": "bench", "prompt": [1, 2, 3], "max_tokens": 16}
        httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=warm, timeout=120)
        ctx = mp.get_context("spawn")
        timed = [(p, m, at) for (p, m), at in zip(work, arrivals(len(work), rate))]
        runs = []
        for run in range(repeat):
            # Each run's prompts start with a token of their own: a run must not find the
            # last run's prompts in the prefix cache (its prefills would be free). The ids stay
            # in the workload's 0-10,000, which any vocabulary holds.
            sent = [([(p[0] + run) % 10_001] + p[1:], m, at) for p, m, at in timed]
            queue = ctx.Queue()
            start_at = time.time() + 3.0  # every client process connected and waiting
            procs = [ctx.Process(target=client_proc,
                                 args=(port, sent[i::clients], start_at, queue))
                     for i in range(clients)]
            for p in procs:
                p.start()
            records = [r for _ in procs for r in queue.get()]
            for p in procs:
                p.join()
            # perf_counter is CLOCK_MONOTONIC on Linux: one clock for every process of the host.
            elapsed = max(r[2] for r in records) - min(r[0] for r in records)
            runs.append(summary(records, elapsed))
        return medians(runs)
    finally:
        server.terminate()
        server.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mode", choices=["offline", "async", "http"], default="http")
    ap.add_argument("--model", help="Hugging Face Qwen3 directory (default: dummy Qwen3-0.6B)")
    ap.add_argument("--load-format", default=None)
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--max-input-len", type=int, default=1024)
    ap.add_argument("--max-output-len", type=int, default=1024)
    ap.add_argument("--clients", type=int, default=4, help="client processes (http mode)")
    ap.add_argument("--switch-interval", type=float,
                    help="sys.setswitchinterval for the engine's process (default: Python's 5 ms)")
    ap.add_argument("--engine-thread", action="store_true",
                    help="run the engine on a thread of the serving process (AsyncLLM's "
                         "engine_process=False) instead of a process of its own")
    ap.add_argument("--serve-only", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--engine-args", type=json.loads, default={},
                    help="more LLM / AsyncLLM arguments as JSON, e.g. "
                         "'{\"enable_mixed_steps\": false}'")
    ap.add_argument("--request-rate", type=float, default=None,
                    help="http: Poisson arrivals at this many requests a second (default: "
                         "every request at once)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="http: send the workload this many times to one server; prints each "
                         "run and each metric's median")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args()
    if args.repeat < 1 or (args.repeat > 1 and args.mode != "http"):
        ap.error(f"--repeat {args.repeat}: give a count of 1 or more, and more than 1 only "
                 "with --mode http")
    engine = args.engine_args
    if args.model is None:
        args.model, args.load_format = serve_model_dir(), args.load_format or "dummy"
    load_format = args.load_format or "auto"
    if args.serve_only:
        serve(args.model, load_format, args.serve_only, args.switch_interval,
              not args.engine_thread, engine)
        return
    work = workload(args.num_seqs, args.max_input_len, args.max_output_len)
    if args.mode == "offline":
        result = run_offline(args.model, load_format, work, engine)
    elif args.mode == "async":
        result = run_async(args.model, load_format, work, args.switch_interval,
                           not args.engine_thread, engine)
    else:
        result = run_http(args.model, load_format, work, args.clients, args.switch_interval,
                          not args.engine_thread, ["--engine-args", json.dumps(engine)],
                          args.request_rate, args.repeat)
    result.update(mode=args.mode, switch_interval=args.switch_interval,
                  request_rate=args.request_rate,
                  engine="thread" if args.engine_thread else "process", **engine)
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
