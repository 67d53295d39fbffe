"""OpenAI fidelity on the live server: echo with logprobs is the offline engine's prompt
logprobs, max_tokens=0 with echo scores a prompt (lm-eval's log-likelihood) and frees its
blocks, bad combinations are 400s naming the field, and /metrics parses with
prometheus_client and its counters move with the requests served."""
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nanovllm import SamplingParams
from tests.server.conftest import NAME, SHARED_OVERRIDES

ENGINE_OVERRIDES = SHARED_OVERRIDES
PROMPT = "The quick brown fox jumps"
TOL = 1e-4


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        yield c


def offline_scores(offline, prompt, k: int, max_tokens: int):
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=k,
                        prompt_logprobs=k)
    return offline.generate([prompt], sp, use_tqdm=False)[0]


def check_prompt_rows(lp, want, tokenizer) -> int:
    """The echoed prompt's rows against the offline prompt logprobs; returns their count."""
    ids = want.prompt_token_ids
    n = len(ids)
    assert lp.tokens[:n] == [tokenizer.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # no context
    for pos in range(1, n):
        entry = want.prompt_logprobs[pos]
        assert lp.token_logprobs[pos] == pytest.approx(entry[ids[pos]].logprob, abs=TOL)
        top = {v.decoded_token: v.logprob for v in entry.values()}
        assert lp.top_logprobs[pos].keys() == top.keys()
        assert list(lp.top_logprobs[pos].values()) == pytest.approx(list(top.values()), abs=TOL)
    offsets = [0]
    for text in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(text))
    assert lp.text_offset == offsets  # the generated tokens' continue after the prompt's
    return n


def test_echo_logprobs_are_the_prompt_logprobs(client, offline):
    want = offline_scores(offline, PROMPT, 2, 4)
    resp = client.completions.create(model=NAME, prompt=PROMPT, echo=True, logprobs=2,
                                     max_tokens=4, temperature=0,
                                     extra_body={"ignore_eos": True})
    c = resp.choices[0]
    gen = want.outputs[0]
    assert c.text == PROMPT + gen.text and c.finish_reason == "length"
    n = check_prompt_rows(c.logprobs, want, offline.tokenizer)
    assert len(c.logprobs.tokens) == n + 4
    assert c.logprobs.token_logprobs[n:] == pytest.approx(
        [d[t].logprob for d, t in zip(gen.logprobs, gen.token_ids)], abs=TOL)
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (n, 4)


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_zero_scores_the_prompt_and_frees_blocks(client, offline, live_server,
                                                            stream):
    # Token-id prompts: echoed as their decoded text.
    prompts = [[7, 31, 99, 150, 3, 250], offline.tokenizer.encode(PROMPT)]
    kw = dict(model=NAME, prompt=prompts, echo=True, logprobs=1, max_tokens=0, n=2)
    if stream:
        chunks = list(client.completions.create(stream=True,
                                                stream_options={"include_usage": True}, **kw))
        usage, choices = chunks[-1].usage, [c for ch in chunks[:-1] for c in ch.choices]
    else:
        resp = client.completions.create(**kw)
        usage, choices = resp.usage, resp.choices
    assert sorted(c.index for c in choices) == [0, 1, 2, 3]  # each choice whole, once
    lengths = []
    for c in choices:
        prompt = prompts[c.index // 2]
        want = offline_scores(offline, prompt, 1, 1)
        assert c.text == offline.tokenizer.decode(prompt) and c.finish_reason == "length"
        lengths.append(check_prompt_rows(c.logprobs, want, offline.tokenizer))
        assert len(c.logprobs.tokens) == lengths[-1]  # nothing generated
    assert usage.completion_tokens == 0
    assert usage.prompt_tokens == sum(lengths) // 2  # per prompt, not per sample
    live_server.wait_idle()  # every block is free again


def test_streamed_echo_sends_the_prompt_first(client):
    chunks = list(client.completions.create(model=NAME, prompt=PROMPT, echo=True,
                                            max_tokens=3, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].text.startswith(PROMPT)
    whole = client.completions.create(model=NAME, prompt=PROMPT, echo=True, max_tokens=3,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


BAD = [  # (route, body, the field the 400 names)
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0, "echo": False}, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": -1, "echo": True}, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "echo": True, "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "Hi", "echo": "yes"}, "echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 0}, "max_tokens"),
]


@pytest.mark.parametrize("route, body, param", BAD)
def test_bad_combinations_are_400_naming_the_field(http, route, body, param):
    resp = http.post(route, json={"model": NAME, **body})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def scrape(http) -> dict[str, float]:
    """/metrics as {sample name{labels}: value}, parsed by prometheus_client."""
    resp = http.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                              if k not in ("model_name", "le"))
            if "le" in s.labels and s.labels["le"] != "+Inf":
                continue  # bucket counts: the totals below are enough
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_metrics_parse_and_move(http, live_server, offline):
    before = scrape(http)
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_queries_total", "prefix_cache_hits_total",
                 "num_preemptions_total"):
        assert f"nanovllm:{name}{{}}" in before
    assert 0 <= before["nanovllm:kv_cache_usage_perc{}"] <= 1
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 5, "temperature": 0,
            "ignore_eos": True}
    assert http.post("/v1/completions", json=body).status_code == 200
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        assert list(resp.iter_lines())[-2:] == ["data: [DONE]", ""]
    # A client that leaves mid-stream: its request ends as an abort.
    with http.stream("POST", "/v1/completions",
                     json={**body, "max_tokens": 200, "stream": True}) as resp:
        next(resp.iter_lines())
    live_server.wait_idle()
    prompt_len = len(offline.tokenizer.encode(PROMPT))

    def moved(name: str) -> float:
        return scrape(http)[name] - before.get(name, 0.0)

    until(lambda: moved("nanovllm:request_success_total{finished_reason=abort}") == 1)
    after = scrape(http)
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    assert delta["nanovllm:request_success_total{finished_reason=length}"] == 2
    assert delta["nanovllm:prompt_tokens_total{}"] == 3 * prompt_len
    generated = delta["nanovllm:generation_tokens_total{}"]
    assert 2 * 5 + 1 <= generated < 2 * 5 + 200
    assert delta["nanovllm:time_to_first_token_seconds_count{}"] == 3
    assert delta["nanovllm:e2e_request_latency_seconds_count{}"] == 2
    # One interval per token but each request's first.
    assert delta["nanovllm:inter_token_latency_seconds_count{}"] == generated - 3
    assert delta["nanovllm:request_prompt_tokens_sum{}"] == 2 * prompt_len
    assert delta["nanovllm:request_generation_tokens_sum{}"] == 2 * 5
    assert after["nanovllm:num_requests_running{}"] == 0
    assert after["nanovllm:num_requests_waiting{}"] == 0
    assert delta["nanovllm:prefix_cache_queries_total{}"] >= 3 * prompt_len


def test_metrics_are_per_server(live_server):
    """Two apps over one engine in one process: each has its own registry (no clash)."""
    from nanovllm.server import build_app

    a, b = build_app(live_server.engine, NAME), build_app(live_server.engine, NAME)
    assert a is not b  # building the second did not raise "Duplicated timeseries"
