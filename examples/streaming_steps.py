"""Drive the engine step by step (add_request / step / is_finished) with mixed sampling.

    python examples/streaming_steps.py [MODEL]   # no model here: the demo model
"""
import sys

from nanovllm import LLM, SamplingParams
from nanovllm.utils.toy import model_or_demo


def main(path: str | None):
    """Add two requests and print each step's new text as the engine produces it."""
    llm = LLM(model_or_demo(path), enforce_eager=True)
    names = {
        llm.add_request("Write a haiku about caches.",
                        SamplingParams(temperature=0.8, top_p=0.95, seed=1,
                                       max_tokens=48)): "haiku",
        llm.add_request("Count to five:", SamplingParams(temperature=0, max_tokens=24, stop=["5"])):
            "count",
    }
    while not llm.is_finished():
        finished, num_tokens = llm.step()
        for out in finished:  # the RequestOutputs generate() returns (dict access works)
            print(names[out["request_id"]], out["finish_reason"], repr(out["text"]))
    llm.shutdown()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
