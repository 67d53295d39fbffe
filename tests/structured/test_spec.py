"""StructuredOutputsParams: exactly one kind, checked types, cache keys; specs parsed into
xgrammar grammars with errors naming the field; SamplingParams refuses what cannot work."""
import pytest

from nanovllm import SamplingParams, StructuredOutputsParams
from nanovllm.structured import validate


@pytest.mark.parametrize("kw, message", [
    ({}, "exactly one of json, regex, choice, grammar, json_object; got 0"),
    (dict(json={"type": "object"}, regex="a"), "got 2 (json, regex)"),
    (dict(json=3), "StructuredOutputsParams.json=3 is invalid"),
    (dict(regex=""), "StructuredOutputsParams.regex='' is invalid: must be a non-empty"),
    (dict(grammar=b"root ::= 'a'"), "StructuredOutputsParams.grammar=b"),
    (dict(choice="yes"), "StructuredOutputsParams.choice='yes' is invalid"),
    (dict(choice=["yes", ""]), "non-empty list of non-empty strings"),
    (dict(choice=[]), r"StructuredOutputsParams.choice=\[\] is invalid"),
    (dict(json_object="yes"), "json_object='yes' is invalid: must be True"),
    (dict(regex="a", disable_any_whitespace=1), "disable_any_whitespace=1 is invalid"),
])
def test_bad_params_name_the_field(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        StructuredOutputsParams(**kw)


def test_kind_and_key():
    a = StructuredOutputsParams(json={"type": "object", "properties": {"x": {}}})
    b = StructuredOutputsParams(json='{"type": "object", "properties": {"x": {}}}')
    assert a.kind == b.kind == "json" and a.key == b.key  # a dict keys like its JSON text
    c = StructuredOutputsParams(choice=("a", "b"))
    assert c.choice == ["a", "b"] and c.key == ("choice", ("a", "b"), False)
    assert StructuredOutputsParams(json_object=True).kind == "json_object"
    loose = StructuredOutputsParams(regex="a+")
    assert loose.key != StructuredOutputsParams(regex="a+", disable_any_whitespace=True).key


def test_sampling_params_check_structured_outputs():
    with pytest.raises(ValueError, match="SamplingParams.structured_outputs="):
        SamplingParams(structured_outputs={"json": {}})
    with pytest.raises(ValueError, match="SamplingParams.min_tokens=2 is invalid"):
        SamplingParams(min_tokens=2, structured_outputs=StructuredOutputsParams(regex="a"))
    sp = SamplingParams(n=2, seed=1, structured_outputs=StructuredOutputsParams(regex="a"))
    assert sp.for_sample(1).structured_outputs is sp.structured_outputs


@pytest.mark.parametrize("kw", [
    dict(json={"type": "object", "properties": {"a": {"type": "integer"}}}),
    dict(json='{"type": "array", "items": {"enum": [1, "x"]}}'),
    dict(json_object=True),
    dict(regex=r"\d{3}-[a-z]+"),
    dict(choice=['say "hi"', "back\\slash", "naïve"]),
    dict(grammar='root ::= "a" b\nb ::= [0-9]+'),
])
def test_valid_specs_parse(kw):
    validate(StructuredOutputsParams(**kw))


@pytest.mark.parametrize("kw, field, why", [
    (dict(json={"type": "integer", "minimum": "zero"}), "json", "must be a number"),
    (dict(json="[1, 2"), "json", "not valid JSON"),
    (dict(regex="a{2"), "regex", "Regex"),
    (dict(grammar="root ::= ("), "grammar", "EBNF"),
])
def test_invalid_specs_raise_naming_the_field(kw, field, why):
    with pytest.raises(ValueError, match=f"StructuredOutputsParams.{field} .*{why}"):
        validate(StructuredOutputsParams(**kw))
