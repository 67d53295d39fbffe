"""Drive the engine step by step (add_request / step / is_finished) with mixed sampling."""
import sys

from nanovllm import LLM, SamplingParams


def main(path: str):
    llm = LLM(path, enforce_eager=True)
    llm.add_request("Write a haiku about caches.", SamplingParams(temperature=0.8, top_p=0.95,
                                                                 seed=1, max_tokens=48))
    llm.add_request("Count to five:", SamplingParams(temperature=0, max_tokens=24, stop=["5"]))
    while not llm.is_finished():
        finished, num_tokens = llm.step()
        for seq in finished:
            print(seq.seq_id, seq.finish_reason, repr(llm.tokenizer.decode(seq.completion_token_ids)))
    llm.shutdown()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "~/huggingface/Qwen3-0.6B/")
