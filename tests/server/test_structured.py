"""Structured output through the server with the official openai client: response_format
json_schema (chat and completions, streamed and not) and json_object, vLLM's
structured_outputs extra; bad schemas are a 400 naming the field, and the server serves on
with every block free. The toy model has random weights: the grammar alone makes the
outputs valid."""
import json
import re

import jsonschema
import openai
import pytest

from tests.server.conftest import NAME, SHARED_OVERRIDES

ENGINE_OVERRIDES = SHARED_OVERRIDES
MESSAGES = [{"role": "user", "content": "Who are you? Answer in JSON."}]
SCHEMA = {"type": "object", "required": ["name", "age"],
          "properties": {"name": {"type": "string", "pattern": "^[A-Za-z ]{1,8}$"},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "pets": {"type": "array", "items": {"enum": ["cat", "dog"]},
                                  "maxItems": 2}}}
JSON_SCHEMA = {"type": "json_schema",
               "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0)


def check(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_json_schema(client, live_server, stream):
    kw = dict(model=NAME, messages=MESSAGES, max_tokens=180, temperature=1.0, seed=3, n=3,
              response_format=JSON_SCHEMA)
    if stream:
        texts, reasons = {}, {}
        for chunk in client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
                reasons[c.index] = c.finish_reason or reasons.get(c.index)
        choices = [(texts[i], reasons[i]) for i in range(3)]
    else:
        resp = client.chat.completions.create(**kw)
        choices = [(c.message.content, c.finish_reason) for c in resp.choices]
    for text, reason in choices:
        assert reason == "stop"
        check(text)
    live_server.wait_idle()


@pytest.mark.parametrize("stream", [False, True])
def test_completions_json_schema_and_regex_extra(client, live_server, stream):
    """response_format works on completions too (as in vLLM), and so does the
    structured_outputs extra body field."""
    kw = dict(model=NAME, prompt="A person:", max_tokens=180, temperature=1.0, seed=5)
    cases = [dict(extra_body={"response_format": JSON_SCHEMA}),
             dict(extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}),
             dict(extra_body={"structured_outputs": {"choice": ["left", "right"]}})]
    texts = []
    for case in cases:
        if stream:
            chunks = list(client.completions.create(stream=True, **kw, **case))
            texts.append("".join(c.choices[0].text for c in chunks if c.choices))
            assert chunks[-1].choices[0].finish_reason == "stop"
        else:
            c = client.completions.create(**kw, **case).choices[0]
            assert c.finish_reason == "stop"
            texts.append(c.text)
    check(texts[0])
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", texts[1]) and texts[2] in ("left", "right")
    live_server.wait_idle()


def test_json_object(client, live_server):
    resp = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=150,
                                          temperature=1.0, seed=1, n=6,
                                          response_format={"type": "json_object"})
    done = [c.message.content for c in resp.choices if c.finish_reason == "stop"]
    assert done  # a random model may run out of tokens inside an object: some do not
    assert all(isinstance(json.loads(text), dict) for text in done)
    live_server.wait_idle()


@pytest.mark.parametrize("body, param, says", [
    (dict(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}),
     "response_format", 'Unsupported type "nope"'),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     "response_format", "json_schema.schema must be a JSON schema"),
    (dict(response_format={"type": "xml"}), "response_format", "'xml' is not supported"),
    (dict(structured_outputs={"regex": "(a"}), "structured_outputs", "regex is invalid"),
    (dict(structured_outputs={"regex": "a", "choice": ["b"]}), "structured_outputs",
     "exactly one of"),
    (dict(structured_outputs={"schema": {}}), "structured_outputs", "unexpected keyword"),
])
def test_bad_structured_requests_are_400(client, live_server, body, param, says):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=5,
                                       extra_body=body)
    error = info.value.body
    assert error["param"] == param and says in error["message"], error
    ok = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=180,
                                        response_format=JSON_SCHEMA, temperature=1.0, seed=3)
    check(ok.choices[0].message.content)
    live_server.wait_idle()


def test_fifty_random_schemas_through_the_server(live_server):
    """The offline test's 50 random schemas (tests/support/schemas.py), sent at once through
    the openai client, every other one streamed: each output ends with "stop" and validates."""
    import asyncio

    from tests.support.schemas import random_schemas

    schemas = random_schemas(50, seed=0)

    async def one(client, i, schema):
        kw = dict(model=NAME, prompt="Give me JSON:", max_tokens=200, temperature=1.0, seed=i,
                  extra_body={"structured_outputs": {"json": schema,
                                                     "disable_any_whitespace": True}})
        if i % 2:
            chunks = [c async for c in await client.completions.create(stream=True, **kw)]
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            reason = chunks[-1].choices[0].finish_reason
        else:
            choice = (await client.completions.create(**kw)).choices[0]
            text, reason = choice.text, choice.finish_reason
        return text, reason

    async def run_all():
        async with openai.AsyncOpenAI(base_url=f"{live_server.url}/v1", api_key="unused",
                                      max_retries=0) as client:
            return await asyncio.gather(*(one(client, i, s) for i, s in enumerate(schemas)))

    for (text, reason), schema in zip(asyncio.run(run_all()), schemas):
        assert reason == "stop", (text, schema)
        jsonschema.validate(json.loads(text), schema)
    live_server.wait_idle()
