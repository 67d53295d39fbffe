"""Chat with a Qwen3 model, nano-vLLM style.

Uses ~/huggingface/Qwen3-0.6B (or $NANOVLLM_MODEL) when present. On a machine without a
downloaded model it builds a tiny random-weight Qwen3 with a byte-level tokenizer instead,
so this script runs anywhere; that demo model writes gibberish, by design.
"""
import logging
import sys

from nanovllm import LLM, SamplingParams
from nanovllm.utils.toy import model_or_demo


def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = model_or_demo(sys.argv[1] if len(sys.argv) > 1 else None)
    llm = LLM(path, enforce_eager=True, tensor_parallel_size=1)
    sampling_params = SamplingParams(temperature=0.6, max_tokens=256)
    prompts = ["introduce yourself", "list all prime numbers within 100"]
    prompts = [
        llm.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True)
        for p in prompts
    ]
    outputs = llm.generate(prompts, sampling_params)
    for prompt, output in zip(prompts, outputs):
        print(f"\nPrompt: {prompt!r}\nCompletion: {output['text']!r}")
    llm.shutdown()


if __name__ == "__main__":
    main()
