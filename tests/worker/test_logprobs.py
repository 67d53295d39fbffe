"""Logprobs on the device: the packed layout and vLLM's rank (CPU); on a GPU (`gpu` marker),
CUDA-graph decode, chunked prefill, pinned copies that arrive a step late with async
scheduling, float32 against HF's float32 logprobs, bfloat16 within a bfloat16 tolerance."""
import pytest
import torch

from nanovllm import LLM, SamplingParams
from nanovllm.worker.logprobs import pack_logprobs
from tests.support.logprobs import assert_close, check_output, hf_logprobs
from tests.support.prompts import make_prompts


def test_pack_layout_and_vllm_rank_with_ties():
    logprobs = torch.log_softmax(torch.tensor([[1.0, 3.0, 3.0, 0.0, 2.0],
                                               [5.0, 1.0, 1.0, 1.0, 4.0]]), -1)
    packed = pack_logprobs(logprobs, torch.tensor([2, 3], dtype=torch.int32), 2)
    ints = packed.view(torch.int32)
    assert packed.shape == (2, 6) and packed.dtype == torch.float32
    assert torch.equal(packed[:, 0], logprobs[[0, 1], [2, 3]])
    # vLLM counts the tokens at least as likely: a tie ranks last among its equals.
    assert ints[:, 1].tolist() == [2, 5]
    assert ints[:, 4:].tolist()[1] == [0, 4]
    assert torch.equal(packed[:, 2:4], logprobs.topk(2).values)
    assert pack_logprobs(logprobs, torch.tensor([0, 0]), 0).shape == (2, 2)


MODEL = "tied_gqa4_d16_l4"
BASE = dict(max_tokens=24, ignore_eos=True)
SPS = [SamplingParams(temperature=0, logprobs=5, prompt_logprobs=3, **BASE),
       SamplingParams(temperature=0.8, top_k=20, seed=3, logprobs=2, **BASE),
       SamplingParams(temperature=0, logprobs=0, prompt_logprobs=1, **BASE),
       SamplingParams(temperature=0, **BASE)]


def run(path, async_scheduling: bool, dtype: str, prompts, sps):
    # A 64-token budget chunks the longer prompts; 16 sequences fit the cache: no preemption,
    # so both loops see the same batches.
    llm = LLM(path, device="cuda", dtype=dtype, enforce_eager=False, kvcache_block_size=16,
              max_num_seqs=16, max_model_len=512, max_num_batched_tokens=64,
              async_scheduling=async_scheduling)
    core = llm.clients[0].core
    assert core.executor.runner.graphs is not None and core.async_scheduling is async_scheduling
    outs = llm.generate(prompts, sps, use_tqdm=False)
    assert llm.clients[0].core.scheduler.num_preemptions == 0
    llm.shutdown()
    return outs


def prompts_and_params(n: int = 12):
    prompts = make_prompts(0, n, shared=60, every=3, max_len=89)
    return prompts, [SPS[i % len(SPS)] for i in range(n)]


@pytest.mark.gpu
def test_fp32_graphs_match_hf_and_async_equals_sync(toy_models):
    path = toy_models[MODEL]
    prompts, sps = prompts_and_params()
    sync = run(path, False, "float32", prompts, sps)
    asyn = run(path, True, "float32", prompts, sps)
    for a, b, sp in zip(asyn, sync, sps):
        assert_close(a, b, tol=1e-5)
        # Exact (ieee) fp32 attention; GPU matmuls sum in another order than the CPU's.
        check_output(path, a, sp.logprobs, sp.prompt_logprobs, tol=1e-3)


@pytest.mark.gpu
def test_bf16_graphs_are_close_to_hf(toy_models):
    path = toy_models[MODEL]
    prompts, sps = prompts_and_params()
    sync = run(path, False, "bfloat16", prompts, sps)
    asyn = run(path, True, "bfloat16", prompts, sps)
    errors = []
    for a, b, sp in zip(asyn, sync, sps):
        assert_close(a, b, tol=1e-3)  # the same batches, the same kernels
        c = a.outputs[0]
        if sp.logprobs is not None:
            ref = hf_logprobs(path, a.prompt_token_ids + c.token_ids)[len(a.prompt_token_ids) - 1:]
            for d, t, row in zip(c.logprobs, c.token_ids, ref):
                errors.append(abs(d[t].logprob - row[t].item()))
                assert len(d) in (sp.logprobs, sp.logprobs + 1) and next(iter(d)) == t
        if sp.prompt_logprobs is not None:
            ref = hf_logprobs(path, a.prompt_token_ids)
            assert len(a.prompt_logprobs) == len(a.prompt_token_ids)
            for p, d in enumerate(a.prompt_logprobs[1:], 1):
                t = a.prompt_token_ids[p]
                errors.append(abs(d[t].logprob - ref[p - 1, t].item()))
    # bf16 weights and activations: HF's own bf16 run is ~0.04 off on average (0.3 at most)
    # on this toy model.
    errors = torch.tensor(errors)
    assert errors.mean() < 0.1 and errors.max() < 0.75, (errors.mean(), errors.max())
