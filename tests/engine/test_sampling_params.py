import pytest

from nanovllm import SamplingParams


def test_defaults_match_vllm():
    sp = SamplingParams()
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.max_tokens) == (1.0, 1.0, -1, 0.0, 64)
    assert sp.ignore_eos is False and sp.seed is None
    assert sp.stop_token_ids == [] and sp.stop == []
    assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (1.0, 0.0, 0.0)
    assert sp.min_tokens == 0 and not sp.penalized


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
    (dict(max_tokens=-1), "max_tokens"),
    (dict(max_tokens=1.5), "max_tokens"),
    (dict(seed="x"), "seed"),
    (dict(stop_token_ids=[-1]), "stop_token_ids"),
    (dict(stop=[""]), "stop"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=-1.0), "repetition_penalty"),
    (dict(presence_penalty=-2.01), "presence_penalty"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-3), "frequency_penalty"),
    (dict(frequency_penalty=2.01), "frequency_penalty"),
    (dict(min_tokens=-1), "min_tokens"),
    (dict(min_tokens=11, max_tokens=10), "min_tokens"),
])
def test_invalid_values_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kw)


@pytest.mark.parametrize("kw, field", [
    (dict(stop=5), "stop"),
    (dict(stop=[5]), "stop"),
    (dict(stop_token_ids=5.5), "stop_token_ids"),
    (dict(stop_token_ids="7"), "stop_token_ids"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(temperature="0.5"), "temperature"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(min_p=float("nan")), "min_p"),
    (dict(ignore_eos="no"), "ignore_eos"),
    (dict(ignore_eos=1), "ignore_eos"),
    (dict(max_tokens=True), "max_tokens"),
    (dict(n=0), "n"),
    (dict(n=-2), "n"),
    (dict(n=2.0), "n"),
    (dict(n="2"), "n"),
    (dict(n=True), "n"),
    (dict(n=None), "n"),
    (dict(repetition_penalty=float("nan")), "repetition_penalty"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(repetition_penalty="1.1"), "repetition_penalty"),
    (dict(presence_penalty=float("nan")), "presence_penalty"),
    (dict(presence_penalty=None), "presence_penalty"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    (dict(frequency_penalty=True), "frequency_penalty"),
    (dict(min_tokens=1.5), "min_tokens"),
    (dict(min_tokens=True), "min_tokens"),
    (dict(min_tokens=None), "min_tokens"),
])
def test_wrong_types_and_nan_are_value_errors(kw, field):
    # The README promises ValueError for every bad field, never a TypeError or silent accept.
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kw)


def test_numpy_numbers_and_single_ids_are_accepted():
    np = pytest.importorskip("numpy")
    sp = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(4), max_tokens=np.int32(7),
                        seed=np.int64(3), stop_token_ids=np.array([1, 2]))
    assert (sp.temperature, sp.top_k, sp.max_tokens, sp.seed) == (0.5, 4, 7, 3)
    assert sp.stop_token_ids == [1, 2] and all(type(t) is int for t in sp.stop_token_ids)
    assert type(sp.max_tokens) is int and type(sp.temperature) is float
    assert SamplingParams(stop_token_ids=9).stop_token_ids == [9]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


def test_n_and_the_params_of_each_sample():
    np = pytest.importorskip("numpy")
    sp = SamplingParams(n=np.int64(3), seed=40, temperature=0.5)
    assert sp.n == 3 and type(sp.n) is int and SamplingParams().n == 1
    # vLLM seeds sample i with seed + i; each sample is one completion.
    assert [(p.n, p.seed) for p in map(sp.for_sample, range(3))] == [(1, 40), (1, 41), (1, 42)]
    assert sp.for_sample(2).temperature == 0.5 and sp.n == 3  # sp itself is unchanged
    assert SamplingParams(n=2).for_sample(1).seed is None  # unseeded: independent draws


