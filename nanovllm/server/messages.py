"""The messages of a chat completion request (OpenAI's shapes: text parts, an assistant's
tool calls, a tool's answer), and their form for the chat template."""
from typing import Literal

from pydantic import BaseModel, ConfigDict

from nanovllm.server.tools import template_message

# Every request body's config. strict: no lax coercion ("logprobs": 0 is not a bool, [[false]]
# is not a token-id prompt); extra="forbid": a field we do not know is refused, not ignored.
STRICT = ConfigDict(extra="forbid", strict=True)


class TextPart(BaseModel):
    """A text content part of a chat message (the only kind supported)."""

    model_config = STRICT
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    """A function call an assistant message made: its name and arguments (JSON text)."""

    model_config = STRICT
    name: str
    arguments: str


class ToolCall(BaseModel):
    """One tool call of an assistant message."""

    model_config = STRICT
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message of a conversation."""

    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    def as_dict(self) -> dict:
        """{"role", "content"} with the text parts joined, as chat templates expect (and
        tool calls with their arguments as objects)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": self.role, "content": content or ""}
        if self.name is not None:  # templates that know the field may use it
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            message["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        return template_message(message)
