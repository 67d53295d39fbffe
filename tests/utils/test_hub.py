"""Hub ids resolved through huggingface_hub's cache (offline, as laid out by the test), and
generation_config.json's defaults."""
import json
import shutil

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.config import Config

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty huggingface_hub cache, offline; returns a function putting a model in it."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def put(repo_id: str, src: str) -> str:
        """Lay out `src` as repo_id's main snapshot, the way huggingface_hub stores it."""
        repo = cache / f"models--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(COMMIT)
        snapshot = repo / "snapshots" / COMMIT
        shutil.copytree(src, snapshot)
        return str(snapshot)

    return put


def test_a_hub_id_loads_from_the_cache_offline(toy_models, hub_cache):
    snapshot = hub_cache("acme/tiny-qwen3", toy_models["tied_mha_d16"])
    llm = LLM("acme/tiny-qwen3", kvcache_block_size=16, num_kvcache_blocks=16)
    assert llm.config.model == snapshot
    ref = LLM(toy_models["tied_mha_d16"], kvcache_block_size=16, num_kvcache_blocks=16)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    assert llm.generate("Hello", sp, use_tqdm=False)[0]["token_ids"] == ref.generate(
        "Hello", sp, use_tqdm=False)[0]["token_ids"]


def test_a_tokenizer_hub_id_resolves_too(toy_models, hub_cache, tmp_path):
    hub_cache("acme/tok", toy_models["tied_mha_d16"])
    config = Config(toy_models["tied_mha_d16"], tokenizer="acme/tok")
    assert config.tokenizer.endswith(COMMIT)


def test_hub_errors_are_value_errors_naming_the_id(hub_cache, toy_models):
    with pytest.raises(ValueError, match="'acme/absent' is not in the local Hugging Face cache "
                                         "and HF_HUB_OFFLINE is set"):
        LLM("acme/absent")
    with pytest.raises(ValueError, match="neither a local path nor a Hugging Face hub id"):
        LLM("not/a/hub/id")
    with pytest.raises(ValueError, match="tokenizer='acme/no-tok' is not in the local"):
        Config(toy_models["tied_mha_d16"], tokenizer="acme/no-tok")


def write_generation_config(path, **fields) -> None:
    with open(f"{path}/generation_config.json", "w") as f:
        json.dump(fields, f)


def test_generation_config_supplies_defaults_unless_given(toy_models, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(toy_models["tied_mha_d16"], d)
    write_generation_config(d, temperature=0.0, top_k=20, top_p=0.8, repetition_penalty=1.05,
                            eos_token_id=[7, 9], do_sample=True)
    llm = LLM(str(d), kvcache_block_size=16, num_kvcache_blocks=16)
    sp = llm.get_default_sampling_params()
    assert (sp.temperature, sp.top_k, sp.top_p, sp.repetition_penalty) == (0.0, 20, 0.8, 1.05)
    assert {7, 9} <= llm.clients[0].core.scheduler.eos_ids
    # No sampling_params: the file's (greedy here) values; the run equals the explicit one.
    given = SamplingParams(temperature=0.0, top_k=20, top_p=0.8, repetition_penalty=1.05)
    prompt = [[11, 12, 13, 14]]
    assert llm.generate(prompt, use_tqdm=False)[0]["token_ids"] == llm.generate(
        prompt, given, use_tqdm=False)[0]["token_ids"]
    off = LLM(str(d), kvcache_block_size=16, num_kvcache_blocks=16, generation_config="none")
    assert off.get_default_sampling_params().temperature == SamplingParams().temperature
    assert not {7, 9} & off.clients[0].core.scheduler.eos_ids


def test_bad_generation_configs_are_value_errors(toy_models, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(toy_models["tied_mha_d16"], d)
    write_generation_config(d, temperature=-1)
    with pytest.raises(ValueError, match="generation_config.json.*temperature"):
        Config(str(d))
    assert Config(str(d), generation_config="none").generation_defaults.sampling == {}
    (d / "generation_config.json").write_text("{oops")
    with pytest.raises(ValueError, match="not a valid JSON file"):
        Config(str(d))
    with pytest.raises(ValueError, match="generation_config='/nowhere'"):
        Config(toy_models["tied_mha_d16"], generation_config="/nowhere")
