import pytest

from nanovllm.config import Config, ModelConfig
from nanovllm.utils.toy import qwen3_config_dict
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
    with pytest.raises(ValueError, match="not a directory"):
        Config(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        Config(str(tmp_path / "empty"))


def test_unsupported_architecture(tmp_path):
    with pytest.raises(ValueError, match="unsupported architecture"):
        Config(write_config_dir(tmp_path / "m", architectures=["LlamaForCausalLM"]))
