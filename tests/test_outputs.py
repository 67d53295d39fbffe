"""RequestOutput / CompletionOutput: vLLM's fields, and nano-vLLM's dict access to them."""
import pytest

from nanovllm import CompletionOutput, RequestOutput


def make(**completion) -> RequestOutput:
    c = dict(index=0, text="hi there", token_ids=[5, 6], finish_reason="stop", stop_reason=" t")
    c.update(completion)
    return RequestOutput(request_id=7, prompt="say hi", prompt_token_ids=[1, 2, 3],
                         outputs=[CompletionOutput(**c)], finished=True)


def test_vllm_fields():
    out = make()
    assert (out.request_id, out.prompt, out.prompt_token_ids, out.finished) == \
        (7, "say hi", [1, 2, 3], True)
    c = out.outputs[0]
    assert (c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason) == \
        (0, "hi there", [5, 6], "stop", " t")
    assert c.logprobs is None and c.cumulative_logprob is None
    assert c.finished() and not make(finish_reason=None).outputs[0].finished()


def test_dict_access_reads_the_first_completion():
    out = make()
    assert (out["request_id"], out["text"], out["token_ids"], out["finish_reason"]) == \
        (7, "hi there", [5, 6], "stop")
    assert set(out) == {"request_id", "text", "token_ids", "finish_reason"} and len(out) == 4
    assert dict(out) == {"request_id": 7, "text": "hi there", "token_ids": [5, 6],
                         "finish_reason": "stop"}
    assert "text" in out and "prompt" not in out and out.get("prompt") is None
    with pytest.raises(KeyError, match="attributes"):
        out["prompt"]


def test_equality_with_outputs_and_dicts():
    assert make() == make()
    assert make() != make(stop_reason=None)  # all fields count between RequestOutputs
    assert make() == {"request_id": 7, "text": "hi there", "token_ids": [5, 6],
                      "finish_reason": "stop"}
    assert make() != {"request_id": 7, "text": "other", "token_ids": [5, 6],
                      "finish_reason": "stop"}
    assert make() != "hi there"


def test_logprob_fields_and_equality():
    from nanovllm import Logprob

    lp = {5: Logprob(-0.25, 1, "hi")}
    out = make(logprobs=[lp], cumulative_logprob=-0.25)
    out.prompt_logprobs = [None, {3: Logprob(-1.5, 4, None)}]
    c = out.outputs[0]
    assert c.logprobs[0][5].rank == 1 and c.logprobs[0][5].decoded_token == "hi"
    assert make().prompt_logprobs is None  # not asked for
    same = make(logprobs=[{5: Logprob(-0.25, 1, "hi")}], cumulative_logprob=-0.25)
    same.prompt_logprobs = [None, {3: Logprob(-1.5, 4, None)}]
    assert out == same
    same.prompt_logprobs = [None, {3: Logprob(-1.0, 4, None)}]
    assert out != same
    # The nano-vLLM dict view is unchanged by logprobs.
    assert set(out) == {"request_id", "text", "token_ids", "finish_reason"}
    assert out == {"request_id": 7, "text": "hi there", "token_ids": [5, 6],
                   "finish_reason": "stop"}
