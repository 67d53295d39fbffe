"""Tool calling with the official openai client: tool_choice "required" and a named function
make the toy model (random weights) call the tools with arguments valid for their parameters
(the grammar forces them), streamed and not, finish_reason "tool_calls"; a conversation with
earlier calls and tool results renders; "auto" parses Hermes/Qwen <tool_call> blocks (end
to end too: a regex makes the toy model write one); bad tools are a 400."""
import json

import jsonschema
import openai
import pytest

from nanovllm.server.tools import ToolPlan
from tests.server.conftest import NAME, SHARED_OVERRIDES

ENGINE_OVERRIDES = SHARED_OVERRIDES
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "object", "required": ["city", "unit"],
           "properties": {"city": {"enum": ["Paris", "Oslo"]},
                          "unit": {"enum": ["celsius", "fahrenheit"]}}}
TIME = {"type": "object", "required": ["hour"],
        "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time.",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0)


def check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def streamed(stream) -> tuple[str | None, list, str]:
    """(content, tool calls, finish_reason) of a streamed choice 0, as a client adds them up."""
    content, calls, reason = None, {}, None
    for chunk in stream:
        for c in chunk.choices:
            if c.delta.content:
                content = (content or "") + c.delta.content
            for call in c.delta.tool_calls or []:
                calls[call.index] = call
            reason = c.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_required_and_named_tool_choice(client, live_server, stream, choice):
    tool_choice = choice if choice == "required" else {
        "type": "function", "function": {"name": choice}}
    kw = dict(model=NAME, messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice,
              max_tokens=200, temperature=1.0, seed=4)
    if stream:
        content, calls, reason = streamed(client.chat.completions.create(stream=True, **kw))
    else:
        c = client.chat.completions.create(**kw).choices[0]
        content, calls, reason = c.message.content, c.message.tool_calls, c.finish_reason
    assert reason == "tool_calls" and content is None
    check_calls(calls)
    if choice != "required":
        assert [call.function.name for call in calls] == [choice]
    live_server.wait_idle()


def test_a_conversation_with_earlier_calls_renders(client, live_server):
    messages = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather",
                          "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]
    resp = client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS,
                                          max_tokens=5, temperature=0)
    assert resp.choices[0].finish_reason in ("stop", "length", "tool_calls")
    live_server.wait_idle()


@pytest.mark.parametrize("stream", [False, True])
def test_auto_round_trips_a_call_the_model_writes(client, live_server, stream):
    """tool_choice "auto" end to end: the toy model is made to write a Hermes call (a regex
    through the structured_outputs extra, which "auto" allows), and the client gets it back
    as tool_calls with finish_reason "tool_calls", streamed and not."""
    regex = (r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "(Paris|Oslo)", '
             r'"unit": "celsius"\}\}</tool_call>')
    kw = dict(model=NAME, messages=MESSAGES, tools=TOOLS, tool_choice="auto", max_tokens=200,
              temperature=1.0, seed=5, extra_body={"structured_outputs": {"regex": regex}})
    if stream:
        content, calls, reason = streamed(client.chat.completions.create(stream=True, **kw))
    else:
        c = client.chat.completions.create(**kw).choices[0]
        content, calls, reason = c.message.content, c.message.tool_calls, c.finish_reason
    assert reason == "tool_calls" and not content
    check_calls(calls)
    assert [call.function.name for call in calls] == ["get_weather"]
    live_server.wait_idle()


def test_auto_parses_hermes_tool_calls():
    plan = ToolPlan(TOOLS, "auto")
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
            '"Oslo", "unit": "celsius"}}\n</tool_call>\n<tool_call>{"name": "get_time", '
            '"arguments": {"hour": 3}}</tool_call>')
    content, calls = plan.parse(text)
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] \
        == [("get_weather", {"city": "Oslo", "unit": "celsius"}), ("get_time", {"hour": 3})]
    assert plan.parse("no call here") == ("no call here", [])
    broken = "<tool_call>{not json</tool_call>"
    assert plan.parse(broken) == (broken, [])
    assert ToolPlan(TOOLS, "named", "get_time").parse('{"hour": ') == ('{"hour": ', [])


@pytest.mark.parametrize("body, param", [
    (dict(tools=[{"type": "function"}]), "tools"),
    (dict(tools=["get_weather"]), "tools"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice"),
    (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
     "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nope"}}}}}], tool_choice="required"),
     "tools"),
])
def test_bad_tools_are_400(client, live_server, body, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=5,
                                       extra_body=body)
    assert info.value.body["param"] == param, info.value.body
    live_server.wait_idle()
