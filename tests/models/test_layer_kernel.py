"""A batch-1 decode step runs all dense layers in one launch (kernels/layer_kernel.py; on by
default on a GPU, NANOVLLM_LAYER_KERNEL=1 forces it on the CPU, 0 turns it off). On the CPU
the interpreter runs it a launch per layer and phase; marked gpu, the persistent launch with
its grid barriers runs on the device."""
import random

import pytest
import torch

from nanovllm import LLM
from nanovllm.kernels import layer_launch
from nanovllm.models import one_launch
from tools.fp8_accuracy import context_logits

CPU = dict(device="cpu", num_kvcache_blocks=16, kvcache_block_size=16, max_model_len=512,
           enforce_eager=True)


def _logits(path, on: bool, monkeypatch, calls: list, caches: list | None = None,
            tokens: tuple[int, int] | None = None, **engine) -> torch.Tensor:
    """Teacher-forced logits of a 24-token context (8 prefilled, then batch-1 decode steps
    over contexts that cross a cache block and span two key splits); the KV cache after
    them appended to `caches` when given. On the CPU 19 tokens, 14 prefilled: the four
    decode steps (contexts 15-18) still cross the 16-key block, two of them with a key in
    a second split, in a fifth of the interpreter's time. tokens: (context, prefilled)
    instead."""
    monkeypatch.setenv("NANOVLLM_LAYER_KERNEL", "1" if on else "0")
    one_launch.layer_kernel_mode.cache_clear()
    n, prefill = tokens or ((19, 14) if engine.get("device") == "cpu" else (24, 8))
    llm = LLM(path, **engine)
    try:
        layers = llm.clients[0].core.executor.runner.model.model.layers
        assert all(layer.one_launch == on for layer in layers)
        ctx = [random.Random(1).randrange(400) for _ in range(n)]
        before = len(calls)
        out = context_logits(llm, ctx, prefill)
        if on:  # every decode step went through the kernel, all layers in one call
            assert len(calls) - before == n - prefill - 1
        if caches is not None:
            caches.append(llm.clients[0].core.executor.runner.kv_cache.cpu())
        return out
    finally:
        llm.shutdown()
        one_launch.layer_kernel_mode.cache_clear()


