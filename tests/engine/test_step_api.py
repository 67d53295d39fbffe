"""The step API (add_request / step / is_finished) and how it meets generate()."""
import pytest

from nanovllm import LLM, SamplingParams
from tests.support.text import STOP_PROMPT, greedy_with_stop


@pytest.fixture(scope="module")
def llm(toy_models):
    return LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256)


def run_steps(llm) -> dict:
    outputs = {}
    while not llm.is_finished():
        finished, _ = llm.step()
        outputs.update((o["request_id"], o) for o in finished)
    return outputs


def test_step_returns_the_outputs_generate_returns(llm):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["abc", [9, 8, 7]]
    expected = llm.generate(prompts, greedy, use_tqdm=False)
    ids = [llm.add_request(p, greedy) for p in prompts]
    got = run_steps(llm)
    assert sorted(got) == sorted(ids)
    for rid, want in zip(ids, expected):
        assert got[rid] == dict(want, request_id=rid)


def test_step_applies_stop_strings_and_hides_special_tokens(llm):
    text, stop, sp = greedy_with_stop(llm)
    want = llm.generate([STOP_PROMPT], sp, use_tqdm=False)[0]
    rid = llm.add_request(STOP_PROMPT, sp)
    out = run_steps(llm)[rid]
    assert out["finish_reason"] == "stop"
    assert out["text"] == want["text"] == text[: text.find(stop)]
    assert stop not in out["text"]
    # The end token of a finished request is not part of its text.
    eos = llm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    rid = llm.add_request([5, 6], SamplingParams(temperature=0, max_tokens=8,
                                                 stop_token_ids=[eos]))
    assert "<|im_end|>" not in run_steps(llm)[rid]["text"]


def test_generate_refuses_while_step_requests_are_pending(llm):
    sp = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    rid = llm.add_request([1, 2, 3], sp)
    with pytest.raises(ValueError, match="pending"):
        llm.generate(["x"], sp, use_tqdm=False)
    # Nothing was lost: the pending request still completes, and generate works afterwards.
    assert list(run_steps(llm)) == [rid]
    assert len(llm.generate(["x"], sp, use_tqdm=False)) == 1
    bm = llm.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
