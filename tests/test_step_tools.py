"""The step-level measuring tools' host-side parts: tools/step_buckets.py cutting a profile
into decode steps, and tools/ab_inproc.py and tools/ab_engines.py reading their variants."""
import pytest

from tools.ab_engines import variant_args
from tools.ab_inproc import parse_variant
from tools.step_buckets import kind, steps_of


def test_kernels_sorted_by_kind():
    assert kind("_decode_partial_kernel") == "attn"
    assert kind("_tma_gemm_kernel") == kind("nvjet_sm90_tst_64x64_bz_TNT") == "gemm"
    assert kind("_rms_norm_kernel") == "norm" and kind("_slice_stats_kernel") == "sample"
    assert kind("_silu_and_mul_kernel") == "other"


def test_steps_end_at_the_sampler_and_count_attention_calls():
    events = [(0, 5, "_rms_norm_kernel"), (5, 15, "_decode_partial_kernel"),
              (15, 18, "_slice_stats_kernel"), (20, 30, "_tma_gemm_kernel"),
              (30, 31, "_slice_stats_kernel"), (40, 41, "_copy_kernel")]
    first, second = steps_of(events)  # (the trailing copy belongs to no finished step)
    assert first == {"norm": 5, "attn": 10, "attn_calls": 1, "sample": 3}
    assert second["gemm"] == 10 and second["attn_calls"] == 0


def test_variants_take_the_tunables_type_and_name_an_unknown_one():
    tables = {"decode": {"BLOCK_N": 64, "LPT": True}}
    assert parse_variant("base", tables) == []
    assert parse_variant("decode.BLOCK_N=32,decode.LPT=0", tables) == [
        ("decode", "BLOCK_N", 32), ("decode", "LPT", False)]
    with pytest.raises(ValueError, match="decode.WAVES"):
        parse_variant("decode.WAVES=2", tables)


def test_engine_variants_add_options_and_share_the_memory():
    shared = ["--num-seqs", "4", "--gpu-memory-utilization", "0.8"]
    first = variant_args(shared, "", 0, 2)
    second = variant_args(shared, "--quantization fp8", 1, 2)
    assert first.quantization is None and second.quantization == "fp8"
    assert first.num_seqs == second.num_seqs == 4
    assert (first.gpu_memory_utilization, second.gpu_memory_utilization) == (0.4, 0.8)
    with pytest.raises(ValueError, match="--num-seqs=0"):
        variant_args(shared, "--num-seqs 0", 0, 2)
