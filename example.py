"""Chat with a Qwen3 model, nano-vLLM style.

Uses ~/huggingface/Qwen3-0.6B (or $NANOVLLM_MODEL) when present. On a machine without a
downloaded model it builds a tiny random-weight Qwen3 with a byte-level tokenizer instead,
so this script runs anywhere; that demo model writes gibberish, by design.
"""
import logging
import os
import tempfile

from nanovllm import LLM, SamplingParams


def model_path() -> str:
    path = os.path.expanduser(os.environ.get("NANOVLLM_MODEL", "~/huggingface/Qwen3-0.6B/"))
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    from nanovllm.utils.toy import save_random_qwen3

    demo = os.path.join(tempfile.gettempdir(), "nanovllm-demo-qwen3")
    if not os.path.isfile(os.path.join(demo, "config.json")):
        save_random_qwen3(demo, vocab_size=512, hidden_size=128, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32, num_hidden_layers=2)
    print(f"No Qwen3 checkpoint at {path}: using a tiny RANDOM-WEIGHT demo model at {demo} "
          "(its replies are gibberish). Set NANOVLLM_MODEL to a real Qwen3 directory.")
    return demo


def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = model_path()
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
