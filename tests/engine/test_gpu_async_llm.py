"""AsyncLLM on a GPU: streams under CUDA graphs and async scheduling add up to the offline
outputs of the same engine settings, with preemption and chunked prefill."""
import asyncio

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.engine.async_llm import AsyncLLM
from tests.support.prompts import make_prompts

pytestmark = pytest.mark.gpu
MODEL = "untied_gqa4_d64"
PROMPTS = make_prompts(9, 16, shared=40, every=3, max_len=89)
KW = dict(device="cuda", dtype="float32", kvcache_block_size=16, max_model_len=512,
          max_num_seqs=8, num_kvcache_blocks=40, max_num_batched_tokens=64)


def params(i: int) -> SamplingParams:
    return [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
            SamplingParams(temperature=0.9, seed=i, max_tokens=33, ignore_eos=True),
            SamplingParams(temperature=0.7, seed=i, n=2, max_tokens=20, ignore_eos=True)][i % 3]


def test_streams_equal_offline_under_graphs_and_async(toy_models):
    path = toy_models[MODEL]
    llm = LLM(path, **KW)
    assert llm.async_scheduling and llm.executor.runner.graphs is not None
    ref = [[c.token_ids for c in o.outputs]
           for o in llm.generate(PROMPTS, [params(i) for i in range(len(PROMPTS))],
                                 use_tqdm=False)]
    llm.shutdown()
    engine = AsyncLLM(path, **KW)

    async def one(i):
        ids = {}
        async for out in engine.generate({"prompt_token_ids": PROMPTS[i]}, params(i)):
            for c in out.outputs:
                ids[c.index] = ids.get(c.index, []) + c.token_ids
        return [ids[k] for k in sorted(ids)]

    async def main():
        return await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))

    got = asyncio.run(main())
    stats = engine.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"]
    engine.shutdown()
    assert got == ref
