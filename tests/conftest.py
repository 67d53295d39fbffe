"""Shared fixtures. Triton runs in interpreter mode when no GPU is present."""
import os

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # the control-plane tests need no torch
    _HAS_CUDA = False
if not _HAS_CUDA:
    # Must be set before any @triton.jit kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not _HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def toy_models(tmp_path_factory):
    """Random-weight Qwen3 checkpoints of several shapes, written by transformers."""
    from nanovllm.utils.toy import save_random_qwen3

    root = tmp_path_factory.mktemp("models")
    shapes = {
        # tied embeddings, GQA ratio 1, head_dim 16, 2 layers
        "tied_mha_d16": dict(num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                             hidden_size=64, num_hidden_layers=2),
        # untied lm_head, GQA ratio 4, head_dim 64, 3 layers
        "untied_gqa4_d64": dict(num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                hidden_size=128, num_hidden_layers=3, tie_word_embeddings=False),
        # tied, GQA ratio 4, head_dim 16, 4 layers, bigger vocab than the tokenizer
        "tied_gqa4_d16_l4": dict(num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                                 hidden_size=96, num_hidden_layers=4, vocab_size=640),
    }
    return {name: save_random_qwen3(str(root / name), seed=i, **kw)
            for i, (name, kw) in enumerate(shapes.items())}
