"""Small builders shared by the control-plane tests."""
import json
from types import SimpleNamespace

QWEN3_TINY = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
    "max_position_embeddings": 1024, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def write_model_dir(path, **overrides):
    """A directory holding just a Qwen3 config.json."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**QWEN3_TINY, **overrides}))
    return str(path)


def sched_config(**kw):
    """The fields the Scheduler reads, without a model directory."""
    base = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256, eos=-1,
                num_kvcache_blocks=32, kvcache_block_size=16, enable_prefix_caching=True)
    base.update(kw)
    return SimpleNamespace(**base)
