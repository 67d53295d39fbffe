"""Which quantized method each linear layer gets: the model builder asks here, from the
config, so layers never decide policy."""
from nanovllm.model_config import ModelConfig


def linear_method(cfg: ModelConfig | None, prefix: str, modules: list[str]):
    """The quantized method of the layer at `prefix` packing checkpoint `modules` (e.g. q_proj,
    k_proj, v_proj), or None for plain weights. Packed modules must agree."""
    scheme = None if cfg is None else cfg.quantization
    if scheme is None:
        return None
    flags = {scheme.quantizes(f"{prefix}.{m}") for m in modules}
    if len(flags) > 1:
        raise ValueError(f"quantization_config ignores some of {modules} under {prefix} but "
                         "not all: nanovllm packs them into one matmul, so all or none must be "
                         "fp8")
    if not flags.pop():
        return None
    from nanovllm.layers.quant.fp8 import Fp8LinearMethod

    return Fp8LinearMethod(scheme, prefix)


def moe_method(cfg: ModelConfig, prefix: str):
    """The quantized method of the FusedMoE layer at `prefix` (model.layers.<i>.mlp), or None.
    Its experts are packed into two tensors, so all must be fp8 or none."""
    scheme = cfg.quantization
    if scheme is None:
        return None
    flags = {scheme.quantizes(f"{prefix}.experts.{e}.{m}") for e in range(cfg.num_experts)
             for m in ("gate_proj", "up_proj", "down_proj")}
    if len(flags) > 1:
        raise ValueError(f"quantization_config ignores some experts of {prefix} but not all: "
                         "nanovllm packs them into two tensors, so all or none must be fp8")
    if not flags.pop():
        return None
    from nanovllm.layers.quant.fp8_moe import Fp8MoEMethod

    return Fp8MoEMethod(scheme, f"{prefix}.experts")
