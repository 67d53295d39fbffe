"""fp8 quantization configs: what is refused (ValueError naming the field and what is
supported) and how a layer's shards must line up with the scale blocks."""
import pytest

from nanovllm.config import Config
from nanovllm.layers import linear
from nanovllm.quant_config import parse_quantization_config
from nanovllm.utils.toy import qwen3_config_dict
from tests.support.checkpoints import write_config_dir

BLOCK = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
             weight_block_size=[128, 128])


def ct(weights=None, acts=None, **top) -> dict:
    w = dict(num_bits=8, type="float", symmetric=True, dynamic=False, strategy="channel")
    w.update(weights or {})
    return dict(dict(quant_method="compressed-tensors", format="float-quantized",
                     config_groups={"g": dict(targets=["Linear"], weights=w,
                                              input_activations=acts)}), **top)


def test_supported_configs_parse():
    s = parse_quantization_config(BLOCK)
    assert (s.strategy, s.block_size, s.scale_name) == ("block", (128, 128), "weight_scale_inv")
    s = parse_quantization_config(ct(ignore=["lm_head", "re:.*mlp\\.gate$"]))
    assert (s.strategy, s.scale_name, s.activations) == ("channel", "weight_scale", "none")
    assert not s.quantizes("lm_head") and not s.quantizes("model.layers.3.mlp.gate")
    assert s.quantizes("model.layers.3.mlp.gate_proj")
    s = parse_quantization_config(ct({"strategy": "tensor"}, dict(num_bits=8, type="float",
                                                                  dynamic=False)))
    assert (s.strategy, s.activations) == ("tensor", "static")
    per_group = ct()
    del per_group["format"]
    per_group["config_groups"]["g"]["format"] = "float-quantized"
    assert parse_quantization_config(per_group).strategy == "channel"
    s = parse_quantization_config(dict(quant_method="fp8", activation_scheme="static"))
    assert (s.strategy, s.scale_name) == ("tensor", "weight_scale")


@pytest.mark.parametrize("q,field", [
    (dict(quant_method="awq"), "quant_method='awq'"),
    ("fp8", "quantization_config='fp8'"),
    (dict(BLOCK, fmt="e5m2"), "fmt='e5m2'"),
    (dict(BLOCK, weight_block_size=[128]), "weight_block_size=[128]"),
    (dict(BLOCK, activation_scheme="static"), "activation_scheme='static'"),
    (dict(BLOCK, ignored_layers="lm_head"), "ignored_layers='lm_head'"),
    (ct(format="pack-quantized"), "format='pack-quantized'"),
    (ct({"num_bits": 4, "type": "int"}), "num_bits=4"),
    (ct({"strategy": "group"}), "strategy='group'"),
    (ct({"strategy": "block"}), "block_structure=None"),
    (ct(acts=dict(num_bits=8, type="int")), "input_activations"),
    (dict(ct(), config_groups={}), "config_groups"),
])
def test_bad_configs_name_the_field(q, field):
    with pytest.raises(ValueError) as e:
        parse_quantization_config(q, source="cfg.json")
    assert field in str(e.value) and "cfg.json" in str(e.value)


def test_llm_quantization_argument(tmp_path):
    path = write_config_dir(tmp_path / "m")
    assert Config(path, load_format="dummy").hf_config.quantization is None
    assert Config(path, load_format="dummy", quantization="fp8").hf_config.quantization.at_load
    with pytest.raises(ValueError, match="quantization='int8' must be None"):
        Config(path, load_format="dummy", quantization="int8")
    # A checkpoint's own config is used without asking.
    fp8 = write_config_dir(tmp_path / "fp8", quantization_config=BLOCK)
    assert Config(fp8, load_format="dummy").hf_config.quantization.strategy == "block"
    with pytest.raises(ValueError, match="quant_method='gptq' is not supported"):
        Config(write_config_dir(tmp_path / "g", quantization_config=dict(quant_method="gptq")))


def test_moe_experts_split_off_block_boundaries_are_refused_up_front(tmp_path):
    d = qwen3_config_dict(architectures=["Qwen3MoeForCausalLM"], num_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=128, head_dim=128,
                          quantization_config=BLOCK)
    path = write_config_dir(tmp_path / "moe", **{k: v for k, v in d.items()
                                                  if k != "model_type"})
    assert Config(path, load_format="dummy").hf_config.quantization.block_size == (128, 128)
    with pytest.raises(ValueError, match="moe_intermediate_size=128 split over "
                                         "tensor_parallel_size=2 gives 64"):
        Config(path, load_format="dummy", tensor_parallel_size=2)


@pytest.mark.parametrize("rank", [0, 1])
def test_block_shards_off_block_boundaries_are_refused(monkeypatch, rank):
    from nanovllm.layers.quant.fp8 import Fp8LinearMethod

    scheme = parse_quantization_config(BLOCK)
    monkeypatch.setattr(linear, "tp_size", lambda: 2)
    monkeypatch.setattr(linear, "tp_rank", lambda: rank)
    # 2 kv heads of 64 split over 2 ranks: k's slice is 64 rows, half a block.
    with pytest.raises(ValueError, match=r"layers.0.self_attn \(k\).*128-wide block"):
        linear.QKVParallelLinear(256, 64, 4, 2,
                                 quant_method=Fp8LinearMethod(scheme, "layers.0.self_attn"))
    # o_proj's input (256 = 2 x 128) splits on a block boundary; 320 would not.
    linear.RowParallelLinear(256, 192, quant_method=Fp8LinearMethod(scheme, "o"))
    with pytest.raises(ValueError, match="along dim 1"):
        linear.RowParallelLinear(320, 192, quant_method=Fp8LinearMethod(scheme, "o"))


def test_packed_parts_off_block_boundaries_name_the_model_not_tp(monkeypatch):
    # SmolLM2's shape at TP = 1: q is 9 heads x 64 = 576 rows, so k starts mid-block in the
    # packed qkv; no tensor_parallel_size helps, so the error must not suggest one.
    from nanovllm.layers.quant.fp8 import Fp8LinearMethod

    scheme = parse_quantization_config(BLOCK)
    monkeypatch.setattr(linear, "tp_size", lambda: 1)
    monkeypatch.setattr(linear, "tp_rank", lambda: 0)
    with pytest.raises(ValueError, match=r"self_attn \(k\): .*starts at row 576.*"
                                         r"quantization='fp8'") as e:
        linear.QKVParallelLinear(576, 64, 9, 3,
                                 quant_method=Fp8LinearMethod(scheme, "layers.0.self_attn"))
    assert "tensor_parallel_size" not in str(e.value)


def test_tp_split_off_block_boundaries_is_refused_up_front(tmp_path):
    # k/v: 2 heads x 64 = 128 rows, 64 per rank at TP=2: half a 128 block.
    path = write_config_dir(tmp_path / "m", quantization_config=BLOCK, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=64, hidden_size=256,
                            intermediate_size=512)
    with pytest.raises(ValueError, match="num_key_value_heads x head_dim=128 split over "
                                         "tensor_parallel_size=2"):
        Config(path, load_format="dummy", tensor_parallel_size=2)
    assert Config(path, load_format="dummy").hf_config.quantization.block_size == (128, 128)
