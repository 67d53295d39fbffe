"""The server's Prometheus metrics (GET /metrics), with vLLM's names under `nanovllm:`.

Two sources: the engine's gauges and counters (queues, KV-cache usage, prefix cache,
preemptions) are read from AsyncLLM.stats() when Prometheus scrapes; token counts, finish
reasons and latencies are measured here, in the server process, as each request's outputs
pass through `track`. Every server has a registry of its own, so that several in one process
(tests) never share or collide.
"""
import logging
import time
from collections.abc import AsyncIterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from nanovllm.async_llm import AsyncLLM
from nanovllm.outputs import RequestOutput

logger = logging.getLogger(__name__)

PREFIX = "nanovllm:"
CONTENT_TYPE = CONTENT_TYPE_LATEST
# How long a scrape waits for the engine's stats (one round trip, at most a step).
STATS_TIMEOUT_S = 5.0
# Latency buckets in seconds: fine at the low end, where a fast engine's tokens arrive.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075,
               0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
               30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)
# Finish reasons a completion ends with ("abort": the client left or the server gave up;
# "error": the engine step running it failed).
FINISH_REASONS = ("stop", "length", "abort", "error")


def _token_buckets(max_model_len: int) -> list[int]:
    """1, 2, 5, 10, 20, 50... up to max_model_len: buckets for per-request token counts."""
    out, scale = [], 1
    while True:
        for step in (1, 2, 5):
            if step * scale > max_model_len:
                return out
            out.append(step * scale)
        scale *= 10


class ServerMetrics:
    """One server's metrics: render() is the /metrics body; track() measures a request."""

    def __init__(self, engine: AsyncLLM, model_name: str):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model_name))
        reg, label = self.registry, ["model_name"]

        def counter(name: str, doc: str) -> Counter:
            return Counter(PREFIX + name, doc, label, registry=reg).labels(model_name)

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(PREFIX + name, doc, label, buckets=buckets,
                             registry=reg).labels(model_name)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        success = Counter(PREFIX + "request_success", "Completions that ended, by finish "
                          "reason (one per sample of a request with n > 1).",
                          ["model_name", "finished_reason"], registry=reg)
        self.finished = {r: success.labels(model_name, r) for r in FINISH_REASONS}
        self.ttft = histogram("time_to_first_token_seconds", "Time from the request's "
                              "hand-over to the engine (tokenized) to its first token.",
                              TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between a sample's "
                             "successive tokens (k tokens that arrive together after a wait "
                             "count k intervals of 1/k of it).", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Time from the request's "
                             "hand-over to the engine (tokenized) to its last output.",
                             E2E_BUCKETS)
        buckets = _token_buckets(engine.config.max_model_len)
        self.request_prompt = histogram("request_prompt_tokens", "Prompt tokens per request.",
                                        buckets)
        self.request_generation = histogram("request_generation_tokens", "Tokens generated "
                                            "per request (all its samples).", buckets)

    def render(self) -> bytes:
        """The Prometheus text exposition (blocks for the engine's stats: call off the
        event loop)."""
        return generate_latest(self.registry)

    async def track(self, outputs: AsyncIterator[RequestOutput], num_prompt_tokens: int,
                    n: int) -> AsyncIterator[RequestOutput]:
        """`outputs` (one engine request's deltas, n samples) passed through unchanged while
        its latencies, tokens and finish reasons are recorded; closing this closes them."""
        arrival = time.perf_counter()
        last: dict[int, float] = {}  # sample index -> when its newest token arrived
        open_samples, generated, ended = set(range(n)), 0, "abort"
        prompt_done = received = False
        try:
            async for out in outputs:
                now, received = time.perf_counter(), True
                for c in out.outputs:
                    k = len(c.token_ids)
                    # The prompt is computed by the first token, or by a prompt-only
                    # request's end (max_tokens=0: "length" with no token).
                    if not prompt_done and (k or c.finish_reason == "length"):
                        prompt_done = True
                        self.ttft.observe(now - arrival)
                        self.prompt_tokens.inc(num_prompt_tokens)
                    if k:
                        # k tokens after a wait share it evenly; a sample's first token
                        # is no interval (the request's first is TTFT).
                        share = (now - last.get(c.index, arrival)) / k
                        for _ in range(k if c.index in last else k - 1):
                            self.itl.observe(share)
                        last[c.index] = now
                        generated += k
                        self.generation_tokens.inc(k)
                    if c.finish_reason is not None and c.index in open_samples:
                        open_samples.discard(c.index)
                        self.finished[_reason(c.finish_reason)].inc()
                if out.finished:
                    self.e2e.observe(now - arrival)
                    self.request_prompt.observe(num_prompt_tokens)
                    self.request_generation.observe(generated)
                yield out
        except Exception as e:
            # A ValueError before any output: the engine refused the request (a 400), it
            # never ran.
            ended = "error" if received or not isinstance(e, ValueError) else None
            raise
        finally:
            if ended is not None:  # the consumer left (or the engine failed) first
                for _ in open_samples:
                    self.finished[ended].inc()
            await outputs.aclose()


def _reason(finish_reason: str) -> str:
    return finish_reason if finish_reason in FINISH_REASONS else "stop"


class _EngineCollector:
    """The engine's own gauges and counters, read from AsyncLLM.stats() at scrape time."""

    def __init__(self, engine: AsyncLLM, model_name: str):
        self.engine, self.model_name = engine, model_name

    def collect(self):
        """Prometheus' collector protocol; nothing when the engine does not answer (the
        front end's metrics are still served)."""
        try:
            stats = self.engine.stats(STATS_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - a dead engine must not break /metrics
            logger.debug("no engine stats for /metrics: %s", e)
            return
        label = [self.model_name]

        def family(kind, name: str, doc: str, value: float):
            metric = kind(PREFIX + name, doc, labels=["model_name"])
            metric.add_metric(label, value)
            return metric

        total = stats["num_blocks"]
        yield family(GaugeMetricFamily, "num_requests_running",
                     "Sequences in the running queue (a request with n > 1: n once forked).",
                     stats["num_running"])
        yield family(GaugeMetricFamily, "num_requests_waiting",
                     "Sequences waiting to be scheduled.", stats["num_waiting"])
        yield family(GaugeMetricFamily, "kv_cache_usage_perc",
                     "Fraction of KV-cache blocks in use (1 = full).",
                     (total - stats["num_free_blocks"]) / total if total else 0.0)
        yield family(CounterMetricFamily, "prefix_cache_queries",
                     "Prompt tokens looked up in the prefix cache.",
                     stats["prefix_cache_queries"])
        yield family(CounterMetricFamily, "prefix_cache_hits",
                     "Prompt tokens served from the prefix cache.", stats["prefix_cache_hits"])
        yield family(CounterMetricFamily, "num_preemptions",
                     "Sequences preempted (blocks freed, recomputed later).",
                     stats["num_preemptions"])
        if "spec_proposed" in stats:  # speculative decoding is on
            yield family(CounterMetricFamily, "spec_decode_num_drafts",
                         "Verify steps that carried drafts.", stats["spec_verify_steps"])
            yield family(CounterMetricFamily, "spec_decode_num_draft_tokens",
                         "Draft tokens proposed.", stats["spec_proposed"])
            yield family(CounterMetricFamily, "spec_decode_num_accepted_tokens",
                         "Draft tokens accepted.", stats["spec_accepted"])
