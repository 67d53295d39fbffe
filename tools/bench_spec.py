"""Speculative decoding on a GPU: the cost of a verify step, and end-to-end speed-ups.

    python tools/bench_spec.py steps [--model PATH | --shape qwen3-0.6b]   # verify vs decode
    python tools/bench_spec.py steps --shape qwen3-8b --draft-shape qwen3-0.6b
    python tools/bench_spec.py e2e --model SmolLM2.gguf [--self-draft]      # n-gram tok/s
    python tools/bench_spec.py timings --model SmolLM2.gguf                 # where a step goes

`steps` times one engine step through the model runner (host inputs, one copy, the model,
sampling or verification, the ids back): a plain decode step vs a verify step with k drafts
per sequence, at batch 1, 8 and 64 over 512-token contexts. `e2e` generates greedy answers to
input-grounded prompts (rewrite, summarize, extract, repeat) and to open questions, one at a
time and eight at a time, with and without n-gram speculation. Prints JSON lines.
"""
import argparse
import json
import random
import statistics
import sys
import time

PASSAGES = [
    ("The river town of Alder Point grew up around a ferry crossing in 1852. For forty years "
    "the ferry was the only way across, until the iron bridge opened in 1893. The bridge "
    "brought the railway, and with it a brick works, two hotels and a weekly newspaper. "
    "When the brick works closed in 1931 the town shrank by half, and today about 2,400 "
    "people live there, most of them working in the hospital or at the regional college."),
    ("To replace a bicycle inner tube, first shift to the smallest rear cog and open the "
    "brake. Remove the wheel, then push one tyre lever under the bead opposite the valve "
    "and hook it to a spoke. Slide a second lever around the rim until one side of the tyre "
    "is free. Pull out the old tube, check the inside of the tyre for glass or thorns, put "
    "a little air in the new tube, fit it, and work the bead back on with your thumbs."),
    ("Our quarterly meeting is on Tuesday 14 March at 10:30 in room 4B. Maria Chen will "
    "present the budget for the new warehouse, which is now estimated at 1.2 million "
    "dollars. Tom Okafor will report on the delivery delays from January and February. "
    "Please send your questions to Priya Natarajan by Friday 10 March, and bring the "
    "printed sales figures for the first quarter."),
    ("Sourdough starter is a mix of flour and water in which wild yeast and lactic acid "
    "bacteria live together. Feed it once a day with equal weights of flour and water, "
    "keep it at room temperature, and discard half before each feeding. After five to "
    "seven days it should double in size within six hours of a feeding, smell pleasantly "
    "sour, and be full of bubbles. Then it is ready to raise a loaf of bread."),
]
TASKS = ["Rewrite the following text in simpler words, keeping every fact:\n\n{}",
         "Summarize the following text in three sentences:\n\n{}",
         "List every name, number and date that appears in this text:\n\n{}",
         "Repeat the following text exactly, word for word:\n\n{}"]
OPEN = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "What are the main causes of inflation? Explain for a beginner.",
        "Give me ten ideas for a rainy weekend with children.",
        "Explain how a refrigerator works.",
        "Write a poem about the first snow of winter.",
        "What should I consider when choosing a first programming language?",
        "Describe a day in the life of a medieval blacksmith.",
        "How do vaccines train the immune system?"]


