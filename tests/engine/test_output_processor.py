"""Output processing: what a core reports becomes RequestOutputs in one place; deltas read one
at a time add up to the whole output read at once."""
import pytest

from nanovllm import SamplingParams
from nanovllm.engine.messages import Outputs, RequestEnd, SampleDelta
from nanovllm.engine.output_processor import RequestState, failure
from nanovllm.engine.tokenizer import TextDecoder
from nanovllm.utils.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def text(toy_models):
    return TextDecoder(load_tokenizer(toy_models["tied_mha_d16"]))


def entry(lp):
    return (lp, 1, [5], [lp])


def deltas(ids_by_step, stop=None):
    """Sample 0's tokens reported over steps, the last one ending it."""
    out = []
    for i, ids in enumerate(ids_by_step):
        last = i == len(ids_by_step) - 1
        out.append(SampleDelta(1, 0, ids, [entry(-0.5)] * len(ids),
                               "stop" if last else None, stop if last else None))
    return out


def test_deltas_add_up_to_the_whole_output(text):
    sp = SamplingParams(logprobs=1, stop=["zz"], n=2)
    steps = [[30, 31], [32], [33, 34, 35]]
    end = RequestEnd(1, "stop", None)
    whole = RequestState(1, "p", [1, 2], sp, text).output(deltas(steps, "zz"), end)
    state = RequestState(1, "p", [1, 2], sp, text)
    parts = [state.output([d], None) for d in deltas(steps, "zz")[:-1]]
    parts.append(state.output(deltas(steps, "zz")[-1:], end))
    first = [p.outputs[0] for p in parts]
    assert sum((c.token_ids for c in first), []) == whole.outputs[0].token_ids
    assert "".join(c.text for c in first) == whole.outputs[0].text
    assert first[-1].cumulative_logprob == pytest.approx(whole.outputs[0].cumulative_logprob)
    assert whole.outputs[0].cumulative_logprob == pytest.approx(-3.0)
    assert [p.finished for p in parts] == [False, False, True] and whole.finished
    # Sample 1 never forked: it ends with the request, empty, logprobs [] (asked for).
    assert [(c.index, c.token_ids, c.logprobs, c.finish_reason) for c in whole.outputs[1:]] \
        == [(1, [], [], "stop")]
    assert failure(whole) is None


def test_a_failed_request_names_its_error(text):
    out = RequestState(3, None, [1], SamplingParams(), text).output(
        [SampleDelta(3, 0, [], None, "error", "RuntimeError: boom")], RequestEnd(3, "error", None))
    assert failure(out) == "RuntimeError: boom" and out.outputs[0].logprobs is None


def test_coalesced_steps_give_the_same_output(text):
    """A core sending a few steps at once merges each sample's deltas into one (fewer to
    pickle and decode); the receiver sees the same tokens, logprobs, text and end."""
    sp = SamplingParams(logprobs=1, stop=["zz"], n=2)
    steps = [[30, 31], [32], [33, 34, 35]]
    first = deltas(steps, "zz")
    second = [d._replace(index=1, finish_reason=None, stop_reason=None)
              for d in deltas(steps[:2])]
    interleaved = [first[0], second[0], first[1], second[1], first[2]]
    sent = Outputs(samples=list(interleaved))
    sent.coalesce()
    assert [(d.index, d.token_ids, len(d.logprobs), d.finish_reason) for d in sent.samples] \
        == [(0, [30, 31, 32, 33, 34, 35], 6, "stop"), (1, [30, 31, 32], 3, None)]
    assert sent.samples[0].stop_reason == "zz"
    end = RequestEnd(1, "stop", None)
    one = RequestState(1, "p", [1, 2], sp, text).output(interleaved, end)
    merged = RequestState(1, "p", [1, 2], sp, text).output(sent.samples, end)
    assert one == merged
