"""The server's Prometheus metrics (GET /metrics), with vLLM's names under `nanovllm:`.

Two sources: the engine's gauges and counters (queues, KV-cache usage, prefix cache,
preemptions) are read from AsyncLLM.stats() when Prometheus scrapes; token counts, finish
reasons and latencies are measured here, in the server process, as each request's outputs
pass through `track`. They are kept in plain numbers, touched only on the event loop (a
prometheus_client Counter or Histogram takes a lock per update: a cost per token at
thousands of tokens a second), and handed to prometheus_client, in a registry of this
server's own, when it renders a scrape.
"""
import bisect
import logging
import time
from collections.abc import AsyncIterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

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


def _token_buckets(max_model_len: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50... up to max_model_len: buckets for per-request token counts."""
    out, scale = [], 1
    while True:
        for step in (1, 2, 5):
            if step * scale > max_model_len:
                return tuple(out)
            out.append(step * scale)
        scale *= 10


class _Histogram:
    """Bucket counts and a sum, in plain numbers (see the module's docstring)."""

    def __init__(self, name: str, doc: str, bounds: tuple):
        self.name, self.doc, self.bounds = name, doc, bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """Record `value` `times` times."""
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.sum += value * times

    def family(self, labels: list[str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(PREFIX + self.name, self.doc, labels=["model_name"])
        cumulative, buckets = 0, []
        for bound, count in zip((*self.bounds, float("inf")), list(self.counts)):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
        family.add_metric(labels, buckets, self.sum)
        return family


class ServerMetrics:
    """One server's metrics: render() is the /metrics body; track() measures a request."""

    def __init__(self, engine: AsyncLLM, model_name: str):
        self.engine, self.model_name = engine, model_name
        self.prompt_tokens = self.generation_tokens = 0
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.ttft = _Histogram("time_to_first_token_seconds", "Time from the request's "
                               "hand-over to the engine (tokenized) to its first token.",
                               TTFT_BUCKETS)
        self.itl = _Histogram("inter_token_latency_seconds", "Time between a sample's "
                              "successive tokens (k tokens that arrive together after a "
                              "wait count k intervals of 1/k of it).", ITL_BUCKETS)
        self.e2e = _Histogram("e2e_request_latency_seconds", "Time from the request's "
                              "hand-over to the engine (tokenized) to its last output.",
                              E2E_BUCKETS)
        buckets = _token_buckets(engine.config.max_model_len)
        self.request_prompt = _Histogram("request_prompt_tokens", "Prompt tokens per "
                                         "request.", buckets)
        self.request_generation = _Histogram("request_generation_tokens", "Tokens generated "
                                             "per request (all its samples).", buckets)
        self.registry = CollectorRegistry()
        self.registry.register(self)  # a collector: collect() below

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
                        self.prompt_tokens += num_prompt_tokens
                    if k:
                        # k tokens after a wait share it evenly; a sample's first token
                        # is no interval (the request's first is TTFT).
                        since = last.get(c.index)
                        share = (now - (arrival if since is None else since)) / k
                        self.itl.observe(share, k if since is not None else k - 1)
                        last[c.index] = now
                        generated += k
                        self.generation_tokens += k
                    if c.finish_reason is not None and c.index in open_samples:
                        open_samples.discard(c.index)
                        self.finished[_reason(c.finish_reason)] += 1
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
                self.finished[ended] += len(open_samples)
            await outputs.aclose()

    def collect(self):
        """prometheus_client's collector protocol: the engine's metrics (none when it does
        not answer: the front end's are still served), then the front end's."""
        label = [self.model_name]
        try:
            stats = self.engine.stats(STATS_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - a dead engine must not break /metrics
            logger.debug("no engine stats for /metrics: %s", e)
            stats = None
        if stats is not None:
            yield from _engine_families(stats, label)
        yield _family(CounterMetricFamily, "prompt_tokens", "Prompt tokens processed.",
                      label, self.prompt_tokens)
        yield _family(CounterMetricFamily, "generation_tokens", "Tokens generated.", label,
                      self.generation_tokens)
        success = CounterMetricFamily(PREFIX + "request_success", "Completions that ended, "
                                      "by finish reason (one per sample of a request with "
                                      "n > 1).", labels=["model_name", "finished_reason"])
        for reason, count in list(self.finished.items()):
            success.add_metric([self.model_name, reason], count)
        yield success
        for histogram in (self.ttft, self.itl, self.e2e, self.request_prompt,
                          self.request_generation):
            yield histogram.family(label)


def _reason(finish_reason: str) -> str:
    return finish_reason if finish_reason in FINISH_REASONS else "stop"


def _family(kind, name: str, doc: str, label: list[str], value: float):
    family = kind(PREFIX + name, doc, labels=["model_name"])
    family.add_metric(label, value)
    return family


def _engine_families(stats: dict, label: list[str]):
    """The engine's gauges and counters from its stats (EngineCore.stats)."""
    total = stats["num_blocks"]
    yield _family(GaugeMetricFamily, "num_requests_running",
                  "Sequences in the running queue (a request with n > 1: n once forked).",
                  label, stats["num_running"])
    yield _family(GaugeMetricFamily, "num_requests_waiting",
                  "Sequences waiting to be scheduled.", label, stats["num_waiting"])
    yield _family(GaugeMetricFamily, "kv_cache_usage_perc",
                  "Fraction of KV-cache blocks in use (1 = full).", label,
                  (total - stats["num_free_blocks"]) / total if total else 0.0)
    yield _family(CounterMetricFamily, "prefix_cache_queries",
                  "Prompt tokens looked up in the prefix cache.", label,
                  stats["prefix_cache_queries"])
    yield _family(CounterMetricFamily, "prefix_cache_hits",
                  "Prompt tokens served from the prefix cache.", label,
                  stats["prefix_cache_hits"])
    yield _family(CounterMetricFamily, "num_preemptions",
                  "Sequences preempted (blocks freed, recomputed later).", label,
                  stats["num_preemptions"])
    if "spec_proposed" in stats:  # speculative decoding is on
        yield _family(CounterMetricFamily, "spec_decode_num_drafts",
                      "Verify steps that carried drafts.", label, stats["spec_verify_steps"])
        yield _family(CounterMetricFamily, "spec_decode_num_draft_tokens",
                      "Draft tokens proposed.", label, stats["spec_proposed"])
        yield _family(CounterMetricFamily, "spec_decode_num_accepted_tokens",
                      "Draft tokens accepted.", label, stats["spec_accepted"])
