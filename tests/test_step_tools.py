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


def test_gemv_waves_counts_programs_an_sm():
    """tools/gemv_waves.py: programs an SM from registers (allocated in eights), warps, shared
    memory and the 32-program limit; run as a script, it compiles a shape's GEMVs for sm_90
    on any machine and prints a line a layer and kind."""
    import os
    import subprocess
    import sys

    from tools.gemv_waves import per_sm

    assert per_sm(40, 4, 512) == 12 and per_sm(41, 4, 512) == 10 and per_sm(79, 4, 512) == 6
    assert per_sm(16, 2, 0) == 32 and per_sm(32, 4, 0) == 16 and per_sm(64, 4, 60000) == 3
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    tool = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools",
                        "gemv_waves.py")
    out = subprocess.run([sys.executable, tool, "--model-shape", "smollm2-135m"],
                         capture_output=True, text=True, env=env, check=True,
                         timeout=600).stdout
    lines = [line for line in out.splitlines() if " waves " in line]
    assert len(lines) == 9 and all("registers" in line for line in lines), out
