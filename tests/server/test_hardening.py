"""Issue 26's findings, one regression test each: values past what the engine can hold, lone
surrogates, deep nesting, a 500 that must not drop the connection, huge bodies, the request
schema in /openapi.json, 405 with Allow, strict types; and a step that raises inside the
engine fails only its own requests."""
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from nanovllm.server import routes as server_routes
from nanovllm.server.guard import MAX_JSON_DEPTH
from tests.server.conftest import NAME
from tests.support.failures import fail_steps_of_seed

ENGINE_PROCESS = False  # the step-failure test reaches into the engine with monkeypatch
# Separate prefill steps: the poisoned prompt's step then holds no decode of the good request
# (a mixed step would hold both, and fail both).
ENGINE_OVERRIDES = dict(enable_mixed_steps=False)
CMPL = {"model": NAME, "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
BIG = 2 ** 63


@pytest.fixture(scope="module")
def http(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        yield client


def error_of(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


def assert_serving(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    resp = http.post("/v1/completions", json={**CMPL, "temperature": 0.7})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("field, value", [
    ("top_k", BIG), ("top_k", 10 ** 30), ("seed", BIG), ("seed", -BIG - 1),
    ("max_tokens", BIG), ("min_tokens", BIG), ("n", 1000), ("logprobs", BIG),
    ("stop_token_ids", [BIG]), ("stop", ["x"] * 1000), ("stop_token_ids", list(range(2000))),
    ("prompt", [1, BIG]), ("prompt", [[BIG]]),
])
def test_values_past_int64_or_limits_are_400(http, live_server, field, value):
    """Issue item 1: top_k >= 2^63 used to kill the engine core for every later request."""
    body = {**CMPL, "temperature": 1.0, field: value}
    param = error_of(http.post("/v1/completions", json=body), 400)["param"]
    assert param.split(".")[0] == field  # e.g. "stop_token_ids.0": the item at fault
    assert_serving(http)


def test_top_k_at_int64_max_is_served(http):
    """The largest valid top_k keeps every token (the sampler clamps it to the vocabulary)."""
    body = {**CMPL, "temperature": 1.0, "top_k": BIG - 1, "seed": BIG - 1}
    assert http.post("/v1/completions", json=body).status_code == 200
    assert_serving(http)


@pytest.mark.parametrize("route, body, param", [
    ("/v1/completions", {**CMPL, "prompt": "\ud800"}, "prompt"),
    ("/v1/completions", {**CMPL, "prompt": ["ok", "a\udfffb"]}, "prompt.1"),
    ("/v1/completions", {**CMPL, "stop": ["\ud800"]}, "stop.0"),
    ("/v1/chat/completions",
     {**CHAT, "messages": [{"role": "user", "content": "\ud800"}]}, "messages.0.content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x\udbff"}]}]}, "messages.0.content.0.text"),
])
def test_lone_surrogates_are_400(http, route, body, param):
    """Issue item 2: the tokenizer's TypeError on a lone surrogate was a 500."""
    resp = http.post(route, content=json.dumps(body),  # ensure_ascii: "\ud800" escaped
                     headers={"Content-Type": "application/json"})
    err = error_of(resp, 400)
    assert err["param"] == param and "UTF-8" in err["message"]
    assert_serving(http)


def test_raw_surrogate_bytes_are_400(http):
    raw = b'{"model": "toy", "max_tokens": 2, "prompt": "\xed\xa0\x80"}'
    resp = http.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    assert error_of(resp, 400)["param"] == "prompt"
    assert_serving(http)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1000, 100_000])
def test_deep_nesting_is_400(http, depth):
    """Issue item 3: ~1,000 levels raised RecursionError in json.loads (a 500)."""
    for body in ("[" * depth + "]" * depth,
                 '{"model": "toy", "prompt": ' + "[" * depth + "]" * depth + "}"):
        resp = http.post("/v1/completions", content=body,
                         headers={"Content-Type": "application/json"})
        assert "nests deeper" in error_of(resp, 400)["message"]
    assert_serving(http)


def test_a_500_keeps_the_connection(live_server, monkeypatch):
    """Issue item 4: the re-raise after a 500 made uvicorn drop the keep-alive connection,
    and the next request on it got a connection reset. One connection, 20 rounds."""
    def broken(*args, **kwargs):
        raise RuntimeError("injected bug")

    monkeypatch.setattr(server_routes, "check_length", broken)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(base_url=live_server.url, timeout=30, limits=limits,
                      transport=httpx.HTTPTransport(retries=0, limits=limits)) as one:
        for _ in range(20):
            resp = one.post("/v1/completions", json=CMPL)
            assert "injected bug" in error_of(resp, 500)["message"]
            assert resp.headers.get("connection") != "close"
            assert one.get("/health").status_code == 200  # same connection, still open
    monkeypatch.undo()
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        assert_serving(http)


