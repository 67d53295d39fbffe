"""Generate with the model split over two ranks (two GPUs, or two CPU processes with gloo);
three for a model whose heads two ranks cannot share (the SmolLM2 demo: 9 heads, 3 KV heads).

    python examples/tensor_parallel.py [MODEL]   # no model here: the demo model

Workers are spawned processes, so the entry point must sit under `if __name__ == "__main__":`.
"""
import sys

from nanovllm import LLM, SamplingParams
from nanovllm.config import Config
from nanovllm.utils.toy import model_or_demo


def ranks_for(path: str) -> int:
    """2, or 3 where 2 does not divide the heads and the MLP evenly."""
    hf = Config(path).hf_config
    sizes = (hf.num_attention_heads, hf.num_key_value_heads, hf.intermediate_size)
    return 2 if all(s % 2 == 0 for s in sizes) else 3


def main(path: str | None):
    """Generate greedily with the model split across the ranks it fits."""
    path = model_or_demo(path)
    with LLM(path, tensor_parallel_size=ranks_for(path)) as llm:
        outputs = llm.generate(["The capital of France is", "1, 2, 3,"],
                               SamplingParams(temperature=0, max_tokens=32))
    for out in outputs:
        print(repr(out["text"]), out["finish_reason"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
