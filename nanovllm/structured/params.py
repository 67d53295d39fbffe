"""StructuredOutputsParams: a request's output constraint as plain data (vLLM's names),
checked when made; turning it into a grammar is spec.py's job. No torch, no xgrammar here."""
import json
from collections.abc import Iterable
from dataclasses import dataclass

from nanovllm.param_checks import short


@dataclass
class StructuredOutputsParams:
    """Constrain the output to a grammar (vLLM's names): exactly one of a JSON schema
    (`json`: dict or JSON text), any JSON object (`json_object=True`), a regular expression
    (`regex`), one of several strings (`choice`) or an EBNF grammar (`grammar`)."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # JSON: no whitespace between elements (vLLM's option); by default a little is allowed.
    disable_any_whitespace: bool = False

    KINDS = ("json", "regex", "choice", "grammar", "json_object")

    def __post_init__(self):
        given = [k for k in self.KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"StructuredOutputsParams needs exactly one of {', '.join(self.KINDS)}"
                             f"; got {len(given)} ({', '.join(given) or 'none'})")
        kind = given[0]
        value = getattr(self, kind)
        if kind == "json" and not isinstance(value, (dict, str)):
            raise ValueError(f"StructuredOutputsParams.json={short(value)} is invalid: must be "
                             f"a JSON schema, as a dict or as JSON text")
        if kind in ("regex", "grammar") and (not isinstance(value, str) or not value):
            raise ValueError(f"StructuredOutputsParams.{kind}={short(value)} is invalid: must "
                             f"be a non-empty string")
        if kind == "choice":
            if (isinstance(value, (str, bytes)) or not isinstance(value, Iterable)):
                value = None
            else:
                value = list(value)
            if not value or any(not isinstance(c, str) or not c for c in value):
                raise ValueError(f"StructuredOutputsParams.choice={short(self.choice)} is "
                                 f"invalid: must be a non-empty list of non-empty strings")
            self.choice = value
        if kind == "json_object" and self.json_object is not True:
            raise ValueError(f"StructuredOutputsParams.json_object={self.json_object!r} is "
                             f"invalid: must be True (or left out)")
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError(f"StructuredOutputsParams.disable_any_whitespace="
                             f"{short(self.disable_any_whitespace)} is invalid: must be True "
                             f"or False")

    @property
    def kind(self) -> str:
        """Which constraint is set: "json", "regex", "choice", "grammar" or "json_object"."""
        return next(k for k in self.KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> tuple:
        """(kind, spec, whitespace option): equal keys compile to the same grammar (a schema
        dict as JSON text, its key order kept: properties are generated in that order)."""
        kind = self.kind
        value = getattr(self, kind)
        if kind == "json" and isinstance(value, dict):
            try:
                value = json.dumps(value)
            except (TypeError, ValueError) as e:
                raise ValueError(f"StructuredOutputsParams.json is not valid JSON: {e}") from None
        elif kind == "choice":
            value = tuple(value)
        return kind, value, self.disable_any_whitespace
