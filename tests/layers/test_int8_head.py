"""The opt-in int8 LM head copy (layers/quant/int8_head.py): block quantization, the skinny GEMM
and the GEMV reading int8 codes (interpreter on CPU, the real shapes on a GPU), and the model
build."""
import pytest
import torch
import torch.nn.functional as F

from nanovllm.config import Config
from nanovllm.kernels import gemv
from nanovllm.kernels.skinny_gemm import gemm
from nanovllm.layers.quant import int8_head
from nanovllm.models.loader import build_model
from nanovllm.utils.model_shapes import SHAPES, linear_shapes
from tests.support.gemm import check

TINY = dict(BLOCK_N=16, BLOCK_K=16, num_warps=1, num_stages=1)


def _reference(x, codes, scales, block):
    return F.linear(x.float(), int8_head.dequantize(codes, scales, block, torch.float32))


def test_blocks_map_their_largest_magnitude_to_127():
    w = torch.randn(37, 96, generator=torch.Generator().manual_seed(0))
    w[3] = 0  # an all-zero row: scale 0, codes 0
    codes, scales, block = int8_head.quantize(w)
    assert (codes.dtype, scales.shape, block) == (torch.int8, (37, 3), 32)
    blocks = codes.view(37, 3, 32).int()
    assert (blocks.abs().amax(-1)[torch.arange(37) != 3] == 127).all()
    assert not codes[3].any() and not scales[3].any()
    err = (int8_head.dequantize(codes, scales, block, torch.float32) - w).view(37, 3, 32)
    assert (err.abs() <= scales[..., None] / 2 + 1e-7).all()
    assert [int8_head.block_for(k) for k in (4096, 576, 96, 48)] == [128, 64, 32, 16]
    # Sliced quantization (8192 rows at a time) equals one pass.
    big = torch.randn(8200, 32, generator=torch.Generator().manual_seed(1))
    codes2, scales2, _ = int8_head.quantize(big)
    ref = (big.view(8200, 1, 32) / (big.view(8200, 1, 32).abs().amax(-1, keepdim=True) / 127))
    assert torch.equal(codes2, ref.round().clamp(-127, 127).to(torch.int8).view(8200, 32))
    assert torch.allclose(scales2[:, 0], big.abs().amax(-1) / 127)


@pytest.mark.parametrize("xdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,split", [(1, 40, 96, 1), (5, 33, 128, 2), (16, 50, 64, 1)])
def test_the_skinny_gemm_reads_int8_codes(xdtype, m, n, k, split):
    g = torch.Generator().manual_seed(m)
    codes, scales, block = int8_head.quantize(torch.randn(n, k, generator=g))
    x = torch.randn(m, k, generator=g).to(xdtype)
    y = gemm(x, codes, None, scales, (1, block), config=dict(TINY, SPLIT_K=split))
    check(y, _reference(x, codes, scales, block), xdtype)
    if xdtype == torch.float32:  # the layer's CPU path (a bf16 one rounds the weight first)
        check(int8_head.matmul(x, codes, scales, block), _reference(x, codes, scales, block),
              xdtype)


@pytest.mark.parametrize("m,n,k", [(1, 40, 96), (2, 33, 80), (2, 24, 48)])
def test_the_gemv_reads_int8_codes(m, n, k):
    """Each row's column blocks scale its own GROUP-summed products (blocks of 32 / 16)."""
    g = torch.Generator().manual_seed(n)
    codes, scales, block = int8_head.quantize(torch.randn(n, k, generator=g))
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    y = gemv.gemv(x, codes, scales, (1, block))
    check(y, _reference(x, codes, scales, block), torch.bfloat16)