def test_huge_body_is_413_without_stalling_health(http, live_server):
    """Issue item 5: an 8 MB prompt was tokenized on the event loop (seconds), stalling
    /health and every stream. Now the body limit answers first."""
    prompt = "hello " * ((8 << 20) // 6)
    with ThreadPoolExecutor(2) as pool:
        big = pool.submit(http.post, "/v1/completions", json={**CMPL, "prompt": prompt})
        worst = 0.0
        while not big.done():
            t = time.perf_counter()
            assert httpx.get(f"{live_server.url}/health", timeout=5).status_code == 200
            worst = max(worst, time.perf_counter() - t)
        err = error_of(big.result(), 413)
    assert err["code"] == "request_too_large" and "--max-request-bytes" in err["message"]
    assert worst < 1.0
    assert_serving(http)


def test_long_prompt_is_tokenized_off_the_event_loop(http, live_server, monkeypatch):
    """A prompt under the limit that takes long to tokenize does not stall /health."""
    tokenizer = live_server.engine.tokenizer
    original = tokenizer.encode

    def slow_encode(text, *args, **kwargs):
        if text.startswith("SLOW"):
            time.sleep(1.5)
        return original(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", slow_encode)
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(http.post, "/v1/completions", json={**CMPL, "prompt": "SLOW hi"})
        time.sleep(0.2)
        t = time.perf_counter()
        assert httpx.get(f"{live_server.url}/health", timeout=5).status_code == 200
        assert time.perf_counter() - t < 0.5
        assert slow.result().status_code == 200


def test_over_the_limit_body_is_drained_and_the_connection_kept(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        resp = client.post("/v1/completions", content=b"x" * (4 << 20),
                           headers={"Content-Type": "application/json"})
        assert error_of(resp, 413)["code"] == "request_too_large"
        assert_serving(client)  # the body was drained: the connection is reusable


def test_openapi_documents_the_request_bodies(http):
    """Issue item 6: /openapi.json was off and the routes took a raw Request."""
    spec = http.get("/openapi.json").json()
    for path, model in (("/v1/completions", "CompletionRequest"),
                        ("/v1/chat/completions", "ChatCompletionRequest")):
        ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert ref["schema"]["$ref"].endswith(model)
    fields = spec["components"]["schemas"]["CompletionRequest"]["properties"]
    assert {"prompt", "top_k", "seed", "stop"} <= set(fields)
    assert http.get("/docs").status_code == 200


def test_405_names_the_allowed_methods(http):
    resp = http.get("/v1/completions")
    error_of(resp, 405)
    assert resp.headers["allow"] == "POST"


@pytest.mark.parametrize("route, body, param", [
    ("/v1/chat/completions", {**CHAT, "logprobs": 0}, "logprobs"),
    ("/v1/completions", {**CMPL, "prompt": [[False]]}, "prompt"),
    ("/v1/completions", {**CMPL, "prompt": [True, 2]}, "prompt"),
    ("/v1/completions", {**CMPL, "stream": 1}, "stream"),
    ("/v1/completions", {**CMPL, "max_tokens": 2.0}, "max_tokens"),
    ("/v1/completions", {**CMPL, "ignore_eos": "true"}, "ignore_eos"),
])
def test_strict_types(http, route, body, param):
    """Issue item 6: pydantic's lax mode took 0 for a bool and [[false]] for token ids."""
    assert error_of(http.post(route, json=body), 400)["param"] == param


def test_failed_step_fails_only_its_request(http, live_server, monkeypatch):
    """Defence in depth, through the server: a step that raises ends its request with a
    500 (its client sees the error); a request decoding meanwhile finishes,
    /health stays 200 and every KV block is free afterwards."""
    fail_steps_of_seed(monkeypatch, 4242, 0, "injected step failure")
    long = {**CMPL, "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    poison = {**CMPL, "seed": 4242, "temperature": 1.0}
    with ThreadPoolExecutor(1) as pool:
        good = pool.submit(http.post, "/v1/completions", json=long)
        time.sleep(0.3)  # the good request is decoding: the poisoned prefill runs alone
        err = error_of(http.post("/v1/completions", json=poison), 500)
        assert "injected step failure" in err["message"] and err["code"] == "request_failed"
        # Streamed, the failure comes before the first delta, so before any header: a 500.
        resp = http.post("/v1/completions", json={**poison, "stream": True})
        assert "injected step failure" in error_of(resp, 500)["message"]
        assert http.get("/health").status_code == 200
        done = good.result().json()["choices"][0]
    assert done["finish_reason"] == "length"
    live_server.wait_idle()
    monkeypatch.undo()
    assert_serving(http)


def test_step_failure_mid_stream_is_an_error_event(http, live_server, monkeypatch):
    """A stream under way when its step raises ends with an error event and [DONE]."""
    fail_steps_of_seed(monkeypatch, 4343, 3, "injected mid-stream failure")
    body = {**CMPL, "seed": 4343, "temperature": 1.0, "max_tokens": 20, "ignore_eos": True,
            "stream": True, "prompt": [1, 2, 3]}
    with http.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "injected mid-stream failure" in error["message"]
    assert error["code"] == "request_failed"
    assert any("choices" in json.loads(e) for e in events[:-2])  # tokens came first
    live_server.wait_idle()
    monkeypatch.undo()
    assert_serving(http)
