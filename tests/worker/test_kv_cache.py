"""kv_cache_dtype on the CPU (torch reference path): options, scales, backends, accuracy."""
import glob
import random

import pytest
import torch
from safetensors.torch import save_file

from nanovllm import LLM, SamplingParams
from nanovllm.config import Config
from nanovllm.kernels.kv_feedback import identity_feedback
from nanovllm.layers import attention_backend
from nanovllm.worker import model_runner
from nanovllm.layers.attention import KV_SCALE_MARGIN, calibrate_kv_scales
from tests.support.markers import on_gpu
from tools.fp8_accuracy import context_logits, logprob_errors, text_ids

CPU = dict(device="cpu", num_kvcache_blocks=16, kvcache_block_size=64, max_model_len=1024,
           enforce_eager=True)


def test_bad_kv_cache_dtype_is_a_value_error(toy_models):
    with pytest.raises(ValueError, match="kv_cache_dtype='int4' must be one of"):
        Config(toy_models["tied_gqa4_d16_l4"], kv_cache_dtype="int4")


def test_flash_refuses_fp8_and_auto_falls_back(monkeypatch):
    monkeypatch.setattr(attention_backend, "flash_attn_available", lambda: True)
    monkeypatch.setattr(attention_backend, "TritonBackend", lambda: "triton")
    with pytest.raises(ValueError, match="cannot read an fp8 KV cache"):
        attention_backend.choose_backend("flash", torch.device("cuda"), 256, quantized_kv=True)
    assert attention_backend.choose_backend("auto", torch.device("cuda"), 256, True) == "triton"


def test_calibration_maps_margin_times_amax_to_fp8_max():
    k = torch.randn(10, 3, 8)
    v = torch.randn(10, 3, 8) * torch.tensor([1.0, 10.0, 0.0])[None, :, None]
    ks, vs = torch.ones(3), torch.ones(3)
    calibrate_kv_scales(k, v, ks, vs, 448.0)
    assert torch.allclose(ks * 448 / KV_SCALE_MARGIN, k.abs().amax(dim=(0, 2)))
    assert torch.allclose(vs[:2] * 448 / KV_SCALE_MARGIN, v.abs().amax(dim=(0, 2))[:2])
    assert vs[2] == 1.0  # an all-zero head keeps a usable scale


def test_fp8_cache_is_calibrated_on_the_first_prefill_and_stays_close(toy_models):
    path = toy_models["untied_gqa4_d64"]
    rng = random.Random(0)
    ctx = [rng.randrange(400) for _ in range(300)]
    logits, scales = {}, None
    for kind in ("auto", "fp8_e4m3"):
        llm = LLM(path, kv_cache_dtype=kind, **CPU)
        runner = llm.clients[0].core.executor.runner
        if kind != "auto":
            assert runner.kv_cache.dtype == torch.float8_e4m3fn
            assert (runner.kv_scales == 1).all()  # nothing calibrated before a prefill
        llm.generate([ctx[:50]], SamplingParams(max_tokens=2), use_tqdm=False)
        if kind != "auto":
            scales = runner.kv_scales.clone()
            assert (scales != 1).all() and (scales > 0).all()
        logits[kind] = context_logits(llm, ctx, 150)
        if kind != "auto":
            assert torch.equal(runner.kv_scales, scales)  # only the first prefill calibrates
        llm.shutdown()
    ref, got = logits["auto"], logits["fp8_e4m3"]
    rel = (got - ref).norm(dim=-1) / ref.norm(dim=-1)
    # e4m3 keeps 4 significant bits: a few % on these random-weight logits (bf16 KV: ~0.4%).
    assert rel.mean() < 0.1
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.75


