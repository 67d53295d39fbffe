"""The user-facing facade."""
from nanovllm.engine.llm_engine import LLMEngine


class LLM(LLMEngine):
    """`LLM(path, **config).generate(prompts, sampling_params)`, as in vLLM / nano-vLLM."""
