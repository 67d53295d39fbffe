"""Our Qwen3 against Hugging Face transformers on random checkpoints (fp32, CPU)."""
import random

import pytest

from nanovllm import LLM, SamplingParams
from tests.support.hf_oracle import check_teacher_forced_logits, hf_greedy
from tests.support.prompts import make_prompts

MODELS = ["tied_mha_d16", "untied_gqa4_d64", "tied_gqa4_d16_l4"]
NEW_TOKENS = 32


def check_greedy(llm, path, prompts, n=NEW_TOKENS, **sp):
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **sp),
                        use_tqdm=False)
    for p, o in zip(prompts, outs):
        assert o["token_ids"] == hf_greedy(path, tuple(p), n)
        assert o["finish_reason"] == "length"
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "blocks leaked after generate"


@pytest.mark.parametrize("name", MODELS)
def test_teacher_forced_logits_match_hf(toy_models, name):
    path = toy_models[name]
    llm = LLM(path, kvcache_block_size=16, num_kvcache_blocks=64)
    check_teacher_forced_logits(llm, path, make_prompts(1, n=4))


@pytest.mark.parametrize("name", MODELS)
def test_greedy_batch_matches_hf(toy_models, name):
    path = toy_models[name]
    llm = LLM(path, kvcache_block_size=16)
    check_greedy(llm, path, make_prompts(2, n=9))


@pytest.mark.parametrize("block_size", [16, 256])
def test_same_tokens_under_preemption(toy_models, block_size):
    path = toy_models["untied_gqa4_d64"]
    rng = random.Random(3)
    # Prompts end just before a block boundary, so decoding needs new blocks; five blocks
    # hold only a few sequences at a time: decode must preempt and recompute.
    prompts = [[rng.randrange(3, 400) for _ in range(rng.randrange(block_size - 10, block_size))]
               for _ in range(8)]
    llm = LLM(path, kvcache_block_size=block_size, num_kvcache_blocks=5)
    check_greedy(llm, path, prompts)
    assert llm.clients[0].core.scheduler.num_preemptions > 0


@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_same_tokens_with_prefix_cache_on_and_off(toy_models, block_size, prefix_caching):
    path = toy_models["tied_gqa4_d16_l4"]
    shared = list(range(100, 100 + 2 * block_size + 5))
    prompts = make_prompts(4, n=8, shared=shared)
    llm = LLM(path, kvcache_block_size=block_size, enable_prefix_caching=prefix_caching,
              max_model_len=1024)
    check_greedy(llm, path, prompts, n=8)
    # Again, now with every prompt in the cache; a prompt of exactly 2 blocks is fully cached.
    full = shared[: 2 * block_size]
    check_greedy(llm, path, prompts + [full], n=8)
    check_greedy(llm, path, [full], n=8)
    hits = llm.clients[0].core.scheduler.block_manager.num_hit_tokens
    assert (hits > 0) == prefix_caching


def test_same_tokens_with_chunked_prefill(toy_models):
    path = toy_models["tied_mha_d16"]
    prompts = make_prompts(5, n=8)
    # A 13-token budget cuts nearly every prompt into chunks.
    llm = LLM(path, kvcache_block_size=16, max_num_batched_tokens=13, max_num_seqs=8)
    check_greedy(llm, path, prompts)


def test_bad_inputs_raise_and_engine_keeps_working(toy_models):
    path = toy_models["tied_mha_d16"]
    llm = LLM(path, kvcache_block_size=16, max_model_len=128)
    good = [[5, 6, 7]]
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    bad_cases = [
        ([[]], sp),                                   # empty prompt
        ([list(range(3, 200))], sp),                  # longer than max_model_len
        ([[1, 2, 10_000]], sp),                       # token id >= vocab size
        ([[1, 2], [3, 4]], [sp]),                     # wrong number of sampling params
        (good, "greedy"),                             # not a SamplingParams
        ([good[0], [-1]], sp),                        # one bad request among good ones
    ]
    for prompts, params in bad_cases:
        with pytest.raises(ValueError):
            llm.generate(prompts, params, use_tqdm=False)
        assert llm.is_finished()
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    out = llm.generate(good, sp, use_tqdm=False)
    assert out[0]["token_ids"] == hf_greedy(path, tuple(good[0]), 4)
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