def test_int8_cache_keeps_a_scale_per_row_and_stays_close(toy_models):
    path = toy_models["untied_gqa4_d64"]  # 3 layers, 2 kv heads, head_dim 64
    rng = random.Random(0)
    ctx = [rng.randrange(400) for _ in range(300)]
    logits = {}
    for kind in ("auto", "int8"):
        llm = LLM(path, kv_cache_dtype=kind, **CPU)
        runner = llm.clients[0].core.executor.runner
        logits[kind] = context_logits(llm, ctx, 150)
        if kind == "int8":
            assert runner.kv_cache.dtype == torch.int8
            assert runner.kv_scales.dtype == torch.float32
            for layer in runner.attn_layers:
                # Indexed [block, slot, kv head], like the cache without its head dim.
                assert layer.k_scale.shape == layer.v_scale.shape == layer.k_cache.shape[:3]
                for scale in (layer.k_scale, layer.v_scale):
                    # Blocks 0.. hold the context (context_logits): every row set its own.
                    written = scale.flatten(0, 1)[:len(ctx) - 1]
                    assert (written != 1).all() and (written > 0).all()
            assert runner.attn_layers[0].backend.mix_kv
        llm.shutdown()
    ref, got = logits["auto"], logits["int8"]
    rel = (got - ref).norm(dim=-1) / ref.norm(dim=-1)
    # ~7 significant bits per element: several times closer than e4m3's 0.1 bound above.
    assert rel.mean() < 0.02
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.95


def test_int8_blocks_count_their_scales(toy_models):
    from nanovllm.worker.kv_cache import kv_bytes_per_block

    llm = LLM(toy_models["untied_gqa4_d64"], kv_cache_dtype="int8", **CPU)
    layers = llm.clients[0].core.executor.runner.attn_layers
    # Per token, layer and kv head: K and V, 64 one-byte codes and a 4-byte scale each.
    assert kv_bytes_per_block(layers, 64, torch.int8) == 64 * 3 * 2 * 2 * (64 + 4)
    assert kv_bytes_per_block(layers, 64, torch.float8_e4m3fn) == 64 * 3 * 2 * 2 * 64
    llm.shutdown()


def _with_scales(src, dst, layers, value):
    """A copy of checkpoint `src` with k_scale/v_scale tensors for the given layers."""
    import shutil

    shutil.copytree(src, dst)
    tensors = {}
    for i in layers:
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(value)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor([value * 2] * 2)
    save_file(tensors, f"{dst}/kv_scales.safetensors")
    return dst


def test_checkpoint_scales_are_used_not_calibrated(toy_models, tmp_path, caplog):
    src = toy_models["untied_gqa4_d64"]  # 3 layers, 2 kv heads
    path = _with_scales(src, str(tmp_path / "m"), range(3), 0.05)
    llm = LLM(path, kv_cache_dtype="fp8_e4m3", **CPU)
    llm.generate([[1, 2, 3] * 10], SamplingParams(max_tokens=2), use_tqdm=False)
    scales = llm.clients[0].core.executor.runner.kv_scales
    assert torch.allclose(scales[0], torch.full((3, 2), 0.05))
    assert torch.allclose(scales[1], torch.full((3, 2), 0.1))
    llm.shutdown()
    with caplog.at_level("WARNING"):  # the model dtype cache ignores them, quietly
        LLM(path, **CPU).shutdown()
    assert "k_scale" not in caplog.text


def test_checkpoint_with_some_layers_scales_is_refused(toy_models, tmp_path):
    path = _with_scales(toy_models["untied_gqa4_d64"], str(tmp_path / "m"), [0, 1], 0.05)
    assert glob.glob(f"{path}/kv_scales.safetensors")
    with pytest.raises(ValueError, match="not all 3"):
        LLM(path, kv_cache_dtype="fp8", **CPU)


