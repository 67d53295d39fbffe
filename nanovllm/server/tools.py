"""Tool calling, OpenAI's `tools` / `tool_choice` in Hermes/Qwen style: the chat template
renders the tools; the model calls one by writing <tool_call>{"name": ..., "arguments":
{...}}</tool_call>, which becomes a `tool_calls` entry. tool_choice "required" and a named
function constrain the output with structured output (a JSON list of calls, or the named
function's arguments), so the call is always valid JSON for the function's parameters."""
import json
import re
import uuid
from dataclasses import dataclass

from nanovllm.server.errors import bad_request
from nanovllm.structured.params import StructuredOutputsParams

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass
class ToolPlan:
    """A request's tools and how the reply uses them: "auto" (the model decides; its
    <tool_call> blocks are parsed), "required" (at least one call) or "named" (one call of
    `name`)."""

    tools: list[dict]
    mode: str
    name: str | None = None

    def structured_outputs(self) -> StructuredOutputsParams | None:
        """The grammar a "required" or "named" reply follows; None for "auto"."""
        if self.mode == "auto":
            return None
        params = {t["function"]["name"]: _parameters(t) for t in self.tools}
        if self.mode == "named":
            return StructuredOutputsParams(json=params[self.name])
        calls = [{"type": "object", "required": ["name", "arguments"],
                  "properties": {"name": {"const": name}, "arguments": schema}}
                 for name, schema in params.items()]
        return StructuredOutputsParams(json={"type": "array", "minItems": 1,
                                             "items": {"anyOf": calls}})

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(the reply's content, its tool calls in OpenAI's shape). Text that is not a
        well-formed call (e.g. cut by max_tokens) stays content."""
        if self.mode == "auto":
            calls = []
            for block in TOOL_CALL.findall(text):
                call = _loads(block)
                if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                    return text, []  # a malformed block: the whole reply stays text
                calls.append((call["name"], call.get("arguments", {})))
            content = TOOL_CALL.sub("", text).strip() if calls else text
            return content or None, [_call(n, a) for n, a in calls]
        value = _loads(text)
        if self.mode == "named":
            return (text, []) if value is None else (None, [_call(self.name, value)])
        if not isinstance(value, list):
            return text, []
        return None, [_call(c["name"], c["arguments"]) for c in value]


def plan_tools(tools: list | None, tool_choice) -> ToolPlan | None:
    """The request's ToolPlan (None: no tools, or tool_choice "none"); 400 naming the field
    when tools or tool_choice are malformed."""
    if tool_choice is not None and tools is None and tool_choice != "none":
        raise bad_request("tool_choice needs tools", "tool_choice")
    if not tools or tool_choice == "none":
        return None
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (not isinstance(function, dict) or tool.get("type") != "function"
                or not isinstance(function.get("name"), str) or not function["name"]):
            raise bad_request(f"tools[{i}] must be {{'type': 'function', 'function': "
                              f"{{'name': ..., 'parameters': {{...}}}}}}", "tools")
        if not isinstance(function.get("parameters", {}), dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object",
                              "tools")
        names.append(function["name"])
    if tool_choice in (None, "auto"):
        return ToolPlan(tools, "auto")
    if tool_choice == "required":
        return ToolPlan(tools, "required")
    name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) \
        else None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or not name:
        raise bad_request("tool_choice must be 'none', 'auto', 'required' or {'type': "
                          "'function', 'function': {'name': ...}}", "tool_choice")
    if name not in names:
        raise bad_request(f"tool_choice names the function {name!r}, which is not among the "
                          f"tools ({', '.join(names)})", "tool_choice")
    return ToolPlan(tools, "named", name)


def template_message(message: dict) -> dict:
    """An OpenAI message as chat templates read it: an assistant's tool calls with their
    arguments as objects (OpenAI sends them as JSON text)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    converted = []
    for call in calls:
        function = dict(call["function"])
        parsed = _loads(function.get("arguments") or "{}")
        function["arguments"] = parsed if parsed is not None else function.get("arguments")
        converted.append({**call, "function": function})
    return {**message, "tool_calls": converted}


def _parameters(tool: dict) -> dict:
    return tool["function"].get("parameters") or {"type": "object"}


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(name: str, arguments) -> dict:
    """One tool call in OpenAI's shape (arguments as JSON text)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments,
                                                                   ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": text}}
