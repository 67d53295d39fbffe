"""The official openai client against the live server: completions and chat, streamed and
not, give the offline LLM's text (greedy, and seeded sampling with n=2), stop strings and
logprobs."""
import openai
import pytest

from nanovllm import SamplingParams
from tests.server.conftest import NAME, SHARED_OVERRIDES, LiveServer

ENGINE_OVERRIDES = SHARED_OVERRIDES
PROMPTS = ["The quick brown fox", "Hello, world! nanovllm", "What is the capital of"]
MESSAGES = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "List all prime numbers within 100."}]


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0)


def reference(offline, prompt, **kw) -> list:
    return offline.generate([prompt], SamplingParams(**kw), use_tqdm=False)[0].outputs


def streamed_texts(stream, chat: bool) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in stream:
        for c in chunk.choices:
            piece = c.delta.content if chat else c.text
            texts[c.index] = texts.get(c.index, "") + (piece or "")
    return texts


@pytest.mark.parametrize("stream", [False, True])
def test_completions_greedy_match_offline(client, offline, stream):
    want = [reference(offline, p, temperature=0, max_tokens=12, ignore_eos=True)[0].text
            for p in PROMPTS]
    kw = dict(model=NAME, prompt=PROMPTS, max_tokens=12, temperature=0,
              extra_body={"ignore_eos": True})
    if stream:
        got = streamed_texts(client.completions.create(stream=True, **kw), chat=False)
        assert [got[i] for i in range(len(PROMPTS))] == want
    else:
        resp = client.completions.create(**kw)
        assert [c.index for c in resp.choices] == [0, 1, 2]
        assert [c.text for c in resp.choices] == want
        assert all(c.finish_reason == "length" for c in resp.choices)
        assert resp.usage.completion_tokens == 12 * len(PROMPTS)
        prompt_len = sum(len(offline.tokenizer.encode(p)) for p in PROMPTS)
        assert resp.usage.prompt_tokens == prompt_len


def test_token_id_prompt(client, offline):
    ids = [5, 17, 42, 99, 123]
    want = reference(offline, ids, temperature=0, max_tokens=8, ignore_eos=True)[0].text
    resp = client.completions.create(model=NAME, prompt=ids, max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert resp.choices[0].text == want and resp.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_greedy_matches_offline(client, offline, stream):
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    want = offline.chat(MESSAGES, sp, use_tqdm=False)[0].outputs[0].text
    kw = dict(model=NAME, messages=MESSAGES, max_tokens=10, temperature=0,
              extra_body={"ignore_eos": True})
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kw))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert streamed_texts(chunks, chat=True) == {0: want}
        assert chunks[-1].choices[0].finish_reason == "length"
    else:
        resp = client.chat.completions.create(**kw)
        assert resp.object == "chat.completion"
        assert resp.choices[0].message.role == "assistant"
        assert resp.choices[0].message.content == want


