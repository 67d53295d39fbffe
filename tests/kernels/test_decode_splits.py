"""The decode kernel's split rule (kernels/decode_splits.py): SPLIT_KEYS (each row's split
count by its length, past one program an SM; a one-split row's output written without a
combine) against the dense oracle and the unsplit kernel (interpreter on CPU, real on GPU)."""
import pytest
import torch

from nanovllm.kernels import decode_config, decode_splits
from nanovllm.kernels.triton_decode import decode_attention
from tests.support.markers import needs_interpreter, on_gpu
from tests.support.paged import make_paged_case, naive_attention

# Rows of 1 to many tiles (16-key tiles in the interpreter): with 32 keys a split at least
# and 4 splits a row, they take 1, 1, 2, 3 and 4 splits (the longest capped at 4).
LENGTHS = [5, 17, 40, 70, 150]


@pytest.fixture
def keyed(monkeypatch):
    """SPLIT_KEYS 32 with 4 splits a row, and 2 SMs, so that a few rows are past one program
    an SM (the regime the rule applies in)."""
    monkeypatch.setitem(decode_config.CONFIG, "SPLIT_KEYS", 32)
    monkeypatch.setitem(decode_config.CONFIG, "KEYED_SPLITS", 4)
    monkeypatch.setattr(decode_splits, "_num_sms", lambda device: 2)


@pytest.mark.usefixtures("keyed")
def test_rule_applies_past_one_program_an_sm():
    cfg = decode_config.CONFIG
    assert decode_splits.choose_num_splits(1, 2, "cpu", cfg) == 4
    assert decode_splits.min_split_keys(1, 2, "cpu", dict(cfg, BLOCK_N=16)) == 32
    assert decode_splits.min_split_keys(1, 2, "cpu", dict(cfg, BLOCK_N=64)) == 64  # whole tiles
    assert decode_splits.min_split_keys(1, 1, "cpu", cfg) == 0  # below the SMs: as before
    # A config without SPLIT_KEYS (here the fp8 cache's) keeps the even halves.
    assert decode_splits.choose_num_splits(1, 2, "cpu", decode_config.CONFIG_FP8) == 2
    assert decode_splits.min_split_keys(1, 2, "cpu", decode_config.CONFIG_FP8) == 0


def test_off_by_default():
    for cfg in (decode_config.CONFIG, decode_config.CONFIG_FP8, decode_config.CONFIG_INT8):
        assert cfg["SPLIT_KEYS"] == 0
        assert decode_splits.min_split_keys(4096, 8, "cpu", cfg) == 0


@needs_interpreter
@pytest.mark.usefixtures("keyed", "poisoned_empty")
def test_keyed_splits_match_the_oracle():
    c = make_paged_case([(1, n) for n in LENGTHS], 16, 4, 2, 16, seed=3)
    out = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    one = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale,
                           num_splits=1)
    torch.testing.assert_close(out, naive_attention(c).to(out.dtype), rtol=1e-5, atol=1e-5)
    # Rows that fit one split are written by it as the unsplit kernel writes them.
    assert torch.equal(out[:2], one[:2])


@needs_interpreter
@pytest.mark.usefixtures("keyed", "poisoned_empty")
def test_keyed_splits_over_an_fp8_cache(monkeypatch):
    """An fp8 cache with its own SPLIT_KEYS: the same reads as the torch reference (the
    direct store scales by V's scale, as the combine's output is)."""
    from nanovllm.kernels.torch_ref import decode_attention_torch
    from tests.kernels.test_fp8_kv import quantized_case

    monkeypatch.setitem(decode_config.CONFIG_FP8, "SPLIT_KEYS", 32)
    c = quantized_case(make_paged_case([(1, n) for n in LENGTHS], 16, 4, 2, 16, seed=4),
                       torch.float8_e4m3fn)
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables,
                                 c.scale, c.k_scale, c.v_scale)
    out = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale,
                           k_scale=c.k_scale, v_scale=c.v_scale)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@needs_interpreter
@pytest.mark.usefixtures("poisoned_empty")
def test_a_one_split_row_of_a_split_call_is_the_unsplit_output():
    """Even splits (SPLIT_KEYS off): a row of one tile has one split with keys, whose combine
    of one partial gives the unsplit kernel's row to the bit, as the keyed direct store does."""
    c = make_paged_case([(1, 9), (1, 60), (1, 3)], 16, 4, 2, 16, seed=5)
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    two, one = decode_attention(*args, num_splits=2), decode_attention(*args, num_splits=1)
    assert torch.equal(two[0], one[0]) and torch.equal(two[2], one[2])
    torch.testing.assert_close(two, naive_attention(c).to(two.dtype), rtol=1e-5, atol=1e-5)
    again = decode_attention(*args, num_splits=2)  # the counters were left at zero
    assert torch.equal(again, two)


@needs_interpreter
@pytest.mark.usefixtures("keyed")
def test_keyed_splits_with_the_fused_new_token():
    """The split holding the new key stores it (decode_rope) at any split count a row gets."""
    from nanovllm.kernels.decode_rope import new_token_of
    from nanovllm.kernels.triton_rope import norm_rope_store
    from tests.kernels.test_decode_rope import _case

    q, k, v, pos, slots, rope, (qn, kn), (kc, vc), tables, ctx = _case(
        [3, 20, 50, 90], 4, 2, 16, True)
    weights = (qn.weight, kn.weight, qn.eps)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    q_rot = norm_rope_store(q, k, v, pos, rope.cos_sin_cache, *weights, ref_kc, ref_vc, slots)
    ref = decode_attention(q_rot, ref_kc, ref_vc, ctx, tables, 0.25, num_splits=1)
    new = new_token_of(q, k, v, pos, rope.cos_sin_cache, qn, kn, slots)
    out = decode_attention(q, kc, vc, ctx, tables, 0.25, new=new)
    torch.testing.assert_close(kc, ref_kc, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@on_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_keyed_splits_at_bench_sizes(monkeypatch, dtype):
    """256 rows of 100-2,048 keys (Qwen2.5's 14/2/64 heads), SPLIT_KEYS 256 against the
    default split and one split."""
    lengths = torch.randint(100, 2049, (256,), generator=torch.Generator().manual_seed(0))
    c = make_paged_case([(1, n) for n in lengths.tolist()], 256, 14, 2, 64, seed=1,
                        dtype=dtype, device="cuda")
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    one = decode_attention(*args, num_splits=1)
    monkeypatch.setitem(decode_config.CONFIG, "SPLIT_KEYS", 256)
    keyed = decode_attention(*args)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(keyed, one, rtol=tol, atol=tol)


@on_gpu
def test_gpu_engine_greedy_with_and_without_keyed_splits(toy_models, monkeypatch):
    """The engine's greedy tokens (fp32, graphs) with SPLIT_KEYS off and on; 2 SMs assumed so
    the toy batch is past one program an SM."""
    from nanovllm import LLM, SamplingParams

    prompts = [[(7 * i + j) % 300 + 10 for j in range(n)] for i, n in enumerate((5, 90, 300))]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    monkeypatch.setattr(decode_splits, "_num_sms", lambda device: 2)
    outs = {}
    for keys in (0, 64):
        monkeypatch.setitem(decode_config.CONFIG, "SPLIT_KEYS", keys)
        llm = LLM(toy_models["untied_gqa4_d64"], device="cuda", dtype="float32",
                  num_kvcache_blocks=64, max_model_len=1024)
        try:
            outs[keys] = [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)]
        finally:
            llm.shutdown()
    assert outs[0] == outs[64]
