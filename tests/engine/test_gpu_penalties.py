"""Penalties and min_tokens on a GPU: CUDA-graph decode, with async scheduling on and off,
gives the tokens of eager decode (torch attention); greedy rows also match the CPU engine,
which the CPU suite checks against Hugging Face."""
import pytest

from nanovllm import LLM, SamplingParams
from tests.support.penalties import CASES, mixed_params
from tests.support.prompts import make_prompts

pytestmark = pytest.mark.gpu
MODEL = "untied_gqa4_d64"
PROMPTS = make_prompts(6, 12, shared=40, every=3, max_len=89)
SPS = mixed_params(6, len(PROMPTS))


def outputs(path, **kw):
    """Completions (token ids, finish reason) of two rounds (the second with prefix-cache
    hits), and whether decode ran in CUDA graphs and async."""
    llm = LLM(path, dtype="float32", kvcache_block_size=16, max_model_len=512, max_num_seqs=16,
              **kw)
    rounds = [[[(c.token_ids, c.finish_reason) for c in o.outputs]
               for o in llm.generate(PROMPTS, SPS, use_tqdm=False)] for _ in range(2)]
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    how = (llm.clients[0].core.executor.runner.graphs is not None, llm.clients[0].core.async_scheduling)
    llm.shutdown()
    assert rounds[0] == rounds[1]
    return rounds[0], how


@pytest.mark.parametrize("engine", [{}, dict(num_kvcache_blocks=24, max_num_batched_tokens=50)],
                         ids=["plain", "preemption+chunked"])
def test_graphs_and_async_match_eager(toy_models, engine):
    path = toy_models[MODEL]
    ref, how = outputs(path, device="cuda", attention_backend="torch", enforce_eager=True,
                       async_scheduling=False, **engine)
    assert how == (False, False)
    for on in (False, True):
        got, how = outputs(path, device="cuda", attention_backend="triton", async_scheduling=on,
                           **engine)
        assert how == (True, on)
        assert got == ref
    # Seeded rows draw from device-specific random streams: compare the greedy ones.
    cpu, _ = outputs(path, device="cpu", **engine)
    greedy = [i for i, sp in enumerate(SPS) if sp.temperature == 0]
    assert [cpu[i] for i in greedy] == [ref[i] for i in greedy]


def test_bf16_with_the_fused_sampler(toy_models):
    # Unseeded temperature rows take the fused Triton sampler after the penalty pass.
    llm = LLM(toy_models["tied_mha_d16"], device="cuda", dtype="bfloat16", max_num_seqs=64)
    stops = list(range(3, 400))  # nearly every token the prompts lead to
    sps = [SamplingParams(temperature=0.7 * (i % 2), max_tokens=20, min_tokens=6,
                          stop_token_ids=stops, **CASES[i % len(CASES)]) for i in range(40)]
    outs = llm.generate(make_prompts(0, 40), sps, use_tqdm=False)
    for o in outs:
        toks = o["token_ids"]
        assert len(toks) >= 7 or o["finish_reason"] == "length"
        assert not set(toks[:6]) & set(stops)
    llm.shutdown()
