"""Model registry: Hugging Face architecture name -> the module that implements it.

Torch-free on purpose: model_config.py checks config.json against these names in processes
that never build a model (the front end, clients); the class is imported when one is built.
"""
import importlib

# Architecture (config.json's "architectures") -> module of nanovllm.models defining a class
# of that name.
ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}


def model_class(architecture: str) -> type:
    """The model class of a supported architecture (model_config refused the others)."""
    module = importlib.import_module(f"nanovllm.models.{ARCHITECTURES[architecture]}")
    return getattr(module, architecture)
