"""Generate with the model split over two ranks (two GPUs, or two CPU processes with gloo).

    python examples/tensor_parallel.py [MODEL_DIR]   # no model here: a tiny demo model

Workers are spawned processes, so the entry point must sit under `if __name__ == "__main__":`.
"""
import sys

from nanovllm import LLM, SamplingParams
from nanovllm.utils.toy import model_or_demo


def main(path: str | None):
    with LLM(model_or_demo(path), tensor_parallel_size=2) as llm:
        outputs = llm.generate(["The capital of France is", "1, 2, 3,"],
                               SamplingParams(temperature=0, max_tokens=32))
    for out in outputs:
        print(repr(out["text"]), out["finish_reason"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
