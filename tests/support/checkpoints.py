"""Model directories for tests that need a config.json but no weights."""
import json
import pathlib

from nanovllm.utils.toy import qwen3_config_dict


def write_config_dir(path: pathlib.Path, **overrides) -> str:
    """A directory holding only config.json: the tiny toy Qwen3 config with `overrides`."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(qwen3_config_dict(**overrides)))
    return str(path)