def test_matmul_takes_the_gemv_up_to_its_rows(monkeypatch):
    calls = []
    real = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # the GPU branch
    codes, scales, block = int8_head.quantize(torch.randn(40, 64))
    assert gemv.INT8_HEAD_MAX_M == 1  # one row: two lost in the engine
    monkeypatch.setattr(gemv, "INT8_HEAD_MAX_M", 2)
    for m, taken in ((1, True), (2, True), (3, False)):
        x = torch.randn(m, 64).to(torch.bfloat16)
        calls.clear()
        y = int8_head.matmul(x, codes, scales, block)
        assert bool(calls) == taken
        check(y, _reference(x, codes, scales, block), torch.bfloat16)


@pytest.mark.parametrize("name,tied", [("untied_gqa4_d64", False), ("tied_mha_d16", True)])
def test_the_build_keeps_an_int8_copy(toy_models, name, tied):
    model = build_model(Config.from_kwargs(toy_models[name], device="cpu",
                                           lm_head_quantization="int8"),
                        torch.float32, torch.device("cpu"))
    head, embed = model.lm_head, model.model.embed_tokens
    assert head.int8 is not None and (head.weight is embed.weight) == tied
    # Few rows read the copy; more rows the checkpoint's head, which stays.
    x = torch.randn(3, head.int8[0].shape[1])
    torch.testing.assert_close(head.project(x), _reference(x, *head.int8)[:, :head.num_embeddings])
    x = torch.randn(17, head.int8[0].shape[1])
    torch.testing.assert_close(head.project(x), F.linear(x, head.weight)[:, :head.num_embeddings])
    plain = build_model(Config.from_kwargs(toy_models[name], device="cpu"), torch.float32,
                        torch.device("cpu"))
    assert plain.lm_head.int8 is None


def test_an_engine_generates_with_the_int8_head(toy_models):
    from nanovllm import LLM, SamplingParams

    llm = LLM(toy_models["untied_gqa4_d64"], kvcache_block_size=16, max_model_len=128,
              enforce_eager=True, lm_head_quantization="int8")
    try:
        out = llm.generate(["The quick brown fox"], SamplingParams(max_tokens=4, ignore_eos=True),
                           use_tqdm=False)
        assert len(out[0]["token_ids"]) == 4
        assert llm.clients[0].core.executor.runner.model.lm_head.int8 is not None
    finally:
        llm.shutdown()


def test_tp2_equals_tp1_with_the_int8_head(toy_models):
    """Vocabulary shards quantize their own rows: the same codes and scales as one rank's."""
    from nanovllm import LLM, SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = {}
    for tp in (1, 2):
        with LLM(toy_models["untied_gqa4_d64"], tensor_parallel_size=tp, kvcache_block_size=16,
                 max_model_len=128, enforce_eager=True, lm_head_quantization="int8") as llm:
            outs[tp] = [o["token_ids"] for o in llm.generate(
                [[5, 17, 30, 42, 8], [9, 3]], sp, use_tqdm=False)]
    assert outs[2] == outs[1]


def test_bad_settings_name_the_field(toy_models):
    with pytest.raises(ValueError, match="lm_head_quantization='fp8' must be one of"):
        Config.from_kwargs(toy_models["untied_gqa4_d64"], lm_head_quantization="fp8")


# Every LM head of a supported model, bf16 x, M = 1..16 with the table's configs.
GPU_HEADS = sorted({linear_shapes(name)["lm_head"] for name in SHAPES
                    if "lm_head" in linear_shapes(name)})


@pytest.mark.gpu
@pytest.mark.parametrize("nk", GPU_HEADS)
def test_gpu_lm_head_shapes(nk):
    n, k = nk
    codes, scales, block = int8_head.quantize(torch.randn(n, k, device="cuda"))
    for m in (1, 2, 3, 8, 16):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        check(int8_head.matmul(x, codes, scales, block), _reference(x, codes, scales, block),
              torch.bfloat16)
        if m <= 2:
            check(gemv.gemv(x, codes, scales, (1, block)), _reference(x, codes, scales, block),
                  torch.bfloat16)
