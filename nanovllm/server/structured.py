"""OpenAI's response_format and vLLM's structured_outputs request fields, parsed into the
engine's StructuredOutputsParams (tool_choice's grammar: see tools.py)."""
from typing import Any

from nanovllm.server.errors import bad_request
from nanovllm.structured.params import StructuredOutputsParams


def structured_outputs_params(response_format: dict[str, Any] | None,
                              structured_outputs: dict[str, Any] | None,
                              field: str) -> StructuredOutputsParams | None:
    """The two fields as StructuredOutputsParams; None for text. A 400 naming the field
    (`field` for a malformed spec) when one is malformed (the schema itself is checked later,
    by the grammar library)."""
    rf, so = response_format, structured_outputs
    if rf and so:
        raise bad_request("give response_format or structured_outputs, not both",
                          "structured_outputs")
    try:
        if so:
            return StructuredOutputsParams(**so)
        kind = None if rf is None else rf.get("type")
        if kind in (None, "text"):
            return None
        if kind == "json_object":
            return StructuredOutputsParams(json_object=True)
        if kind == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise ValueError("response_format.json_schema.schema must be a JSON schema "
                                 "object: {'type': 'json_schema', 'json_schema': {'name': "
                                 "..., 'schema': {...}}}")
            return StructuredOutputsParams(json=schema)
    except TypeError as e:  # an unknown key of structured_outputs
        raise bad_request(f"structured_outputs: {e}", "structured_outputs") from e
    except ValueError as e:
        raise bad_request(str(e), field) from e
    raise bad_request(f"response_format type {kind!r} is not supported: use 'text', "
                      f"'json_object' or 'json_schema'", "response_format")
