"""nanovllm: a compact, fast, tested LLM inference engine (nano-vLLM design)."""
from nanovllm.outputs import CompletionOutput, Logprob, RequestOutput
from nanovllm.sampling_params import SamplingParams
from nanovllm.structured.params import StructuredOutputsParams

__all__ = ["LLM", "AsyncLLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob",
           "StructuredOutputsParams"]


def __getattr__(name):
    # LLM pulls in torch; import it lazily so the torch-free control plane stays torch-free.
    if name == "LLM":
        from nanovllm.llm import LLM

        return LLM
    if name == "AsyncLLM":
        from nanovllm.async_llm import AsyncLLM

        return AsyncLLM
    raise AttributeError(name)
