"""A model's generation_config.json: its default sampling values and extra end tokens.

As in vLLM (`generation_config="auto"`), the values the model's authors recommend become the
defaults of requests that give no SamplingParams, and the file's eos_token_id(s) join the end
tokens; `generation_config="none"` ignores the file, a directory path reads that directory's.
"""
import json
import os
from dataclasses import dataclass, field

# generation_config.json field -> SamplingParams field.
SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                   "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                   "max_new_tokens": "max_tokens"}


@dataclass(frozen=True)
class GenerationDefaults:
    """What generation_config.json contributes: SamplingParams keyword arguments and end ids."""

    sampling: dict = field(default_factory=dict)
    eos_token_ids: tuple[int, ...] = ()


def load_generation_defaults(setting: str, model_dir: str) -> GenerationDefaults:
    """The defaults `setting` names: "auto" (model_dir's file, if any), "none", or a directory."""
    if not isinstance(setting, str):
        raise ValueError(f"generation_config={setting!r} must be 'auto', 'none' or a directory "
                         "holding a generation_config.json")
    if setting == "none":
        return GenerationDefaults()
    folder = model_dir if setting == "auto" else os.path.expanduser(setting)
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        if setting != "auto":
            raise ValueError(f"generation_config={setting!r}: {path} does not exist; give 'auto' "
                             "(the model's), 'none' or a directory with a generation_config.json")
        return GenerationDefaults()
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a valid JSON file ({e}); fix it or pass "
                         "generation_config='none'") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path} must hold a JSON object; fix it or pass "
                         "generation_config='none'")
    sampling = {ours: d[theirs] for theirs, ours in SAMPLING_FIELDS.items()
                if d.get(theirs) is not None}
    from nanovllm.sampling_params import SamplingParams

    try:
        SamplingParams(**sampling)  # the file's values must make valid params
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}; fix the file or pass generation_config='none'") from None
    eos = d.get("eos_token_id")
    eos = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in eos):
        raise ValueError(f"{path}: eos_token_id={d.get('eos_token_id')!r} must be a token id "
                         "or a list of them; fix the file or pass generation_config='none'")
    return GenerationDefaults(sampling, tuple(eos))
