"""Does xgrammar release the GIL? And what does each grammar call cost the host? (CPU only)

    python tools/grammar_gil.py [--vocab toy|smollm2] [--rows 4] [--seconds 1.5]

Part 1 times the calls a grammar step makes (bench.py's schema: one JSON string field):
accept_token, fill_next_token_bitmask per matcher, BatchGrammarMatcher's batched fill on the
calling thread and on xgrammar's threads (at 1 to 256 rows), and batched accept.

Part 2 runs a pure-Python counting loop on this thread while a second thread calls one of
them back to back, and reports the loop's rate against its rate alone.
A call that holds the GIL takes the loop's time (rate falls towards 1 / 2: the interpreter's
switch interval shares the lock); one that releases it leaves the loop its own core (rate
stays near 1 on a machine with a free core). Two references frame the figure: a worker
running Python (holds the GIL) and one in numpy's sort (releases it).

Part 3 is what a second thread would face in the engine: the step loop signals it to fill a
step's masks and goes on running Python for a while; when is the fill done? (A thread that
wakes needs the GIL to run even the few lines of Python around the C++ call.)
"""
import argparse
import os
import queue
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.utils.toy import save_tokenizer, smollm2_gguf  # noqa: E402

SCHEMA = '{"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}'


def tokenizer(kind: str):
    """The bench's 400-token tokenizer, or SmolLM2's 49k one (from the installed GGUF)."""
    from transformers import AutoTokenizer

    if kind == "toy":
        path = "/tmp/grammar-gil-tok"
        if not os.path.isdir(path):
            save_tokenizer(path)
        return AutoTokenizer.from_pretrained(path)
    gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))


def setup(kind: str, rows: int):
    """(xgrammar, compiled grammar, matchers advanced into the string, bitmask, a token the
    string accepts, words)."""
    import xgrammar as xgr

    tok = tokenizer(kind)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    compiled = xgr.GrammarCompiler(info).compile_grammar(
        xgr.Grammar.from_json_schema(SCHEMA, any_whitespace=False))
    prefix = tok.encode('{"text": "', add_special_tokens=False)
    letter = tok.encode("a", add_special_tokens=False)[0]
    matchers = []
    for _ in range(rows):
        m = xgr.GrammarMatcher(compiled)
        for t in prefix:
            assert m.accept_token(t)
        matchers.append(m)
    words = -(-len(tok) // 32)
    return xgr, compiled, matchers, np.full((rows, words), -1, np.int32), letter, words


def per_call(label: str, fn, n: int) -> float:
    """Microseconds per fn() over n calls (after a few warm-ups)."""
    for _ in range(min(n, 20)):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    us = 1e6 * (time.perf_counter() - t) / n
    print(f"  {label:<52} {us:9.1f} us")
    return us


def python_rate(seconds: float, worker=None) -> float:
    """Iterations a second of a pure-Python loop on this thread, with `worker` (a callable)
    run back to back on a second thread meanwhile."""
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            worker()

    t = threading.Thread(target=spin, daemon=True) if worker else None
    if t:
        t.start()
        time.sleep(0.05)
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    stop.set()
    if t:
        t.join()
    return n / seconds


def handoff(fill, busy_ms: float, n: int = 40) -> tuple[float, float]:
    """(median, 90th percentile) ms from signalling a waiting thread to fill until its fill
    is done, while this thread runs Python for busy_ms after the signal, then waits."""
    todo, done = queue.SimpleQueue(), queue.SimpleQueue()

    def worker():
        while (t0 := todo.get()) is not None:
            fill()
            done.put(time.perf_counter() - t0)

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    lat = []
    for _ in range(n):
        todo.put(time.perf_counter())
        end = time.perf_counter() + busy_ms / 1e3
        while time.perf_counter() < end:
            pass
        lat.append(done.get())
    todo.put(None)
    t.join()
    lat.sort()
    return 1e3 * lat[n // 2], 1e3 * lat[n * 9 // 10]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", choices=["toy", "smollm2"], default="toy")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=1.5)
    args = ap.parse_args()
    xgr, compiled, matchers, mask, letter, words = setup(args.vocab, args.rows)
    batch = xgr.BatchGrammarMatcher(1)
    rows = list(range(args.rows))
    print(f"vocab={args.vocab} ({words} words a row), rows={args.rows}, "
          f"cores={os.cpu_count()}, switch interval {sys.getswitchinterval() * 1e3:.0f} ms")

    print("Part 1: cost per call")
    m = matchers[0]

    def accept_rollback():
        m.accept_token(letter)
        m.rollback(1)

    calls = {
        "accept_token + rollback(1), one matcher": accept_rollback,
        "fill_next_token_bitmask, one matcher": lambda: m.fill_next_token_bitmask(mask, 0),
        f"fill_next_token_bitmask x{args.rows} (a matcher at a time)":
            lambda: [x.fill_next_token_bitmask(mask, i) for i, x in enumerate(matchers)],
        f"BatchGrammarMatcher fill, {args.rows} rows":
            lambda: batch.batch_fill_next_token_bitmask(matchers, mask, rows),
        f"batch_accept_token + batch_rollback, {args.rows} rows": lambda: (
            xgr.BatchGrammarMatcher.batch_accept_token(matchers, [letter] * args.rows),
            xgr.BatchGrammarMatcher.batch_rollback(matchers, [1] * args.rows)),
    }
    for label, fn in calls.items():
        per_call(label, fn, 2000)
    threads = max(2, min(8, (os.cpu_count() or 2) // 2))  # as structured/grammars.py
    threaded = xgr.BatchGrammarMatcher(threads)
    many = [matchers[i % len(matchers)].fork() for i in range(256)]  # a matcher per row
    big = np.full((len(many), words), -1, np.int32)
    for n in (1, 16, 64, 256):
        for label, b in (("1 thread", batch), (f"{threads} threads", threaded)):
            per_call(f"BatchGrammarMatcher fill, {n} rows, {label}",
                     lambda: b.batch_fill_next_token_bitmask(many[:n], big, list(range(n))), 300)

    print("Part 2: a Python loop's rate on this thread while a second thread calls ...")
    alone = python_rate(args.seconds)
    noise = np.random.default_rng(0).random(200_000)
    refs = {"(nothing)": None,
            "Python (holds the GIL)": lambda: sum(range(2000)),
            "numpy sort (releases the GIL)": lambda: np.sort(noise)}
    for label, fn in {**refs, **calls}.items():
        rate = alone if fn is None else python_rate(args.seconds, fn)
        print(f"  {label:<52} {rate / alone:6.2f} of alone")

    print(f"Part 3: a second thread fills {args.rows} rows; this one runs Python meanwhile")
    fill = calls[f"BatchGrammarMatcher fill, {args.rows} rows"]
    default = sys.getswitchinterval()
    for interval in (default, 0.0002):
        sys.setswitchinterval(interval)
        for busy in (0, 1, 3):
            med, p90 = handoff(fill, busy)
            print(f"  switch interval {interval * 1e3:.1f} ms, busy {busy} ms after the signal: "
                  f"fill done after {med:.3f} ms (p90 {p90:.3f})")
    sys.setswitchinterval(default)


if __name__ == "__main__":
    main()
