"""Model names that are not local paths: Hugging Face hub ids, resolved through the hub cache.

`LLM("Qwen/Qwen3-0.6B")` finds the model in huggingface_hub's cache, downloading what is
missing unless HF_HUB_OFFLINE is set, as vLLM does. Only the files the engine reads are fetched
(config, tokenizer, safetensors weights), never a repository's other formats.
"""
import os
import re

# owner/name, as the hub spells repository ids.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# The files an engine start reads from a snapshot.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


def _offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, looked up now (its constants are read once,
    when it is first imported)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "")
    return constants.HF_HUB_OFFLINE or value.upper() in ("1", "ON", "YES", "TRUE")


def resolve_model_path(name: str, what: str = "model") -> str:
    """A local path for `name`: itself when it exists, else the hub snapshot of that id."""
    path = os.path.expanduser(name)
    if os.path.exists(path):
        return path
    if not HUB_ID.match(name) or name.startswith((".", "~")):
        raise ValueError(f"{what}={name!r} is neither a local path nor a Hugging Face hub id: "
                         "give a model directory, a .gguf file or an id such as 'Qwen/Qwen3-0.6B'")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    offline = _offline()
    try:
        return snapshot_download(name, allow_patterns=ALLOW_PATTERNS, local_files_only=offline)
    except HFValidationError as e:
        raise ValueError(f"{what}={name!r} is not a valid Hugging Face hub id ({e})") from None
    except Exception as e:  # not found, gated, no network, not in the cache: all say the same
        where = ("is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
                 if offline else "could not be fetched from the Hugging Face hub")
        raise ValueError(f"{what}={name!r} {where} ({type(e).__name__}: {e}); download it "
                         "first (huggingface-cli download <id>) or give a local path") from None
