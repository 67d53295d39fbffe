"""fp8 checkpoints written from a float one the way each format specifies, with a float
"dequantized" twin holding exactly the weights the fp8 file stands for.

The quantizers here are written independently of nanovllm's (loops over blocks, plain
formulas), so a test compares nanovllm's reading of the format with the format itself.
"""
import glob
import json
import os
import re
import shutil

import torch
from safetensors.torch import load_file, save_file

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
LINEAR = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight$")


def _block(w: torch.Tensor, bn: int, bk: int):
    """(fp8 values, fp32 scales [ceil(r/bn), ceil(c/bk)], dequantized) block by block."""
    rows, cols = w.shape
    nr, nc = -(-rows // bn), -(-cols // bk)
    q, s, deq = torch.empty(rows, cols, dtype=FP8), torch.empty(nr, nc), torch.empty(rows, cols)
    for i in range(nr):
        for j in range(nc):
            tile = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].float()
            scale = tile.abs().max() / FP8_MAX
            qt = (tile / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = qt
            deq[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = qt.float() * scale
            s[i, j] = scale
    return q, s, deq


def _rows(w: torch.Tensor):
    """(fp8 values, fp32 scales [rows, 1], dequantized): one scale per output row."""
    s = w.float().abs().amax(dim=1, keepdim=True) / FP8_MAX
    q = (w.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, s, q.float() * s


def _tensor(w: torch.Tensor):
    """(fp8 values, fp32 scale [1], dequantized): one scale for the whole tensor."""
    s = w.float().abs().max() / FP8_MAX
    q = (w.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, s.reshape(1), q.float() * s


def _ct_config(strategy: str, activations: bool) -> dict:
    weights = dict(num_bits=8, type="float", symmetric=True, dynamic=False, strategy=strategy)
    if strategy == "block":
        weights["block_structure"] = [128, 128]
    acts = (dict(num_bits=8, type="float", symmetric=True, dynamic=True, strategy="token")
            if activations else None)
    return dict(quant_method="compressed-tensors", format="float-quantized",
                quantization_status="compressed", ignore=["lm_head"],
                config_groups={"group_0": dict(targets=["Linear"], weights=weights,
                                               input_activations=acts)})


# name -> (quantization_config, quantizer(weight) -> (values, scale, dequantized), scale name)
FORMATS = {
    "block": (dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
                   weight_block_size=[128, 128]), lambda w: _block(w, 128, 128),
              "weight_scale_inv"),
    "ct_channel_w8a8": (_ct_config("channel", True), _rows, "weight_scale"),
    "ct_tensor_w8a16": (_ct_config("tensor", False), _tensor, "weight_scale"),
    "ct_block_w8a8": (_ct_config("block", True), lambda w: _block(w, 128, 128), "weight_scale"),
    # AutoFP8: per-tensor weights, static per-tensor activation scales (`input_scale`)
    "fp8_tensor_static": (dict(quant_method="fp8", activation_scheme="static"), _tensor,
                          "weight_scale"),
}
# Formats whose checkpoints carry an activation scale beside each weight.
STATIC_ACTIVATIONS = {"fp8_tensor_static"}


def _copy_dir(src: str, dst: str) -> None:
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if not f.endswith(".safetensors"):
            shutil.copy(os.path.join(src, f), dst)


def write_fp8(src: str, dst: str, fmt: str, keep: tuple[str, ...] = ()) -> str:
    """`src` (a float checkpoint) as fp8 checkpoint `dst` in format `fmt` (FORMATS); the
    dequantized twin goes to `dst`_ref. `keep`: modules left in float, listed in the
    compressed-tensors config's `ignore`. Returns dst."""
    qcfg, quantize, scale_name = FORMATS[fmt]
    if keep:
        qcfg = dict(qcfg, ignore=qcfg["ignore"] + list(keep))
    (file,) = glob.glob(os.path.join(src, "*.safetensors"))
    tensors = load_file(file)
    fp8, ref = {}, {}
    for name, t in tensors.items():
        if LINEAR.search(name) and name.removesuffix(".weight") not in keep:
            q, s, deq = quantize(t)
            fp8[name], fp8[name.removesuffix("weight") + scale_name] = q, s
            if fmt in STATIC_ACTIVATIONS:  # any positive value: the CPU reference ignores it
                fp8[name.removesuffix("weight") + "input_scale"] = torch.tensor([0.02])
            ref[name] = deq.to(t.dtype)
        else:
            fp8[name] = ref[name] = t
    for path, state, extra in ((dst, fp8, qcfg), (dst + "_ref", ref, None)):
        _copy_dir(src, path)
        save_file(state, os.path.join(path, "model.safetensors"))
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
        if extra is not None:
            cfg["quantization_config"] = extra
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(cfg, f)
    return dst


def write_row_dequantized(src: str, dst: str) -> str:
    """`src` with every linear weight replaced by its per-row fp8 round trip: what
    LLM(quantization="fp8") should compute with."""
    (file,) = glob.glob(os.path.join(src, "*.safetensors"))
    tensors = load_file(file)
    out = {n: (_rows(t)[2].to(t.dtype) if LINEAR.search(n) else t) for n, t in tensors.items()}
    _copy_dir(src, dst)
    save_file(out, os.path.join(dst, "model.safetensors"))
    return dst
