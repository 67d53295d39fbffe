"""build_app without a real engine: a bug inside a route still answers OpenAI-shaped JSON
(500), and /health follows engine.is_running."""
import asyncio
from types import SimpleNamespace

import httpx
import pytest

from nanovllm.server import build_app


class BrokenTokenizer:
    def encode(self, text):
        raise KeyError("a bug")


def fake_engine(running: bool = True):
    config = SimpleNamespace(max_model_len=256, hf_config=SimpleNamespace(vocab_size=512),
                             generation_defaults=SimpleNamespace(sampling={}))
    return SimpleNamespace(config=config, tokenizer=BrokenTokenizer(), is_running=running,
                           error=None)


def call(app, method: str, path: str, **kw) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, **kw)
    return asyncio.run(go())


def test_unexpected_error_is_json_500():
    app = build_app(fake_engine(), "toy")
    resp = call(app, "POST", "/v1/completions", json={"model": "toy", "prompt": "hi"})
    assert resp.status_code == 500
    err = resp.json()["error"]
    assert err["type"] == "server_error" and "KeyError" in err["message"]


def test_health_follows_the_engine():
    assert call(build_app(fake_engine(True), "toy"), "GET", "/health").status_code == 200
    resp = call(build_app(fake_engine(False), "toy"), "GET", "/health")
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_dead"


@pytest.mark.parametrize("key", ["", "  ", 123])
def test_empty_api_key_is_refused(key):
    with pytest.raises(ValueError, match="api_key"):
        build_app(fake_engine(), "toy", api_key=key)


def test_fields_a_request_leaves_out_come_from_generation_config():
    from nanovllm.server.protocol import CompletionRequest

    model = {"temperature": 0.3, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1}
    req = CompletionRequest.model_validate({"model": "m", "prompt": "hi", "top_p": 0.5})
    sp = req.sampling_params(16, None, model)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.repetition_penalty) == (0.3, 0.5, 20, 1.1)
    plain = req.sampling_params(16, None, {})  # no file: OpenAI's defaults
    assert (plain.temperature, plain.top_k, plain.repetition_penalty) == (1.0, -1, 1.0)
