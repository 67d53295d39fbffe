"""Model directories for tests that need a config.json but no weights."""
import json
import os
import pathlib

from nanovllm.utils.toy import qwen3_config_dict


def write_config_dir(path: pathlib.Path, **overrides) -> str:
    """A directory holding only config.json: the tiny toy Qwen3 config with `overrides`."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(qwen3_config_dict(**overrides)))
    return str(path)


def broken_tokenizer_copy(model: str, path: pathlib.Path) -> str:
    """`model`'s files linked into `path`, but with a tokenizer.json that is not JSON: a start
    whose tokenizer fails to load after the engine's processes began building the model."""
    path.mkdir(parents=True)
    for name in os.listdir(model):
        if name != "tokenizer.json":
            os.symlink(os.path.join(model, name), path / name)
    (path / "tokenizer.json").write_text("{not json")
    return str(path)
