"""max_tokens=0: a request that only computes its prompt (scoring with prompt_logprobs ends
with no token, finish_reason "length", the same prompt logprobs as a generating request, and
every block free) under async scheduling, chunked prefill, n > 1 and logprobs."""
import pytest

from nanovllm import LLM, SamplingParams
from tests.support.logprobs import assert_lists_close
from tests.support.prompts import make_prompts

MODEL = "tied_mha_d16"


@pytest.fixture(scope="module")
def llms(toy_models):
    base = dict(device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=256,
                num_kvcache_blocks=64)
    out = {mode: LLM(toy_models[MODEL], async_scheduling=mode, max_num_batched_tokens=40, **base)
           for mode in (False, True)}
    yield out
    for llm in out.values():
        llm.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_prompt_only_scores_like_a_generating_request(llms, async_scheduling):
    llm = llms[async_scheduling]
    prompts = make_prompts(3, n=6, max_len=70)  # several are chunked (40-token budget)
    scored = llm.generate(prompts, SamplingParams(max_tokens=0, prompt_logprobs=2, logprobs=1,
                                                  n=2, temperature=0), use_tqdm=False)
    reference = llm.generate(prompts, SamplingParams(max_tokens=3, prompt_logprobs=2,
                                                     temperature=0), use_tqdm=False)
    for got, want in zip(scored, reference):
        assert len(got.prompt_logprobs) == len(got.prompt_token_ids)
        assert_lists_close(got.prompt_logprobs, want.prompt_logprobs)  # batches differ
        assert [c.index for c in got.outputs] == [0, 1]
        for c in got.outputs:
            assert (c.token_ids, c.text, c.finish_reason) == ([], "", "length")
            assert c.logprobs == [] and c.cumulative_logprob == 0
    stats = llm.stats()[0]
    assert stats["num_free_blocks"] == stats["num_blocks"] and stats["idle"]


def test_prompt_only_without_logprobs_ends_empty(llms):
    llm = llms[True]
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=0), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"
    assert out.prompt_logprobs is None
