import pytest

from nanovllm.config import Config, ModelConfig
from nanovllm.utils.toy import config_dict, qwen3_config_dict
from tests.support.checkpoints import write_config_dir


def test_defaults_and_clamp(tmp_path):
    cfg = Config(write_config_dir(tmp_path / "m", max_position_embeddings=1024))
    assert cfg.max_num_batched_tokens == 16384 and cfg.max_num_seqs == 512
    assert cfg.kvcache_block_size == 256 and cfg.num_kvcache_blocks == -1
    assert cfg.enable_prefix_caching and cfg.load_format == "auto" and cfg.device is None
    # max_model_len (4096) is clamped to the model's max_position_embeddings (1024).
    assert cfg.max_model_len == 1024


def test_rope_theta_in_rope_parameters(tmp_path):
    d = qwen3_config_dict()
    d.pop("rope_theta")
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 123456.0}
    assert ModelConfig.from_dict(d).rope_theta == 123456.0


def test_heads_not_a_multiple_of_kv_heads(tmp_path):
    d = qwen3_config_dict(num_attention_heads=6, num_key_value_heads=4)
    with pytest.raises(ValueError, match="not a multiple of num_key_value_heads"):
        ModelConfig.from_dict(d)


@pytest.mark.parametrize("kw, field", [
    (dict(kvcache_block_size=24), "kvcache_block_size"),
    (dict(kvcache_block_size=8), "kvcache_block_size"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(tensor_parallel_size=9), "tensor_parallel_size"),
    (dict(data_parallel_size=0), "data_parallel_size"),
    (dict(data_parallel_size="2"), "data_parallel_size"),
    (dict(distributed_executor_backend="mpi"), "distributed_executor_backend"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(dtype="int8"), "dtype"),
    (dict(load_format="pt"), "load_format"),
    (dict(num_kvcache_blocks=0), "num_kvcache_blocks"),
])
def test_bad_values(tmp_path, kw, field):
    with pytest.raises(ValueError, match=field):
        Config(write_config_dir(tmp_path / "m"), **kw)


def test_unknown_kwarg_and_missing_dir(tmp_path):
    with pytest.raises(ValueError, match="unknown argument"):
        Config.from_kwargs(write_config_dir(tmp_path / "m"), max_num_seq=3)
    with pytest.raises(ValueError, match="neither a local path nor a Hugging Face hub id"):
        Config(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        Config(str(tmp_path / "empty"))


def test_unsupported_architecture(tmp_path):
    # The message lists what is supported.
    with pytest.raises(ValueError, match="unsupported architecture.*Qwen2ForCausalLM, "
                                         "LlamaForCausalLM, Qwen3MoeForCausalLM"):
        Config(write_config_dir(tmp_path / "m", architectures=["MistralForCausalLM"]))


LLAMA3 = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=8192)


def test_rope_scaling_in_both_transformers_layouts():
    # 4.x: rope_theta at top level, the scaling in rope_scaling (older files say "type").
    v4 = config_dict("LlamaForCausalLM", rope_theta=5e5, rope_scaling=LLAMA3)
    # 5.x: both inside rope_parameters.
    v5 = config_dict("LlamaForCausalLM", rope_theta=None,
                     rope_parameters=dict(LLAMA3, rope_theta=5e5))
    a, b = ModelConfig.from_dict(v4), ModelConfig.from_dict(v5)
    assert a.rope_theta == b.rope_theta == 5e5
    assert a.rope_scaling == b.rope_scaling == dict(LLAMA3)
    old = config_dict("LlamaForCausalLM", rope_scaling=dict(type="linear", factor=2.0))
    assert ModelConfig.from_dict(old).rope_scaling == dict(rope_type="linear", factor=2.0)
    plain = config_dict("LlamaForCausalLM", rope_scaling=None)
    assert ModelConfig.from_dict(plain).rope_scaling is None


@pytest.mark.parametrize("rope, match", [
    (dict(rope_type="yarn", factor=4.0), "rope type 'yarn' is not supported; nanovllm "
                                         "implements default, linear, llama3"),
    (dict(rope_type="llama3", factor=8.0), "needs low_freq_factor, high_freq_factor, "
                                           "original_max_position_embeddings"),
    (dict(LLAMA3, low_freq_factor=4.0), "low_freq_factor < high_freq_factor"),
    (dict(rope_type="linear", factor=-2.0), "factor=-2.0 must be a number > 0"),
    (dict(rope_type="default", partial_rotary_factor=0.5), "partial_rotary_factor"),
])
def test_bad_rope_scaling(rope, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_dict(config_dict("LlamaForCausalLM", rope_scaling=rope))


def test_moe_fields_and_sparse_layers():
    d = config_dict("Qwen3MoeForCausalLM", num_hidden_layers=6, decoder_sparse_step=2,
                    mlp_only_layers=[3], num_experts=None, num_local_experts=16)
    cfg = ModelConfig.from_dict(d)  # num_local_experts: how transformers 5.x writes it
    assert cfg.num_experts == 16 and cfg.num_experts_per_tok == 2 and cfg.norm_topk_prob
    assert [cfg.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    assert not any(ModelConfig.from_dict(config_dict()).is_moe_layer(i) for i in range(2))


@pytest.mark.parametrize("overrides, match", [
    (dict(num_experts=None), "lacks required mixture-of-experts field\\(s\\) num_experts"),
    (dict(moe_intermediate_size=None), "moe_intermediate_size"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok=9 must be at most num_experts=8"),
    (dict(mlp_only_layers=[-1]), "mlp_only_layers"),
    (dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    (dict(use_sliding_window=True), "use_sliding_window"),
])
def test_bad_moe_and_model_fields(overrides, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_dict(config_dict("Qwen3MoeForCausalLM", **overrides))


def test_tensor_parallel_must_divide_expert_intermediate(tmp_path):
    path = write_config_dir(tmp_path / "m", architectures=["Qwen3MoeForCausalLM"],
                            moe_intermediate_size=33, num_experts=4, num_experts_per_tok=1)
    with pytest.raises(ValueError, match="moe_intermediate_size=33 is not divisible by "
                                         "tensor_parallel_size=2"):
        Config(path, tensor_parallel_size=2)
