"""Qwen2, Llama and Qwen3-MoE against Hugging Face transformers on random checkpoints (fp32,
CPU): teacher-forced logits, greedy tokens under preemption / chunked prefill / prefix caching,
and tensor parallelism (gloo)."""
import pytest

from nanovllm import LLM, SamplingParams
from tests.conftest import ARCH_MODELS
from tests.support.hf_oracle import check_teacher_forced_logits, hf_greedy
from tests.support.prompts import make_prompts

NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
# Half the prompts share a 40-token prefix (two full blocks of 16) so a second run hits the
# prefix cache; ten blocks hold only some sequences (decode preempts); a 23-token budget cuts
# prompts into chunks.
PROMPTS = dict(n=8, shared=40, max_len=50)
ENGINE = dict(kvcache_block_size=16, num_kvcache_blocks=10, max_num_batched_tokens=23,
              max_model_len=256, device="cpu")
# One checkpoint per architecture for tensor parallelism (the MoE one splits every expert).
TP_MODELS = ["qwen2_untied_gqa7", "llama3_tied_bias", "moe_e8_top2", "moe_e4_top1"]


def hf_tokens(path, prompts):
    return [hf_greedy(path, tuple(p), NEW_TOKENS) for p in prompts]


def tokens(llm, prompts):
    return [o["token_ids"] for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("name", list(ARCH_MODELS))
def test_teacher_forced_logits_match_hf(arch_models, name):
    path = arch_models[name]
    llm = LLM(path, kvcache_block_size=16, num_kvcache_blocks=32, device="cpu")
    # Up to 150 positions: past the llama3 checkpoint's original context of 64.
    check_teacher_forced_logits(llm, path, make_prompts(2, n=3, max_len=150))
    llm.shutdown()


@pytest.mark.parametrize("name", list(ARCH_MODELS))
def test_greedy_matches_hf_with_preemption_chunks_and_prefix_cache(arch_models, name):
    path = arch_models[name]
    prompts = make_prompts(4, **PROMPTS)
    expected = hf_tokens(path, prompts)
    llm = LLM(path, **ENGINE)
    assert tokens(llm, prompts) == expected
    assert tokens(llm, prompts) == expected  # again, now reading the prefix cache
    sched = llm.clients[0].core.scheduler
    assert sched.num_preemptions > 0 and sched.block_manager.num_hit_tokens > 0
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks
    llm.shutdown()


@pytest.mark.parametrize("name", TP_MODELS)
def test_tp2_matches_tp1(arch_models, name):
    # The prompts of the single-rank test above, whose tokens equal HF's: HF's (cached when
    # that test ran) stand for TP=1's.
    path = arch_models[name]
    prompts = make_prompts(4, **PROMPTS)
    with LLM(path, tensor_parallel_size=2, **ENGINE) as llm:
        assert tokens(llm, prompts) == hf_tokens(path, prompts)
        assert llm.clients[0].core.scheduler.num_preemptions > 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ARCH_MODELS))
def test_gpu_triton_kernels_and_graphs_match_hf(arch_models, name):
    # fp32 on the GPU: Triton attention and fused-MoE kernels, decode in CUDA graphs, chunked
    # prefill and preemption, against HF on the CPU.
    path = arch_models[name]
    prompts = make_prompts(6, **PROMPTS)
    with LLM(path, **dict(ENGINE, device="cuda"), dtype="float32", max_num_seqs=16) as llm:
        assert llm.clients[0].core.executor.runner.graphs is not None
        assert tokens(llm, prompts) == hf_tokens(path, prompts)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [23, 256])
@pytest.mark.parametrize("name", list(ARCH_MODELS))
def test_gpu_mixed_steps_in_piecewise_graphs_match_hf(arch_models, name, budget):
    # Prefill and mixed steps replaying piecewise graphs (every layer kind between the
    # attention cuts: biases, MoE blocks, dense MLPs), one bucket of 23 tokens or three
    # (64 / 128 / 256, padded), against HF.
    path = arch_models[name]
    prompts = make_prompts(6, **PROMPTS)
    engine = dict(ENGINE, device="cuda", max_num_batched_tokens=budget, num_kvcache_blocks=40)
    with LLM(path, **engine, dtype="float32", max_num_seqs=16, enable_mixed_steps=True) as llm:
        core = llm.clients[0].core
        assert core.executor.runner.prefill_graphs.sizes == ([23] if budget == 23
                                                             else [64, 128, 256])
        assert tokens(llm, prompts) == hf_tokens(path, prompts)
        assert core.scheduler.num_mixed_steps > 0
