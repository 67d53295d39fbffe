import pytest

from nanovllm import SamplingParams


def test_defaults_match_vllm():
    sp = SamplingParams()
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.max_tokens) == (1.0, 1.0, -1, 0.0, 64)
    assert sp.ignore_eos is False and sp.seed is None
    assert sp.stop_token_ids == [] and sp.stop == []


def test_stop_string_becomes_list():
    assert SamplingParams(stop="###").stop == ["###"]


@pytest.mark.parametrize("kw, field", [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=0), "top_k"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=-0.5), "min_p"),
    (dict(min_p=2.0), "min_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=1.5), "max_tokens"),
    (dict(seed="x"), "seed"),
    (dict(stop_token_ids=[-1]), "stop_token_ids"),
    (dict(stop=[""]), "stop"),
])
def test_invalid_values_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kw)