@pytest.fixture
def counted(monkeypatch):
    """Calls of layer_launch.decode_layers, recorded."""
    calls = []
    real = layer_launch.decode_layers

    def wrapper(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(layer_launch, "decode_layers", wrapper)
    return calls


@pytest.mark.parametrize("name", ["tied_mha_d16", "untied_gqa4_d64"])
def test_qwen3_layers_in_one_launch_match_op_by_op(toy_models, monkeypatch, counted, name):
    """Qwen3 (per-head q/k norms; GQA 1 and 4): the logits equal the op-by-op path's to
    float rounding (only the order of the matmuls' sums differs)."""
    runs = {on: _logits(toy_models[name], on, monkeypatch, counted, **CPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)


def test_ungrouped_sums_match_op_by_op(toy_models, monkeypatch, counted):
    """GROUP=1 (a partial sum per product, not per 16 adjacent ones): the same logits."""
    monkeypatch.setitem(layer_launch.CONFIG, "GROUP", 1)
    runs = {on: _logits(toy_models["untied_gqa4_d64"], on, monkeypatch, counted, **CPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)


def test_splits_past_c_splits_combined_in_phase_b(toy_models, monkeypatch, counted):
    """More key splits than phase C combines (8 programs, so 4 splits a kv head; C_SPLITS 2;
    contexts 35-36 in 16-key splits: 3): the last split of each kv head combines them and
    phase C reads its output. The same logits."""
    monkeypatch.setattr(layer_launch, "_programs", lambda device: 8)
    monkeypatch.setitem(layer_launch.CONFIG, "C_SPLITS", 2)
    runs = {on: _logits(toy_models["untied_gqa4_d64"], on, monkeypatch, counted,
                        tokens=(37, 34), **CPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("a_chunk", [False, True])
def test_narrow_last_chunks_and_phase_a_chunks(tmp_path, monkeypatch, counted, a_chunk):
    """CONFIG["TAIL"] and ["A_CHUNK"] with hidden 96 and a wide MLP (intermediate 512), so a
    program's 256 gate_up rows take 64-column chunks: hidden 96 ends in a 32-column chunk,
    loaded with the first in phase D (and in phase A, unless A_CHUNK gives A's 64 qkv rows
    one 128-column chunk). The same logits, over three decode steps."""
    from nanovllm.utils.toy import save_random_qwen3

    path = save_random_qwen3(str(tmp_path / "m"), num_attention_heads=8, num_key_value_heads=2,
                             head_dim=16, hidden_size=96, intermediate_size=512,
                             num_hidden_layers=2)
    monkeypatch.setitem(layer_launch.CONFIG, "TAIL", 64)
    monkeypatch.setitem(layer_launch.CONFIG, "A_CHUNK", a_chunk)
    assert layer_launch._tail(96, 64) == 32 and layer_launch._tail(576, 512) == 64
    runs = {on: _logits(path, on, monkeypatch, counted, tokens=(16, 12), **CPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pre_kv", [0, 1])
def test_old_keys_loaded_before_phase_a_ends(arch_models, monkeypatch, counted, pre_kv):
    """CONFIG["PRE_KV"] 1: each program's first key split (one tile) read before the A -> B
    barrier, the new key put in from registers; 0: read after it."""
    monkeypatch.setitem(layer_launch.CONFIG, "PRE_KV", pre_kv)
    runs = {on: _logits(arch_models["llama_untied_linear"], on, monkeypatch, counted, **CPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)


def test_fp8_weights_in_one_launch(toy_models, monkeypatch, counted):
    """Weights quantized to fp8 at load (row scales): the layer kernel scales each row's
    sum, as the fp8 GEMM does."""
    runs = {on: _logits(toy_models["untied_gqa4_d64"], on, monkeypatch, counted,
                        quantization="fp8", **CPU) for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen2_untied_gqa7", "llama_untied_linear"])
def test_qwen2_and_llama_layers_in_one_launch(arch_models, monkeypatch, counted, name):
    """Qwen2 (q/k/v bias, a hidden size and GQA group that are not powers of two) and Llama
    (scaled RoPE, no bias)."""
    runs = {on: _logits(arch_models[name], on, monkeypatch, counted, **CPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)


def test_layers_it_cannot_run_keep_their_path(arch_models, monkeypatch):
    """An MLP with bias (Llama's mlp_bias) is not one the kernel computes."""
    monkeypatch.setenv("NANOVLLM_LAYER_KERNEL", "1")
    one_launch.layer_kernel_mode.cache_clear()
    llm = LLM(arch_models["llama3_tied_bias"], **CPU)
    try:
        layers = llm.clients[0].core.executor.runner.model.model.layers
        assert not any(layer.one_launch for layer in layers)
    finally:
        llm.shutdown()
        one_launch.layer_kernel_mode.cache_clear()


def test_stack_refuses_tensors_off_a_16_byte_step():
    """The kernel loads weights 16 bytes at a time from offsets of the first layer's: a layer
    whose tensor lies between such steps keeps the launch-per-op path (stack_layers: None)."""
    def layer(buf, at):
        t = {c: None for c in layer_launch.COLUMNS}
        for c in ("w_in", "w_qkv", "w_o", "w_post", "w_gu", "w_down", "k_cache", "v_cache"):
            t[c] = buf[at:at + 64]
        return t

    buf = torch.zeros(256, dtype=torch.bfloat16)
    stack = layer_launch.stack_layers([layer(buf, 0), layer(buf, 64)])
    assert stack["offsets"].tolist() == [[0] * 19, [64 if c else 0 for c in (
        1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0)]]
    assert layer_launch.stack_layers([layer(buf, 0), layer(buf, 65)]) is None


def test_stack_takes_fp8_scales_at_any_element_step():
    """An fp8 cache's scales are read a scalar at a time: each layer's row of the [2, layers,
    Hkv] scales may lie 12 bytes on (3 kv heads), which weights may not."""
    buf = torch.zeros(256, dtype=torch.bfloat16)
    scales = torch.ones(2, 2, 3)
    layers = []
    for i in range(2):
        t = {c: None for c in layer_launch.COLUMNS}
        for c in ("w_in", "w_qkv", "w_o", "w_post", "w_gu", "w_down", "k_cache", "v_cache"):
            t[c] = buf[64 * i:64 * i + 64]
        t["k_scale"], t["v_scale"] = scales[0, i], scales[1, i]
        layers.append(t)
    stack = layer_launch.stack_layers(layers)
    assert stack["offsets"][1, -3:].tolist() == [3, 3, 0]


def test_bad_flag_is_a_value_error(monkeypatch):
    monkeypatch.setenv("NANOVLLM_LAYER_KERNEL", "on")
    one_launch.layer_kernel_mode.cache_clear()
    with pytest.raises(ValueError, match="NANOVLLM_LAYER_KERNEL='on'"):
        one_launch.layer_kernel_mode()
    one_launch.layer_kernel_mode.cache_clear()


GPU = dict(kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=512, enforce_eager=True,
           dtype="bfloat16")


@pytest.mark.gpu
@pytest.mark.parametrize("name,quantization,kv", [("untied_gqa4_d64", None, "auto"),
                                                  ("tied_gqa4_d16_l4", None, "auto"),
                                                  ("untied_gqa4_d64", "fp8", "auto"),
                                                  ("untied_gqa4_d64", None, "fp8_e4m3"),
                                                  ("tied_gqa4_d16_l4", None, "fp8_e4m3"),
                                                  ("untied_gqa4_d64", None, "fp8_e5m2")])
def test_gpu_one_launch_matches_op_by_op(toy_models, monkeypatch, counted, name, quantization,
                                         kv):
    """On the device, one persistent launch with grid barriers, bf16 (fp8 weights widened
    with integer ops; an fp8 cache with its mixing and K feedback, at head_dim 16 the feedback;
    e5m2 without the feedback): the logits, and over an fp8 cache the stored K codes."""
    caches = []
    runs = {on: _logits(toy_models[name], on, monkeypatch, counted, caches,
                        quantization=quantization, kv_cache_dtype=kv, **GPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=0.05, atol=0.05)
    if kv.startswith("fp8"):
        # The first layer's K codes from the decode steps (slots 8-22: the prefill's are
        # one path's, the last key is never stored): its input is the same embedding in
        # both runs, so a code differs only where the kernel's qkv sums round to a
        # neighbouring bf16 near a code's edge. A key stored in the wrong place or rounded
        # in the wrong order differs in most.
        k_off, k_on = (c[0, 0, :2].flatten(0, 1)[8:23].view(torch.uint8) for c in caches)
        differ = (k_off != k_on).float().mean().item()
        assert differ < 0.05, differ


@pytest.mark.gpu
@pytest.mark.parametrize("kv,v_tile,v_last", [("auto", 0, 0), ("fp8_e4m3", 0, 0),
                                              ("fp8_e4m3", 64, 0), ("fp8_e4m3", 64, 1)])
def test_gpu_new_key_in_a_split_of_its_own(toy_models, monkeypatch, counted, kv, v_tile,
                                           v_last):
    """CONFIG["NEW_APART"] forced on (by default only where K's feedback runs on the register
    tile, head sizes past 64): the warm-up's launch over stand-ins (context 0) and the
    logits as the launch-per-op path's. v_tile 64: V's pages tiled, whose whole-tile reads
    must stay aligned though the new key's split starts anywhere (it once faulted); v_last:
    their last tiles' zeroing (decode_tiles.attend_tiles' V_LAST)."""
    from nanovllm.kernels import decode_config

    monkeypatch.setitem(layer_launch.CONFIG, "NEW_APART", 1)
    monkeypatch.setitem(decode_config.CONFIG_FP8, "V_TILE", v_tile)
    monkeypatch.setitem(decode_config.CONFIG_FP8, "V_LAST", v_last)
    monkeypatch.setitem(layer_launch.CONFIG, "V_LAST", v_last)
    block = dict(kvcache_block_size=64) if v_tile else {}
    runs = {on: _logits(toy_models["untied_gqa4_d64"], on, monkeypatch, counted,
                        kv_cache_dtype=kv, **dict(GPU, enforce_eager=False, **block))
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=0.05, atol=0.05)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [300, 600])
def test_gpu_splits_combined_by_o_proj(toy_models, monkeypatch, counted, tokens):
    """Longer contexts, so the device's 64-key splits are several: 5 (phase C combines them)
    and 10 (more than C_SPLITS: the last split of each kv head does): the logits as the
    launch-per-op path's."""
    engine = dict(GPU, max_model_len=1024, num_kvcache_blocks=80)
    runs = {on: _logits(toy_models["untied_gqa4_d64"], on, monkeypatch, counted,
                        tokens=(tokens, tokens - 12), **engine)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=0.05, atol=0.05)


@pytest.mark.gpu
@pytest.mark.parametrize("pre_kv,splits", [(0, 64), (1, 64), (2, 64), (1, 4)])
def test_gpu_old_keys_requested_before_the_wait(toy_models, monkeypatch, counted, pre_kv,
                                                splits):
    """PRE_KV 0-2 (the first tile read after the wait, before it into registers, into L2)
    at 5 one-tile splits, and with SPLITS 4 (two tiles a split: read after the wait)."""
    monkeypatch.setitem(layer_launch.CONFIG, "PRE_KV", pre_kv)
    monkeypatch.setitem(layer_launch.CONFIG, "SPLITS", splits)
    engine = dict(GPU, max_model_len=1024, num_kvcache_blocks=80)
    runs = {on: _logits(toy_models["untied_gqa4_d64"], on, monkeypatch, counted,
                        tokens=(300, 288), **engine)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=0.05, atol=0.05)


@pytest.mark.gpu
@pytest.mark.parametrize("a_chunk", [False, True])
def test_gpu_narrow_last_chunks_and_phase_a_chunks(tmp_path, monkeypatch, counted, a_chunk):
    """TAIL and A_CHUNK in the persistent launch (4 programs, so the CPU test's chunks: a
    32-column tail in D, and in A unless A_CHUNK), with CUDA graphs."""
    from nanovllm.utils.toy import save_random_qwen3

    path = save_random_qwen3(str(tmp_path / "m"), num_attention_heads=8, num_key_value_heads=2,
                             head_dim=16, hidden_size=96, intermediate_size=512,
                             num_hidden_layers=2)
    monkeypatch.setattr(layer_launch, "_programs", lambda device: 4)
    monkeypatch.setitem(layer_launch.CONFIG, "TAIL", 64)
    monkeypatch.setitem(layer_launch.CONFIG, "A_CHUNK", a_chunk)
    runs = {on: _logits(path, on, monkeypatch, counted, **dict(GPU, enforce_eager=False))
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=0.05, atol=0.05)


def test_large_layers_keep_the_launch_per_op_path():
    """Per-program tiles past MAX_TILE (the K loop is unrolled) are refused: Qwen3-8B and
    Llama-3.2-1B shapes on an H100's 132 SMs, while Qwen3-0.6B, SmolLM2-135M and
    Qwen2.5-0.5B fit."""
    assert not layer_launch.fits(4096, 32, 8, 128, 12288, programs=132)
    assert not layer_launch.fits(2048, 32, 8, 64, 8192, programs=132)
    for shape in ((1024, 16, 8, 128, 3072), (576, 9, 3, 64, 1536), (896, 14, 2, 64, 4864)):
        assert layer_launch.fits(*shape, programs=132)


def test_warm_launches_on_stand_ins(toy_models, monkeypatch):
    """one_launch.warm builds a launch of every layer on stand-in caches and step tensors
    (on a GPU only compiled, inside the start-up's compile-ahead pass; the interpreter runs
    it)."""
    monkeypatch.setenv("NANOVLLM_LAYER_KERNEL", "1")
    one_launch.layer_kernel_mode.cache_clear()
    llm = LLM(toy_models["tied_gqa4_d16_l4"], **CPU)
    try:
        runner = llm.clients[0].core.executor.runner
        calls = []
        real = layer_launch.decode_layers
        monkeypatch.setattr(layer_launch, "decode_layers",
                            lambda *a, **k: calls.append(k) or real(*a, **k))
        one_launch.warm(runner.model.model.layers, runner.dtype, runner.block_size)
        assert len(calls) == 1 and calls[0]["block_tables"].dtype == torch.int32
    finally:
        llm.shutdown()
        one_launch.layer_kernel_mode.cache_clear()


@pytest.mark.gpu
def test_start_up_compiles_the_kernel_once(toy_models, monkeypatch):
    """The start-up compiles the kernel in its first compile-ahead pass on stand-in tensors
    (one_launch.warm); the decode graphs' capture then finds that variant: one compile, not
    two."""
    from nanovllm.kernels.layer_kernel import _layers_kernel

    def compiled():
        return sum(len(cache[0]) for cache in _layers_kernel.device_caches.values())

    monkeypatch.delenv("NANOVLLM_LAYER_KERNEL", raising=False)
    one_launch.layer_kernel_mode.cache_clear()
    _layers_kernel.device_caches.clear()  # (variants of earlier tests: from the disk cache)
    llm = LLM(toy_models["tied_gqa4_d16_l4"], **dict(GPU, enforce_eager=False))
    try:
        assert llm.clients[0].core.executor.runner.model.model.one_launch
        assert compiled() == 1
    finally:
        llm.shutdown()
        one_launch.layer_kernel_mode.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("v_tile,v_last", [(0, 0), (64, 0), (64, 1), (64, 2)])
def test_gpu_fp8_v_tiles_widened_as_loaded(toy_models, monkeypatch, counted, v_tile, v_last):
    """An e4m3 cache's V in the layer kernel and the decode kernel, five splits: the logits
    as the launch-per-op path's. V_TILE 0: V_WORDS (the usual pages' V tiles read as words,
    widened where loaded); 64: V's pages tiled (kv_cache.tile_v_pages), blocks of 64."""
    from nanovllm.kernels import decode_config

    monkeypatch.setitem(layer_launch.CONFIG, "V_WORDS", True)
    monkeypatch.setitem(decode_config.CONFIG_FP8, "V_WORDS", True)
    monkeypatch.setitem(decode_config.CONFIG_FP8, "V_TILE", v_tile)
    monkeypatch.setitem(decode_config.CONFIG_FP8, "V_LAST", v_last)
    monkeypatch.setitem(layer_launch.CONFIG, "V_LAST", v_last)
    engine = dict(GPU, max_model_len=1024, num_kvcache_blocks=80, kv_cache_dtype="fp8_e4m3",
                  kvcache_block_size=64 if v_tile else 16)
    runs = {on: _logits(toy_models["untied_gqa4_d64"], on, monkeypatch, counted,
                        tokens=(300, 288), **engine)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=0.05, atol=0.05)


@pytest.mark.gpu
@pytest.mark.parametrize("ahead", [1, 2])
def test_gpu_feedback_tile_rows_asked_early(toy_models, monkeypatch, counted, ahead):
    """K's feedback on the register tile (forced at head 64, where chains run by default)
    with its rows asked for a block early (CONFIG["FB_AHEAD"]: into registers, into L1):
    the logits as the launch-per-op path's."""
    monkeypatch.setitem(layer_launch.CONFIG, "FB_CHAINS_MAX_HD", 0)
    monkeypatch.setitem(layer_launch.CONFIG, "FB_AHEAD", ahead)
    runs = {on: _logits(toy_models["untied_gqa4_d64"], on, monkeypatch, counted,
                        kv_cache_dtype="fp8_e4m3", **GPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=0.05, atol=0.05)
