"""Malformed bodies, as an attacker or a buggy client sends them, at concurrency 8 on one
keep-alive pool: none gets a 5xx, a well-formed canary on the same pool always succeeds,
/health stays fast, and afterwards every KV block is free. Reproducible (a fixed seed)."""
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.server.conftest import NAME, SHARED_OVERRIDES

ENGINE_OVERRIDES = SHARED_OVERRIDES  # the server of test_load.py and test_openai_client.py

SEED, NUM_BODIES, CONCURRENCY = 26, 300, 8
CMPL = {"model": NAME, "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
CANARY = {**CMPL, "temperature": 0}
BIG = 2 ** 63
FIELDS = ["prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop",
          "stop_token_ids", "logprobs", "min_tokens", "stream", "ignore_eos", "min_p",
          "presence_penalty", "repetition_penalty", "messages", "top_logprobs", "model",
          "stream_options", "max_completion_tokens"]
VALUES = [None, True, False, 0, -1, 1.5, -1e308, float("nan"), BIG, -BIG - 1, 10 ** 40,
          "", "x", "\ud800", "a\udfffb", "\x00", [], [[]], [False], [[False]], [None], {},
          {"a": 1}, [BIG], ["\ud800"], ["x"] * 1000, list(range(1000)), 1000, "1000",
          [1.5], [[1, BIG]], [{"role": "user"}], [{"role": "user", "content": ["\ud800"]}],
          [{"role": "user", "content": [{"type": "text", "text": 5}]}]]


def malformed_bodies(rng: random.Random) -> list[bytes]:
    """NUM_BODIES bad (or odd) request bodies: one field set to a hostile value, truncated
    or deeply nested JSON, n = 1,000, 1,000-item stop lists, and two 8 MB strings."""
    bodies = [json.dumps({**CMPL, "prompt": "x" * (8 << 20)}).encode(),
              json.dumps({**CHAT, "messages": [{"role": "user", "content": "y" * (8 << 20)}]}
                         ).encode(),
              json.dumps({**CMPL, "n": 1000}).encode(),
              json.dumps({**CMPL, "stop": ["s"] * 1000}).encode(),
              b'{"model": "toy", "prompt": "\xed\xa0\x80"}',
              b"[" * 5000 + b"]" * 5000]
    while len(bodies) < NUM_BODIES:
        base = dict(rng.choice([CMPL, CHAT]))
        kind = rng.random()
        if kind < 0.7:
            base[rng.choice(FIELDS)] = rng.choice(VALUES)
            text = json.dumps(base)
        elif kind < 0.85:
            text = json.dumps(base)
            text = text[:rng.randrange(len(text))]  # truncated
        else:
            depth = rng.choice([40, 500, 3000])
            text = json.dumps({**base, "stop": "@"}).replace('"@"', "[" * depth + "]" * depth)
        bodies.append(text.encode())
    rng.shuffle(bodies)
    return bodies


def test_malformed_bodies_spare_the_neighbours(live_server):
    bodies = malformed_bodies(random.Random(SEED))
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    statuses, canaries, health = [], [], []
    stop = threading.Event()

    def watch_health():
        with httpx.Client(base_url=live_server.url, timeout=5) as own:
            while not stop.is_set():
                t = time.perf_counter()
                status = own.get("/health").status_code
                health.append((status, time.perf_counter() - t))
                time.sleep(0.02)

    with httpx.Client(base_url=live_server.url, timeout=60, limits=limits) as pool:
        def send(i: int):
            route = "/v1/chat/completions" if b'"messages"' in bodies[i][:200] else \
                "/v1/completions"
            resp = pool.post(route, content=bodies[i],
                             headers={"Content-Type": "application/json"})
            statuses.append((resp.status_code, bodies[i][:120], resp.text[:200]))
            if i % 10 == 0:  # a well-formed request on the same pool, between the bad ones
                canary = pool.post("/v1/completions", json=CANARY)
                canaries.append(canary.status_code)

        watcher = threading.Thread(target=watch_health, daemon=True)
        watcher.start()
        try:
            with ThreadPoolExecutor(CONCURRENCY) as workers:
                list(workers.map(send, range(len(bodies))))
        finally:
            stop.set()
            watcher.join()

    server_errors = [s for s in statuses if s[0] >= 500]
    assert not server_errors, server_errors[:5]
    assert len(statuses) == NUM_BODIES and all(400 <= s[0] < 500 or s[0] == 200
                                               for s in statuses)
    assert canaries and set(canaries) == {200}
    assert health and {s for s, _ in health} == {200}
    latencies = sorted(t for _, t in health)
    assert latencies[int(0.99 * (len(latencies) - 1))] < 1.0, latencies[-5:]
    live_server.wait_idle()
    assert live_server.engine.stats()["num_live_requests"] == 0
