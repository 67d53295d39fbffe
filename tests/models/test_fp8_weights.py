"""fp8 linear weights on the CPU: checkpoints in Qwen's block-wise and compressed-tensors
formats, and LLM(quantization="fp8") quantizing a float checkpoint at load.

Tolerance: an fp8 model and its dequantized float twin compute with the same fp32 weights
(fp8 value * fp32 scale, the same product in both), so their logits agree to float rounding
(1e-5); against the original float model they differ by fp8's rounding (3 mantissa bits,
~3% per weight), which the looser check bounds.
"""
import gc

import pytest
import torch

from nanovllm import LLM, SamplingParams
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.step_inputs import prefill_inputs
from nanovllm.utils.context import reset_context
from nanovllm.utils.toy import save_random_model
from tests.support.fp8_checkpoints import (FORMATS, STATIC_ACTIVATIONS, write_fp8,
                                          write_row_dequantized)

# Hidden 192 = one whole and one half 128-block: the qkv / gate_up inputs and the o / down
# outputs end in a partial block. Heads of 128 keep every shard of TP=2 on block boundaries.
SHAPE = dict(hidden_size=192, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
             intermediate_size=512, num_hidden_layers=2, vocab_size=512)
ARCHS = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
         "qwen3_moe": "Qwen3MoeForCausalLM"}
# Qwen3-MoE: 4 experts of 128 (one block), top 2; layer 1 dense (mlp_only_layers).
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, mlp_only_layers=[1])
ENGINE = dict(kvcache_block_size=16, num_kvcache_blocks=16, max_model_len=128)
TOKENS = [5, 17, 300, 42, 8, 99, 250, 3, 77, 180, 11, 460]


@pytest.fixture(scope="module")
def float_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8_float")
    return {a: save_random_model(str(root / a), arch, seed=40 + i,
                                 **SHAPE, **(MOE if a == "qwen3_moe" else {}))
            for i, (a, arch) in enumerate(ARCHS.items())}


