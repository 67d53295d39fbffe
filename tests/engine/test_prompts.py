"""The prompt forms generate() accepts (vLLM's prompt dicts too), the outputs' vLLM fields,
and what a user can get wrong with them: a ValueError, and the engine keeps serving."""
import numpy as np
import pytest

from nanovllm import LLM, RequestOutput, SamplingParams
from tests.support.text import STOP_PROMPT, greedy_with_stop

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture
def llm(small_llm):
    return small_llm


def ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def test_dict_prompts_equal_plain_ones(llm):
    want = llm.generate(["hello", [4, 5, 6]], GREEDY, use_tqdm=False)
    got = llm.generate([{"prompt": "hello"}, {"prompt_token_ids": [4, 5, 6]}], GREEDY,
                       use_tqdm=False)
    assert ids(got) == ids(want)
    assert [o.prompt_token_ids for o in got] == [o.prompt_token_ids for o in want]
    assert [o.prompt for o in got] == ["hello", None]
    # One dict is one prompt, as one string is; numpy ids and a text label are accepted.
    one = llm.generate({"prompt_token_ids": np.array([4, 5, 6]), "prompt": "label"}, GREEDY,
                       use_tqdm=False)
    assert len(one) == 1 and ids(one) == ids(want[1:]) and one[0].prompt == "label"
    rid = llm.add_request({"prompt": "hello"}, GREEDY)
    done = {}
    while not llm.is_finished():
        done.update((o.request_id, o) for o in llm.step()[0])
    assert done[rid].outputs[0].token_ids == want[0].outputs[0].token_ids


def test_outputs_carry_vllm_fields_and_stop_reasons(llm):
    out = llm.generate(["hello"], GREEDY, use_tqdm=False)[0]
    assert isinstance(out, RequestOutput) and out.finished
    assert out.prompt == "hello" and out.prompt_token_ids == llm.tokenizer.encode("hello")
    c = out.outputs[0]
    assert c.index == 0 and c.finish_reason == "length" and c.stop_reason is None
    assert c.text == out["text"] and c.token_ids == out["token_ids"] and len(c.token_ids) == 6
    # A stop token id is the stop reason of the request it ended.
    target = c.token_ids[3]
    stopped = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=6,
                                                     stop_token_ids=[target]), use_tqdm=False)[0]
    assert stopped.outputs[0].finish_reason == "stop"
    assert stopped.outputs[0].stop_reason == target == stopped.outputs[0].token_ids[-1]
    # So is a stop string, and the text ends before it.
    text, stop, sp = greedy_with_stop(llm)
    cut = llm.generate([STOP_PROMPT], sp, use_tqdm=False)[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == text[: text.find(stop)]


@pytest.mark.parametrize("prompt, match", [
    ({}, "empty"),
    ({"prompt": 5}, '"prompt" must be a string'),
    ({"prompt_token_ids": "abc"}, '"prompt_token_ids" must be a list of token ids'),
    ({"prompt_token_ids": 5}, '"prompt_token_ids" must be a list of token ids'),
    ({"prompt_token_ids": [1.5]}, "token ids must be integers"),
    ({"prompt_token_ids": [10 ** 6]}, "token ids must be integers"),
    ({"prompt_token_ids": []}, "empty"),
    ({"prompt": "x", "multi_modal_data": {}}, "unsupported key.*multi_modal_data"),
    ({"text": "x"}, r"unsupported key.*\{\"prompt\": str\}"),
])
def test_bad_prompt_dicts(llm, prompt, match):
    for prompts in (prompt, [{"prompt": "fine"}, prompt]):
        with pytest.raises(ValueError, match=match):
            llm.generate(prompts, GREEDY, use_tqdm=False)
        assert llm.is_finished()  # nothing was queued, not even the good prompt
    assert len(llm.generate([{"prompt": "still serving"}], GREEDY, use_tqdm=False)) == 1


@pytest.mark.parametrize("priority, match", [
    ([0], "1 priorities for 2 prompts"),
    ([0, 1.5], "priority=1.5 is invalid"),
    ([0, True], "priority=True is invalid"),
    (3, "one int per prompt"),
    ("high", "one int per prompt"),
])
def test_bad_priorities(llm, priority, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(["a", "b"], GREEDY, use_tqdm=False, priority=priority)
    with pytest.raises(ValueError, match="priority"):
        llm.add_request("a", GREEDY, priority=0.5)
    assert llm.is_finished()
    assert len(llm.generate(["a", "b"], GREEDY, use_tqdm=False, priority=[1, 0])) == 2


def test_priority_orders_requests_not_their_tokens(toy_models):
    llm = LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256,
              max_num_seqs=1)
    prompts = [[4, 5], [6, 7], [8, 9]]
    plain = ids(llm.generate(prompts, GREEDY, use_tqdm=False))
    assert ids(llm.generate(prompts, GREEDY, use_tqdm=False, priority=[2, 0, 1])) == plain
    rids = [llm.add_request(p, GREEDY, priority=pr) for p, pr in zip(prompts, [2, 0, 1])]
    order = []
    while not llm.is_finished():
        order += [o.request_id for o in llm.step()[0]]
    assert order == [rids[1], rids[2], rids[0]]  # one at a time, lowest value first
    llm.shutdown()


def test_text_prompts_need_the_tokenizer(toy_models):
    llm = LLM(toy_models["tied_mha_d16"], kvcache_block_size=16, max_model_len=64,
              skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="skip_tokenizer_init.*prompt_token_ids"):
        llm.generate({"prompt": "text"}, GREEDY, use_tqdm=False)
    out = llm.generate({"prompt_token_ids": [5, 6]}, GREEDY, use_tqdm=False)[0]
    assert out.prompt is None and len(out["token_ids"]) == 6 and out["text"] == ""
    llm.shutdown()