@pytest.mark.parametrize("stream", [False, True])
def test_seeded_n2_matches_offline(client, offline, stream):
    sp = dict(temperature=0.9, top_p=0.95, seed=1234, n=2, max_tokens=10, ignore_eos=True)
    want = [o.text for o in reference(offline, PROMPTS[0], **sp)]
    assert want[0] != want[1]  # the samples differ, so the comparison means something
    kw = dict(model=NAME, prompt=PROMPTS[0], max_tokens=10, temperature=0.9, top_p=0.95,
              seed=1234, n=2, extra_body={"ignore_eos": True})
    if stream:
        got = streamed_texts(client.completions.create(stream=True, **kw), chat=False)
    else:
        got = {c.index: c.text for c in client.completions.create(**kw).choices}
    assert got == {0: want[0], 1: want[1]}
    chat_want = [o.text for o in offline.chat(MESSAGES, SamplingParams(**sp),
                                               use_tqdm=False)[0].outputs]
    chat = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=10, n=2,
                                          temperature=0.9, top_p=0.95, seed=1234,
                                          extra_body={"ignore_eos": True})
    assert [c.message.content for c in chat.choices] == chat_want


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string(client, offline, stream):
    full = reference(offline, PROMPTS[1], temperature=0, max_tokens=16, ignore_eos=True)[0]
    # A stop string from the middle of the greedy text, made of printable characters.
    stop = next(ch for ch in full.text[2:] if ch.isprintable() and ch != "\ufffd")
    want = reference(offline, PROMPTS[1], temperature=0, max_tokens=16, ignore_eos=True,
                     stop=[stop])[0]
    assert want.finish_reason == "stop" and stop not in want.text
    kw = dict(model=NAME, prompt=PROMPTS[1], max_tokens=16, temperature=0, stop=[stop],
              extra_body={"ignore_eos": True})
    if stream:
        chunks = list(client.completions.create(stream=True, **kw))
        assert "".join(c.choices[0].text for c in chunks) == want.text
        assert chunks[-1].choices[0].finish_reason == "stop"
    else:
        choice = client.completions.create(**kw).choices[0]
        assert (choice.text, choice.finish_reason) == (want.text, "stop")
        assert choice.model_extra["stop_reason"] == stop  # vLLM's extra field


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs(client, offline, stream):
    want = reference(offline, PROMPTS[2], temperature=0, max_tokens=6, ignore_eos=True,
                     logprobs=3)[0]
    kw = dict(model=NAME, prompt=PROMPTS[2], max_tokens=6, temperature=0, logprobs=3,
              extra_body={"ignore_eos": True})
    if stream:  # the chunks' lists, concatenated, are the whole response's
        parts = [c.choices[0].logprobs for c in client.completions.create(stream=True, **kw)
                 if c.choices[0].logprobs]
        lp = parts[0]
        for part in parts[1:]:
            for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                getattr(lp, field).extend(getattr(part, field))
    else:
        lp = client.completions.create(**kw).choices[0].logprobs
    chosen = [pos[t] for pos, t in zip(want.logprobs, want.token_ids)]
    assert lp.tokens == [c.decoded_token for c in chosen]
    assert lp.token_logprobs == pytest.approx([c.logprob for c in chosen], abs=1e-5)
    for top, pos in zip(lp.top_logprobs, want.logprobs):
        assert top == pytest.approx({x.decoded_token: x.logprob for x in pos.values()},
                                    abs=1e-5)
    assert lp.text_offset[0] == 0
    assert all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:],
                                                   lp.tokens))


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs(client, offline, stream):
    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=2)
    want = offline.chat(MESSAGES, sp, use_tqdm=False)[0].outputs[0]
    kw = dict(model=NAME, messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True,
              top_logprobs=2, extra_body={"ignore_eos": True})
    if stream:
        items = [x for chunk in client.chat.completions.create(stream=True, **kw)
                 for c in chunk.choices if c.logprobs for x in c.logprobs.content]
    else:
        items = client.chat.completions.create(**kw).choices[0].logprobs.content
    assert len(items) == 5
    for item, pos, tid in zip(items, want.logprobs, want.token_ids):
        assert item.logprob == pytest.approx(pos[tid].logprob, abs=1e-5)
        assert item.bytes == list(item.token.encode())
        ranked = sorted(pos.values(), key=lambda x: x.rank)[:2]
        assert [t.logprob for t in item.top_logprobs] == pytest.approx(
            [x.logprob for x in ranked], abs=1e-5)


def test_models_and_usage_chunk(client):
    assert [m.id for m in client.models.list().data] == [NAME]
    chunks = list(client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=4,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_template_option(live_server, offline):
    """A server given its own chat template uses it (a second server on the same engine)."""
    template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                "[assistant] ")
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = offline.chat(MESSAGES, sp, use_tqdm=False, chat_template=template)[0]
    default = offline.chat(MESSAGES, sp, use_tqdm=False)[0]
    assert want.prompt_token_ids != default.prompt_token_ids
    other = LiveServer(live_server.engine, chat_template=template)
    try:
        client = openai.OpenAI(base_url=f"{other.url}/v1", api_key="unused", max_retries=0)
        resp = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=8,
                                              temperature=0, extra_body={"ignore_eos": True})
    finally:
        other.stop()
    assert resp.choices[0].message.content == want.outputs[0].text
    assert resp.usage.prompt_tokens == len(want.prompt_token_ids)