@pytest.fixture
def one_thread():
    """torch on one thread: a decode step is ~30 small ops per layer, which two threads on a
    shared machine slowed ten-fold (spinning), not sped up."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SMOL_PREFILL = 80  # of the real text's first 128 tokens; 47 decode steps follow


def smol_logits(path: str, kind: str) -> tuple[torch.Tensor, list[int]]:
    """Teacher-forced logits of the real text's first 128 tokens through SmolLM2 (its GGUF,
    loaded natively in fp32) with a `kind` cache, and the tokens."""
    llm = LLM(path, kv_cache_dtype=kind, dtype="float32", **dict(CPU, max_model_len=192))
    ids = text_ids(llm.tokenizer)[:128]
    # The fp32 cache's reference: the same logits in one prefill (equal to 1e-5 to its 47
    # decode steps, which cost 3 s more: every step reads the 0.5 GB of weights).
    # An fp8 prefill calibrates the scales.
    logits = context_logits(llm, ids, len(ids) - 1 if kind == "auto" else SMOL_PREFILL)
    llm.shutdown()
    return logits, ids


@pytest.fixture(scope="module")
def smol_reference(smollm2_path):
    """The fp32 cache's logits of the real text (computed once for the module's tests)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see one_thread
    try:
        return smol_logits(smollm2_path, "auto")
    finally:
        torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("kind,decode_mean,decode_max", [("fp8_e4m3", 0.08, 0.5),
                                                          ("int8", 0.02, 0.15)])
def test_8bit_logprobs_on_smollm2_real_weights(smollm2_path, smol_reference, kind,
                                               decode_mean, decode_max):
    # Teacher-forced real text through a real model: 80 tokens prefilled, 47 decode steps.
    ref, ids = smol_reference
    got, _ = smol_logits(smollm2_path, kind)
    err = logprob_errors(ref, got, ids, SMOL_PREFILL)
    # The prefill attends to its own K/V unquantized: as exact as the fp32 cache (reading
    # them back from the e4m3 cache gave 0.068 nats mean, 0.63 max on the 336-token text).
    assert err["prefill_max"] < 1e-3
    # Decode reads every earlier token's K/V in 8 bits. e4m3 (3 mantissa bits): 0.060 mean,
    # 0.25 max here with Hadamard-mixed q/k (0.059 / 0.21 without); 0.055 / 0.31 on the
    # whole 336-token text. int8 with a scale per token and kv head (~7 bits for every
    # element of a mixed row): 0.0096 / 0.040 here, 0.011 / 0.074 on the whole text, 0.014 /
    # 0.16 on 400 tokens of CPython's LICENSE (e4m3 there: 0.069 / 0.49).
    assert err["decode_mean"] < decode_mean and err["decode_max"] < decode_max


@pytest.mark.parametrize("kind", ["auto", "fp8_e4m3", "int8"])
def test_warm_up_compiles_fp8_prefill_over_cached_tokens(toy_models, kind):
    from nanovllm.worker.warmup import warm_prefills

    llm = LLM(toy_models["untied_gqa4_d64"], kv_cache_dtype=kind, **CPU)
    runner = llm.clients[0].core.executor.runner
    seen = []
    forward = runner.forward
    runner.forward = lambda inputs, *rest: (seen.append(inputs.has_cached_context)
                                            or forward(inputs, *rest))
    warm_prefills(runner)  # the GPU's kernel warm-up, run here on the torch path
    # Both prefill variants of an 8-bit cache (own K/V exact; cached K/V read back) run.
    assert sorted(set(seen)) == ([False] if kind == "auto" else [False, True])
    llm.shutdown()