@torch.inference_mode()
def prefill_logits(llm: LLM, tokens: list[int]) -> torch.Tensor:
    """fp32 logits at every position of one prefill, straight through the ModelRunner."""
    runner = llm.clients[0].core.executor.runner
    seq = Sequence(tokens, SamplingParams(), runner.block_size)
    seq.block_table = list(range(-(-len(tokens) // runner.block_size)))
    seq.num_scheduled_tokens = len(tokens)
    hidden = runner.forward(prefill_inputs([seq], runner.block_size, runner.max_blocks_per_seq))
    out = runner.model.compute_all_logits(hidden).float()
    reset_context()
    return out


def logits_of(path: str, **kw) -> tuple[torch.Tensor, torch.nn.Module]:
    with LLM(path, **ENGINE, **kw) as llm:
        return prefill_logits(llm, TOKENS), llm.clients[0].core.executor.runner.model


def check_fp8_layers(model: torch.nn.Module, scale_name: str) -> None:
    """Every decoder linear (and expert) holds e4m3 weights and fp32 scales; embeddings, the
    head and the MoE router do not."""
    layers = model.model.layers
    fp8 = {"self_attn.qkv_proj": "weight", "self_attn.o_proj": "weight"}
    if hasattr(layers[0].mlp, "experts"):  # Qwen3-MoE; its layer 1 is dense
        fp8 |= {"mlp.experts": "w13_weight", "mlp.gate": None}
        assert layers[1].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    else:
        fp8 |= {"mlp.gate_up_proj": "weight", "mlp.down_proj": "weight"}
    for name, weight in fp8.items():
        module = layers[0].get_submodule(name)
        if weight is None:  # the router
            assert module.weight.dtype == torch.float32
            continue
        assert getattr(module, weight).dtype == torch.float8_e4m3fn, name
        scale = weight.removesuffix("weight") + scale_name
        assert getattr(module, scale).dtype == torch.float32, name
    assert model.lm_head.weight.dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == torch.float32


# Every format on Qwen3; the other architectures in the block format (formats differ in the
# loader alone, architectures in the layers they build).
CASES = ([("qwen3", f) for f in FORMATS] + [(a, "block") for a in ARCHS if a != "qwen3"]
         + [("qwen3_moe", "ct_tensor_w8a16")])


@pytest.mark.parametrize("arch,fmt", CASES)
def test_fp8_checkpoint_matches_dequantized_twin(float_models, tmp_path, caplog, arch, fmt):
    path = write_fp8(float_models[arch], str(tmp_path / fmt), fmt)
    got, model = logits_of(path)
    check_fp8_layers(model, FORMATS[fmt][2])
    assert "ignoring" not in caplog.text  # every scale found its parameter
    if fmt in STATIC_ACTIVATIONS:
        assert model.model.layers[1].self_attn.qkv_proj.input_scale.item() == pytest.approx(0.02)
    want, _ = logits_of(path + "_ref")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    exact, _ = logits_of(float_models[arch])
    # These wide random toys amplify any weight change (fp8 rounding gives ~0.1 here); an
    # unrelated model would give ~1.4.
    assert (got - exact).norm() / exact.norm() < 0.25


def test_ignored_modules_stay_float(float_models, tmp_path):
    keep = "model.layers.1.mlp.down_proj"
    path = write_fp8(float_models["qwen3"], str(tmp_path / "ct"), "ct_channel_w8a8", (keep,))
    got, model = logits_of(path)
    assert model.get_submodule(keep).weight.dtype == torch.float32
    assert model.get_submodule(keep).quant_method is None
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    want, _ = logits_of(path + "_ref")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_quantization_fp8_at_load_matches_row_round_trip(float_models, tmp_path, arch):
    src = float_models[arch]
    got, model = logits_of(src, quantization="fp8")
    check_fp8_layers(model, "weight_scale")
    want, _ = logits_of(write_row_dequantized(src, str(tmp_path / "rows")))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# Block scales split with Qwen3's heads; channel scales with Qwen3-MoE's experts (64 of each
# expert's 128 rows per rank: half a block, so not the block format).
@pytest.mark.parametrize("arch,fmt", [("qwen3", "block"), ("qwen3_moe", "ct_channel_w8a8")])
def test_fp8_tp2_equals_tp1(float_models, tmp_path, arch, fmt):
    path = write_fp8(float_models[arch], str(tmp_path / fmt), fmt)
    prompts = [TOKENS, TOKENS[::-1][:7]]
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = {}
    for tp in (1, 2):
        with LLM(path, tensor_parallel_size=tp, **ENGINE) as llm:
            outs[tp] = [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)]
    assert outs[2] == outs[1]


def test_fp8_tensor_in_an_unquantized_parameter_is_refused(float_models, tmp_path):
    # A block checkpoint that also quantized the LM head: loading its e4m3 values into the
    # float head without their scales would give wrong logits silently.
    from safetensors.torch import load_file, save_file

    path = write_fp8(float_models["llama"], str(tmp_path / "block"), "block")
    file = f"{path}/model.safetensors"
    state = load_file(file)
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"].to(torch.float8_e4m3fn)
    save_file(state, file)
    with pytest.raises(ValueError, match="embed_tokens.weight.*float8_e4m3fn.*unquantized"):
        LLM(path, **ENGINE)


@pytest.mark.gpu
def test_gpu_fp8_weights_leave_more_kv_blocks(tmp_path):
    # The KV cache is sized from the memory left after loading: fp8 linear weights of the
    # Qwen3-0.6B shape (~0.44B parameters, 0.88 GB in bf16) leave ~0.44 GB more for it.
    from nanovllm.utils.toy import QWEN3_0_6B, save_config_only

    path = save_config_only(str(tmp_path / "q"), **dict(QWEN3_0_6B, torch_dtype="bfloat16"))
    # The budget is a share of the card minus all memory in use, and an engine of an earlier
    # test (a session fixture) may still hold some: give both engines the same 30% on top.
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    share = min(0.95, (total - free) / total + 0.3)
    blocks = {}
    for quantization in (None, "fp8"):
        with LLM(path, load_format="dummy", quantization=quantization, enforce_eager=True,
                 gpu_memory_utilization=share, max_num_seqs=8) as llm:
            blocks[quantization] = llm.clients[0].core.executor.runner.num_kvcache_blocks
        # The first engine's KV cache must be gone before the second measures free memory
        # (one run on an H100 gave the second 7 blocks against the first's 734).
        gc.collect()
        torch.cuda.empty_cache()
    # A 256-token block of 28 layers x 8 kv heads x 128 x 2 (K, V) x 2 bytes is 28 MiB.
    assert blocks["fp8"] - blocks[None] >= 0.4e9 // (28 * 2**20)
