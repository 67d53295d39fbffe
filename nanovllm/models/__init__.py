"""Model registry: HF architecture name -> our implementation."""
from nanovllm.models.qwen3 import Qwen3ForCausalLM

MODELS = {"Qwen3ForCausalLM": Qwen3ForCausalLM}