@pytest.fixture(scope="module")
def smol_gpu_reference(smollm2_path):
    """Our fp32 model with an fp32 cache on the GPU: teacher-forced logits of the whole
    English text (first half prefilled) and its tokens."""
    llm, ids = _smol_gpu(smollm2_path, "float32", "auto")
    try:
        return context_logits(llm, ids, len(ids) // 2), ids
    finally:
        llm.shutdown()


def _smol_gpu(path: str, dtype: str, kind: str):
    llm = LLM(path, dtype=dtype, kv_cache_dtype=kind, device="cuda", enforce_eager=True,
              kvcache_block_size=256, max_model_len=512, num_kvcache_blocks=4)
    return llm, text_ids(llm.tokenizer)


@on_gpu
@pytest.mark.parametrize("dtype,prefill_mean,decode_mean", [("float32", 1e-3, 0.035),
                                                            ("bfloat16", 0.05, 0.05)])
def test_int8_logprobs_on_smollm2_gpu(smollm2_path, smol_gpu_reference, dtype, prefill_mean,
                                      decode_mean):
    # Issue 27's target on the GPU kernels: mean |delta logprob| <= 0.05 nats in prefill and
    # decode, max <= 0.5, against fp32 with an fp32 cache (the CPU gives int8 0.010 / 0.066
    # in decode, fp32; a bf16 model alone is ~0.03).
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ref, ids = smol_gpu_reference
    llm, _ = _smol_gpu(smollm2_path, dtype, "int8")
    try:
        got = context_logits(llm, ids, len(ids) // 2)
    finally:
        llm.shutdown()
    err = logprob_errors(ref.cpu(), got.cpu(), ids, len(ids) // 2)
    assert err["prefill_mean"] < prefill_mean and err["prefill_max"] < 0.5
    assert err["decode_mean"] < decode_mean and err["decode_max"] < 0.5


def test_blocks_count_the_memory_weights_leave(monkeypatch):
    """On a GPU the KV cache gets what is free after loading (and the warm-up's activation
    peak): weights half the size (fp8 instead of bf16) leave their saved bytes to KV blocks."""
    from types import SimpleNamespace

    from nanovllm.worker.kv_cache import count_blocks

    gib, block = 2 ** 30, 28 * 2 ** 20
    cfg = SimpleNamespace(num_kvcache_blocks=-1, gpu_memory_utilization=0.9)
    blocks = {}
    for name, weights in (("bf16", 0.88 * gib), ("fp8", 0.44 * gib)):
        used = int(weights) + gib  # + the CUDA context and the caching allocator's pool
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d, u=used: (80 * gib - u, 80 * gib))
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda d: {
            "allocated_bytes.all.peak": 3 * gib, "allocated_bytes.all.current": 2 * gib})
        blocks[name] = count_blocks(cfg, block, torch.device("cuda"), 64)
    assert blocks["fp8"] - blocks["bf16"] in (int(0.44 * gib) // block,
                                              int(0.44 * gib) // block + 1)


def test_fp8_feedback_calibrates_its_factor_and_stays_close(toy_models, monkeypatch):
    """NANOVLLM_KV_FEEDBACK=1: each layer's factor is the identity (plain rounding) until the
    first prefill fits it to its queries; later prefills refit it until FIT_TOKENS prompt
    tokens were seen, then it stays; K is rounded through it, and the logits stay as close
    to the plain cache's as plain fp8's are."""
    monkeypatch.setenv("NANOVLLM_KV_FEEDBACK", "1")
    monkeypatch.setattr(model_runner, "FIT_TOKENS", 80)
    path = toy_models["untied_gqa4_d64"]
    rng = random.Random(0)
    ctx = [rng.randrange(400) for _ in range(300)]
    llm = LLM(path, kv_cache_dtype="fp8_e4m3", **CPU)
    runner = llm.clients[0].core.executor.runner
    factors = [layer.k_feedback for layer in runner.attn_layers]
    eye = identity_feedback(2, 64)
    assert all(torch.equal(f, eye) for f in factors)
    llm.generate([ctx[:50]], SamplingParams(max_tokens=2), use_tqdm=False)
    first = [f.clone() for f in factors]
    assert all(not torch.equal(f, eye) for f in first)
    # Within each group: upper triangular with a unit diagonal.
    blocks = [f.view(2, 2, 32, 32) for f in first]
    assert all(torch.equal(b.triu(), b) for b in blocks)
    assert all(torch.equal(b.diagonal(dim1=-2, dim2=-1), torch.ones(2, 2, 32)) for b in blocks)
    llm.generate([ctx[100:140]], SamplingParams(max_tokens=2), use_tqdm=False)  # 50 + 40
    calibrated = [f.clone() for f in factors]
    assert all(not torch.equal(f, c) for f, c in zip(first, calibrated))  # refitted
    got = context_logits(llm, ctx, 150)
    assert all(torch.equal(f, c) for f, c in zip(factors, calibrated))  # fitted: it stays
    llm.shutdown()
    monkeypatch.delenv("NANOVLLM_KV_FEEDBACK")
    llm = LLM(path, **CPU)
    ref = context_logits(llm, ctx, 150)
    llm.shutdown()
    rel = (got - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert rel.mean() < 0.1
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.75
