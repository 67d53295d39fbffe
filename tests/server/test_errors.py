"""Bad requests get a 4xx with OpenAI's error shape and the server keeps serving; a wrong
or missing API key gets a 401; a dead engine gives 503s."""
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.server.conftest import NAME

API_KEY = "sk-test-key"
# A small cache (8 blocks of 16 tokens): a request that could never fit is the engine's
# own ValueError, which must come back as a 400 too.
ENGINE_OVERRIDES = dict(num_kvcache_blocks=8, max_num_seqs=4)
ENGINE_PROCESS = False  # the last test makes the engine fail through monkeypatch
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CMPL = {"model": NAME, "prompt": "Hello", "max_tokens": 3}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def http(live_server):
    with httpx.Client(base_url=live_server.url, headers=AUTH, timeout=30) as client:
        yield client


def assert_error(resp: httpx.Response, status: int, param: str | None = "any") -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param != "any":
        assert err["param"] == param
    return err


def assert_still_serving(http: httpx.Client) -> None:
    resp = http.post("/v1/completions", json=CMPL)
    assert resp.status_code == 200 and resp.json()["choices"][0]["finish_reason"]


BAD = [  # (route, body, param the error names)
    ("/v1/completions", {"model": NAME, "max_tokens": 3}, "prompt"),
    ("/v1/completions", {"prompt": "Hello"}, "model"),
    ("/v1/chat/completions", {"model": NAME}, "messages"),
    ("/v1/completions", {**CMPL, "max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {**CMPL, "prompt": 5}, "prompt"),
    ("/v1/completions", {**CMPL, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "messages": "Hi"}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]},
     "messages.0.role"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, "any"),
    ("/v1/completions", {**CMPL, "max_tokens": 300}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 300}, "max_tokens"),
    ("/v1/completions", {**CMPL, "n": 0}, "n"),
    ("/v1/completions", {**CMPL, "logprobs": 99}, "logprobs"),
    ("/v1/completions", {**CMPL, "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {**CMPL, "suffix": "x"}, "suffix"),
    ("/v1/completions", {**CMPL, "best_of": 3}, "best_of"),
    ("/v1/completions", {**CMPL, "logit_bias": {"5": 1.0}}, "logit_bias"),
    ("/v1/completions", {**CMPL, "stream": False, "stream_options": {"include_usage": True}},
     "stream_options"),
    ("/v1/completions", {**CMPL, "frobnicate": 1}, "frobnicate"),
    ("/v1/completions", {**CMPL, "temperature": -1}, "temperature"),
    ("/v1/completions", {**CMPL, "top_p": 0}, "top_p"),
    ("/v1/completions", {**CMPL, "top_k": 0}, "top_k"),
    ("/v1/completions", {**CMPL, "min_tokens": 5}, "min_tokens"),
    ("/v1/completions", {**CMPL, "prompt": []}, "prompt"),
    ("/v1/completions", {**CMPL, "prompt": [[1, 2], []]}, "prompt"),
    ("/v1/completions", {**CMPL, "prompt": ""}, "prompt"),
    ("/v1/completions", {**CMPL, "prompt": [1, 99999]}, "prompt"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 99}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, "tools"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}}, "response_format"),
    ("/v1/completions", {**CMPL, "structured_outputs": {"regex": "(a"}}, "structured_outputs"),
]


@pytest.mark.parametrize("route,body,param", BAD, ids=[f"{r[4:]}-{p}" for r, _, p in BAD])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_request_is_400(http, route, body, param, stream):
    err = assert_error(http.post(route, json={"stream": stream, **body}), 400, param)
    assert err["type"] == "invalid_request_error"
    assert_still_serving(http)


@pytest.mark.parametrize("stream", [False, True])
def test_engine_refusal_is_400(http, stream):
    # Fits max_model_len (256) but not the 128-token cache: the engine's ValueError.
    body = {**CMPL, "max_tokens": 200, "stream": stream}
    assert "cache" in assert_error(http.post("/v1/completions", json=body), 400)["message"]
    assert_still_serving(http)


@pytest.mark.parametrize("content", [b"{not json", b"", b"[1, 2]", b"\xff\xfe", b"null"])
def test_malformed_json_is_400(http, content):
    resp = http.post("/v1/completions", content=content,
                     headers={"Content-Type": "application/json"})
    assert_error(resp, 400)
    assert_still_serving(http)


def test_unknown_model_is_404(http):
    err = assert_error(http.post("/v1/completions", json={**CMPL, "model": "gpt-9"}), 404,
                       "model")
    assert err["code"] == "model_not_found"
    assert_still_serving(http)


def test_unknown_route_and_method(http):
    assert_error(http.post("/v1/embeddings", json=CMPL), 404)
    assert_error(http.get("/v1/completions"), 405)
    assert_still_serving(http)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": f"Basic {API_KEY}"},
                                     {"Authorization": "Bearer \u00e9t\u00e9".encode("latin-1")}])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/v1/models"])
def test_api_key_required(live_server, http, headers, route):
    with httpx.Client(base_url=live_server.url, timeout=30) as bare:
        if route == "/v1/models":
            resp = bare.get(route, headers=headers)
        else:
            resp = bare.post(route, json=CMPL if "chat" not in route else CHAT,
                             headers=headers)
        assert assert_error(resp, 401)["code"] == "invalid_api_key"
        assert bare.get("/health").status_code == 200  # health needs no key
    assert_still_serving(http)


def test_openai_client_errors(live_server):
    bad_key = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.completions.create(model=NAME, prompt="Hi", max_tokens=2)
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=NAME, prompt="Hi", max_tokens=1000)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=CHAT["messages"])
    assert client.completions.create(model=NAME, prompt="Hi", max_tokens=2).choices


def test_engine_failure_mid_stream_then_503(live_server, http, monkeypatch):
    """Last in the module: it kills the engine. Requests under way (a stream and an
    unstreamed one) end with an error event and [DONE], and a 503; then /health and every
    new request answer 503."""
    core = live_server.engine.core
    original = core.step

    def failing_step():
        if len(core.scheduler.running) >= 2:  # once both requests run
            raise RuntimeError("boom")
        return original()

    monkeypatch.setattr(core, "step", failing_step)
    body = {**CMPL, "max_tokens": 60, "ignore_eos": True}
    with ThreadPoolExecutor(1) as pool:
        unstreamed = pool.submit(http.post, "/v1/completions", json=body)
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            assert resp.status_code == 200
            events = [line[len("data: "):] for line in resp.iter_lines()
                      if line.startswith("data: ")]
        assert "boom" in assert_error(unstreamed.result(), 503)["message"]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "boom" in error["message"] and error["code"] == "engine_dead"
    assert_error(http.get("/health"), 503)
    for route, body in (("/v1/completions", CMPL), ("/v1/chat/completions", CHAT)):
        for stream in (False, True):
            assert_error(http.post(route, json={**body, "stream": stream}), 503)
