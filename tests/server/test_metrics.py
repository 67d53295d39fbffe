"""ServerMetrics without a server: the engine's stats become gauges and counters (and a dead
engine leaves the front end's metrics served), and track() counts tokens, intervals and
finish reasons of a scripted request, an abandoned one and a refused one."""
import asyncio
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nanovllm.outputs import CompletionOutput, RequestOutput
from nanovllm.server.metrics import ServerMetrics

STATS = dict(num_blocks=10, num_free_blocks=4, num_running=3, num_waiting=2, num_preemptions=5,
             prefix_cache_queries=100, prefix_cache_hits=40, spec_proposed=9, spec_accepted=6,
             spec_verify_steps=4)


class FakeEngine:
    def __init__(self, stats: dict | None):
        self.config = SimpleNamespace(max_model_len=256)
        self._stats = stats

    def stats(self, timeout=None) -> dict:
        if self._stats is None:
            raise RuntimeError("the engine is gone")
        return self._stats


def values(metrics: ServerMetrics) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            extra = {k: v for k, v in s.labels.items() if k not in ("model_name", "le")}
            if s.labels.get("le", "+Inf") == "+Inf":
                out[s.name + (f"[{','.join(extra.values())}]" if extra else "")] = s.value
    return out


def test_engine_stats_at_scrape_time():
    got = values(ServerMetrics(FakeEngine(STATS), "m"))
    assert got["nanovllm:kv_cache_usage_perc"] == pytest.approx(0.6)
    assert (got["nanovllm:num_requests_running"], got["nanovllm:num_requests_waiting"]) == (3, 2)
    assert got["nanovllm:num_preemptions_total"] == 5
    assert (got["nanovllm:prefix_cache_queries_total"],
            got["nanovllm:prefix_cache_hits_total"]) == (100, 40)
    assert (got["nanovllm:spec_decode_num_drafts_total"],
            got["nanovllm:spec_decode_num_draft_tokens_total"],
            got["nanovllm:spec_decode_num_accepted_tokens_total"]) == (4, 9, 6)


def test_a_dead_engine_leaves_the_front_end_metrics():
    got = values(ServerMetrics(FakeEngine(None), "m"))
    assert "nanovllm:kv_cache_usage_perc" not in got
    assert got["nanovllm:prompt_tokens_total"] == 0


def delta(index, ids, reason=None) -> CompletionOutput:
    return CompletionOutput(index=index, text="", token_ids=ids, finish_reason=reason)


def out(*completions, finished=False) -> RequestOutput:
    return RequestOutput(0, None, [1, 2, 3], list(completions), finished=finished)


async def scripted(items, raise_at_end: Exception | None = None):
    for item in items:
        yield item
    if raise_at_end is not None:
        raise raise_at_end


def consume(metrics, items, n=2, leave_after=None, raise_at_end=None) -> None:
    async def run():
        tracked = metrics.track(scripted(items, raise_at_end), 3, n)
        seen = 0
        try:
            async for _ in tracked:
                seen += 1
                if seen == leave_after:
                    break
        finally:
            await tracked.aclose()
    try:
        asyncio.run(run())
    except (ValueError, RuntimeError):
        pass


def test_track_counts_tokens_intervals_and_reasons():
    m = ServerMetrics(FakeEngine(STATS), "m")
    # n=2: sample 0 gets 1 then 3 tokens and stops; sample 1 gets 2 then 1 and hits length.
    consume(m, [out(delta(0, [5])), out(delta(0, [6, 7, 8]), delta(1, [9, 9])),
                out(delta(0, [], "stop"), delta(1, [4], "length"), finished=True)])
    got = values(m)
    assert got["nanovllm:prompt_tokens_total"] == 3  # once per request, not per sample
    assert got["nanovllm:generation_tokens_total"] == 7
    assert got["nanovllm:time_to_first_token_seconds_count"] == 1
    assert got["nanovllm:inter_token_latency_seconds_count"] == 7 - 2  # each sample's first
    assert got["nanovllm:e2e_request_latency_seconds_count"] == 1
    assert got["nanovllm:request_generation_tokens_sum"] == 7
    assert (got["nanovllm:request_success_total[stop]"],
            got["nanovllm:request_success_total[length]"]) == (1, 1)

    # A consumer that leaves after the first delta: both samples end as aborts.
    consume(m, [out(delta(0, [5])), out(delta(0, [6]))], leave_after=1)
    # The engine refused the request before any output (a 400): nothing is counted.
    consume(m, [], raise_at_end=ValueError("bad request"))
    # A step failed after one token: the samples still open end as errors.
    consume(m, [out(delta(0, [5]), delta(1, [], "stop"))], raise_at_end=RuntimeError("step"))
    got = values(m)
    assert got["nanovllm:request_success_total[abort]"] == 2
    assert got["nanovllm:request_success_total[error]"] == 1
    assert got["nanovllm:request_success_total[stop]"] == 2
    assert got["nanovllm:time_to_first_token_seconds_count"] == 3
    assert got["nanovllm:e2e_request_latency_seconds_count"] == 1


def test_histogram_buckets_are_cumulative_and_inclusive():
    m = ServerMetrics(FakeEngine(STATS), "m")
    for value, times in ((0.005, 2), (0.0051, 1), (99.0, 1)):  # 99 s: above every bound
        m.itl.observe(value, times)
    text = m.render().decode()
    buckets = {s.labels["le"]: s.value for f in text_string_to_metric_families(text)
               if f.name == "nanovllm:inter_token_latency_seconds"
               for s in f.samples if s.name.endswith("_bucket")}
    assert (buckets["0.0025"], buckets["0.005"], buckets["0.0075"]) == (0, 2, 3)
    assert (buckets["10.0"], buckets["+Inf"]) == (3, 4)
    sums = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert sums["nanovllm:inter_token_latency_seconds_sum"] == pytest.approx(0.0151 + 99)
