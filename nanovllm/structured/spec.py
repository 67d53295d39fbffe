"""StructuredOutputsParams -> an xgrammar Grammar: the one place a spec is parsed, so the
front end's validation and the engine's compilation agree on what is valid."""
import functools
import json

from nanovllm.structured.params import StructuredOutputsParams

INSTALL_HINT = "pip install 'nanovllm[structured]'"
# Whitespace allowed between JSON elements: enough for indented output, bounded so that a
# model cannot run away in whitespace (any_whitespace's known failure mode).
MAX_JSON_WHITESPACE = 16


def xgrammar():
    """The xgrammar module (imported on first use: it takes seconds and brings in torch);
    ValueError telling how to install it when it is missing."""
    try:
        import xgrammar
    except ImportError:
        raise ValueError(f"structured_outputs needs the xgrammar package: "
                         f"{INSTALL_HINT}") from None
    return xgrammar


def validate(params: StructuredOutputsParams) -> None:
    """ValueError naming the field when params' schema, regex or grammar is invalid (or
    xgrammar is not installed); parsing is cheap (no tokenizer) and cached."""
    to_grammar(params.key)


@functools.lru_cache(maxsize=256)
def to_grammar(key: tuple):
    """The xgrammar Grammar of a StructuredOutputsParams.key (kind, spec, whitespace)."""
    xgr = xgrammar()
    kind, spec, no_whitespace = key
    whitespace = dict(any_whitespace=not no_whitespace,
                      max_whitespace_cnt=None if no_whitespace else MAX_JSON_WHITESPACE)
    try:
        if kind == "json":
            if isinstance(spec, str):
                _check_json(spec)
            return xgr.Grammar.from_json_schema(spec, **whitespace)
        if kind == "json_object":
            return xgr.Grammar.from_json_schema('{"type": "object"}', **whitespace)
        if kind == "regex":
            return xgr.Grammar.from_regex(spec)
        if kind == "choice":
            # JSON's string escapes are EBNF's: each choice becomes one quoted literal.
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(
                json.dumps(c, ensure_ascii=False) for c in spec))
        return xgr.Grammar.from_ebnf(spec)
    except RuntimeError as e:
        # xgrammar's message starts with its C++ source location: keep what follows.
        why = str(e).strip().split(": ", 1)[-1] if "] /" in str(e) else str(e).strip()
        raise ValueError(f"StructuredOutputsParams.{kind} is invalid: {why}") from None


def _check_json(text: str) -> None:
    try:
        json.loads(text)
    except ValueError as e:
        raise ValueError(f"StructuredOutputsParams.json is not valid JSON: {e}") from None