def grounded_prompts() -> list[str]:
    """Eight prompts whose answers copy much of their input (n-gram lookup's best case)."""
    return [TASKS[i % 4].format(PASSAGES[(i + i // 4) % 4]) for i in range(8)]


def conversations(prompts: list[str]) -> list[list[dict]]:
    return [[{"role": "user", "content": p}] for p in prompts]


def time_steps(llm, batch: int, k: int, context: int = 512, reps: int = 30) -> dict:
    """Median seconds of a plain decode step and of a verify step (k drafts a sequence)."""
    from nanovllm import SamplingParams
    from nanovllm.engine.sequence import Sequence

    core = llm.clients[0].core
    runner, bm = core.executor.runner, core.scheduler.block_manager
    rng = random.Random(batch)
    vocab = llm.config.hf_config.vocab_size
    seqs = []
    for _ in range(batch):
        s = Sequence([rng.randrange(vocab) for _ in range(context)],
                     SamplingParams(temperature=0), bm.block_size)
        bm.allocate(s)
        s.num_cached_tokens = s.num_tokens - 1  # timing only: the K/V values do not matter
        s.num_draft_cached = s.num_tokens - 1  # a draft model's cache: caught up but the last
        bm.reserve(s, s.num_tokens + k)
        seqs.append(s)
    out = {}
    for name, drafts in (("decode", []), ("verify", [7] * k)):
        for s in seqs:
            s.spec_token_ids, s.num_scheduled_tokens = list(drafts), 1 + len(drafts)
        times = []
        for i in range(reps + 5):
            t = time.perf_counter()
            runner.launch(seqs, False).result()
            if i >= 5:
                times.append(time.perf_counter() - t)
        out[name] = statistics.median(times)
    for s in seqs:
        s.spec_token_ids = []
        bm.deallocate(s)
    return {"batch": batch, "k": k, "decode_ms": round(out["decode"] * 1e3, 3),
            "verify_ms": round(out["verify"] * 1e3, 3),
            "ratio": round(out["verify"] / out["decode"], 3)}


def steps(args) -> None:
    from nanovllm import LLM
    from nanovllm.utils.model_shapes import dummy_model_dir

    model = args.model or dummy_model_dir(args.shape)
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "disable_by_batch_size": 64}
    if args.draft_shape:  # the verify step then includes the draft model's k passes
        spec = {**spec, "method": "draft_model", "model": dummy_model_dir(args.draft_shape)}
    llm = LLM(model, load_format="auto" if args.model else "dummy", speculative_config=spec,
              max_model_len=2048, gpu_memory_utilization=0.5)
    for batch in (1, 8, 64):
        print(json.dumps({"what": "step", "model": args.model or args.shape,
                          "draft": args.draft_shape, **time_steps(llm, batch, args.k)}),
              flush=True)
    llm.shutdown()


def generate(llm, convs, batch: int, sp) -> tuple[int, float, list]:
    """Output tokens, seconds, outputs: `batch` conversations at a time."""
    outs, tokens = [], 0
    t = time.perf_counter()
    for i in range(0, len(convs), batch):
        got = llm.chat(convs[i:i + batch], sp, use_tqdm=False)
        outs += got
        tokens += sum(len(o.outputs[0].token_ids) for o in got)
    return tokens, time.perf_counter() - t, outs


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two outputs share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def e2e(args) -> None:
    from nanovllm import LLM, SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    sets = {"grounded": conversations(grounded_prompts()), "open": conversations(OPEN)}
    results = {}
    configs = [("plain", None),
               ("ngram", {"method": "ngram", "num_speculative_tokens": args.k,
                          "prompt_lookup_max": 4, "prompt_lookup_min": 2,
                          "disable_by_batch_size": 8})]
    if args.self_draft:  # the machinery's ceiling: every draft is the target's own argmax
        configs.append(("self_draft", {"method": "draft_model", "model": args.model,
                                       "num_speculative_tokens": args.k,
                                       "disable_by_batch_size": 8}))
    for label, spec in configs:
        llm = LLM(args.model, speculative_config=spec, max_model_len=2048,
                  gpu_memory_utilization=0.5)
        for name, convs in sets.items():
            for batch in (1, 8):
                # Warm on the whole set (graphs, allocator, compiled shapes), outside the counts:
                # the first configuration measured must not pay for what the later ones reuse.
                generate(llm, convs, batch, sp)
                before = llm.clients[0].core.stats()
                tokens, secs, outs = generate(llm, convs, batch, sp)
                after = llm.clients[0].core.stats()
                row = {"what": "e2e", "spec": label, "prompts": name, "batch": batch,
                       "tokens": tokens, "seconds": round(secs, 3),
                       "tok_s": round(tokens / secs, 1)}
                if spec is not None:
                    prop = after["spec_proposed"] - before["spec_proposed"]
                    acc = after["spec_accepted"] - before["spec_accepted"]
                    steps_ = after["spec_verify_steps"] - before["spec_verify_steps"]
                    row.update(acceptance=round(acc / max(prop, 1), 3),
                               mean_accepted_length=round(1 + acc / max(steps_, 1), 3))
                    plain = results[("plain", name, batch)]
                    row["speedup"] = round(row["tok_s"] / plain["tok_s"], 3)
                    got = [o.outputs[0].token_ids for o in outs]
                    # bf16 verify rows run at another GEMM batch size than plain decode's, so a
                    # near-tie can flip; report how far the outputs agree, not only whether.
                    row["same_tokens"] = got == plain["ids"]
                    agree = sum(common_prefix(a, b) / max(len(b), 1)
                                for a, b in zip(got, plain["ids"]))
                    row["same_prefix"] = round(agree / len(got), 3)
                results[(label, name, batch)] = {**row, "ids": [o.outputs[0].token_ids
                                                                for o in outs]}
                print(json.dumps(row), flush=True)
        llm.shutdown()


def timings(args) -> None:
    """Host seconds per part of the step loop (schedule, launch, waiting for the device,
    taking the results), plain and with n-gram drafts."""
    import collections

    from nanovllm import LLM, SamplingParams
    from nanovllm.worker import step_output

    spent, calls = collections.defaultdict(float), collections.Counter()

    def timed(fn, key):
        def run(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[key] += time.perf_counter() - t
                calls[key] += 1
        return run

    step_output.StepResult.result = timed(step_output.StepResult.result, "wait_result")
    convs = conversations(grounded_prompts())
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for spec in (None, {"method": "ngram", "num_speculative_tokens": args.k}):
        llm = LLM(args.model, speculative_config=spec, max_model_len=2048,
                  gpu_memory_utilization=0.4)
        core = llm.clients[0].core
        for obj, name in ((core.scheduler, "schedule"), (core.executor, "launch"),
                          (core.scheduler, "on_result"), (core, "step")):
            setattr(obj, name, timed(getattr(obj, name), name))
        llm.chat(convs[:1], SamplingParams(max_tokens=8), use_tqdm=False)
        spent.clear()
        calls.clear()
        t, tokens = time.perf_counter(), 0
        for conv in convs:
            tokens += len(llm.chat([conv], sp, use_tqdm=False)[0].outputs[0].token_ids)
        wall = time.perf_counter() - t
        print(json.dumps({"what": "timings", "spec": spec is not None, "tokens": tokens,
                          "wall_ms": round(wall * 1e3, 1),
                          **{k: {"calls": calls[k], "ms": round(v * 1e3, 1)}
                             for k, v in spent.items()}}), flush=True)
        llm.shutdown()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["steps", "e2e", "timings"])
    ap.add_argument("--model", default=None)
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--draft-shape", default=None,
                    help="steps: a draft model of this shape (random weights), e.g. qwen3-0.6b")
    ap.add_argument("--self-draft", action="store_true",
                    help="e2e: also the target as its own draft model (the upper bound)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args(argv)
    if args.what != "steps" and not args.model:
        sys.exit(f"{args.what} needs --model (a real model: random weights accept nothing)")
    {"steps": steps, "e2e": e2e, "timings": timings}[args.what](args)


if __name__ == "__main__":
    main()
