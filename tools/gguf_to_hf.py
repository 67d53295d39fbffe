"""Dequantize a GGUF checkpoint into a Hugging Face safetensors directory our engine loads.

transformers reads the GGUF (dequantizing every tensor to fp32) and its tokenizer; we write
model.safetensors, config.json (with the `architectures` entry GGUF configs lack) and the
tokenizer files. transformers refuses save_pretrained on a GGUF-loaded model, hence the
manual save. Needs the `gguf` package.

    PYTHONPATH=. python tools/gguf_to_hf.py path/to/model.gguf /tmp/model-hf
"""
import argparse
import json
import os

# Model types transformers' GGUF reader maps, and the architecture our loader expects.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def gguf_to_hf(gguf_path: str, out_dir: str) -> str:
    """Write the fp32 dequantized checkpoint at gguf_path into out_dir; returns out_dir."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    os.makedirs(out_dir, exist_ok=True)
    tied = model.config.tie_word_embeddings
    # Tied heads share storage with the embedding, which safetensors will not save twice.
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()
               if not (tied and k == "lm_head.weight")}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(out_dir)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [ARCHITECTURES.get(config["model_type"], config["model_type"])]
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return out_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("out_dir")
    args = ap.parse_args()
    print(gguf_to_hf(args.gguf, args.out_dir))


if __name__ == "__main__":
    main()