def test_penalties_and_min_tokens_take_vllm_ranges_and_numpy_numbers():
    np = pytest.importorskip("numpy")
    sp = SamplingParams(repetition_penalty=np.float32(1.5), presence_penalty=np.float64(-2.0),
                        frequency_penalty=2, min_tokens=np.int64(4), max_tokens=4)
    assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (1.5, -2.0, 2.0)
    assert sp.min_tokens == 4 and type(sp.min_tokens) is int and sp.penalized
    assert all(type(v) is float for v in (sp.repetition_penalty, sp.presence_penalty,
                                          sp.frequency_penalty))
    assert SamplingParams(repetition_penalty=0.01).penalized  # any value > 0 (vLLM)
    assert not SamplingParams(min_tokens=3).penalized  # min_tokens needs no token history
    with pytest.raises(ValueError, match=r"min_tokens=5 .*max_tokens=4"):
        SamplingParams(min_tokens=5, max_tokens=4)


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("value", [-1, 21, 2.0, "3", True, [1]])
def test_logprob_counts_are_0_to_20(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}=.*\[0, 20\]"):
        SamplingParams(**{field: value})


def test_logprob_counts_are_plain_ints_or_none():
    np = pytest.importorskip("numpy")
    sp = SamplingParams(logprobs=np.int64(0), prompt_logprobs=20)
    assert (sp.logprobs, sp.prompt_logprobs) == (0, 20) and type(sp.logprobs) is int
    assert SamplingParams().logprobs is None and SamplingParams().prompt_logprobs is None
    # Prompt logprobs belong to the request (sample 0); every sample has its own logprobs.
    sp = SamplingParams(n=2, logprobs=3, prompt_logprobs=1)
    assert [(p.logprobs, p.prompt_logprobs) for p in map(sp.for_sample, range(2))] == \
        [(3, 1), (3, None)]


BIG = 2 ** 63  # one past int64: what the engine's tensors and seeds can hold


@pytest.mark.parametrize("kw, field", [
    (dict(top_k=BIG), "top_k"),
    (dict(top_k=10 ** 30), "top_k"),
    (dict(seed=BIG), "seed"),
    (dict(seed=-BIG - 1), "seed"),
    (dict(max_tokens=BIG), "max_tokens"),
    (dict(n=129), "n"),
    (dict(n=10 ** 6), "n"),
    (dict(stop_token_ids=[BIG]), "stop_token_ids"),
    (dict(stop_token_ids=list(range(1025))), "stop_token_ids"),
    (dict(stop=["x"] * 65), "stop"),
    (dict(stop=["ok", "\ud800"]), r"stop\[1\]"),
])
def test_values_past_what_the_engine_holds_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kw)


def test_limits_themselves_are_accepted():
    sp = SamplingParams(top_k=BIG - 1, seed=-BIG, max_tokens=BIG - 1, n=128,
                        stop=["x"] * 64, stop_token_ids=list(range(1024)))
    assert sp.top_k == BIG - 1 and sp.seed == -BIG


def test_a_long_bad_list_makes_a_short_message():
    with pytest.raises(ValueError) as info:
        SamplingParams(stop=["x"] * 1000)
    assert len(str(info.value)) < 300 and "at most 64" in str(info.value)


def test_top_k_past_the_vocabulary_keeps_every_token():
    """The sampler clamps top_k to the vocabulary: int64's largest value samples like -1."""
    import torch

    from nanovllm.engine.sampling_rows import sampling_rows
    from nanovllm.worker.sampler import Sampler, SamplingTensors
    from nanovllm.worker.stager import Stager

    logits = torch.randn(2, 50)
    params = [SamplingParams(top_k=BIG - 1, seed=1), SamplingParams(top_k=-1, seed=1)]
    rows = sampling_rows(params, [0, 0], 50)
    dev = Stager(torch.device("cpu")).upload(dict(temperatures=rows.temperatures,
                                                  top_ks=rows.top_ks))
    st = SamplingTensors.from_rows(rows, dev)
    assert st.top_ks.tolist() == [50, 50]
    ids = Sampler()(logits[[0, 0]], st)
    assert ids[0] == ids[1]  # same seed, same step, same (unfiltered) distribution
