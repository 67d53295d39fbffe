"""Damaged model directories fail early with a ValueError naming the file and the problem.

Each test copies a toy checkpoint, damages one thing (config.json or model.safetensors) and
opens it through the public `LLM(...)` and through the loader functions the engine uses.
"""
import json
import logging
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from nanovllm import LLM
from nanovllm.config import ModelConfig
from nanovllm.models import model_class
from nanovllm.models.loader import check_checkpoint, load_model
from tests.support.scripts import tp_workers

# hidden 96, 8 query / 2 KV heads of 16, intermediate 128, vocab 640, 4 layers, tied head.
BASE = "tied_gqa4_d16_l4"
ENGINE = dict(device="cpu", kvcache_block_size=16, num_kvcache_blocks=16, max_model_len=256,
              max_num_batched_tokens=256)


@pytest.fixture
def model_dir(toy_models, tmp_path) -> str:
    """A private copy of the toy checkpoint, free to damage."""
    return str(shutil.copytree(toy_models[BASE], tmp_path / "m"))


def config_file(path: str) -> str:
    return os.path.join(path, "config.json")


def weights_file(path: str) -> str:
    return os.path.join(path, "model.safetensors")


def edit_config(path: str, **changes) -> None:
    """Set config.json fields; a value of None deletes the field."""
    with open(config_file(path)) as f:
        d = json.load(f)
    d.update(changes)
    with open(config_file(path), "w") as f:
        json.dump({k: v for k, v in d.items() if v is not None}, f)


def edit_weights(path: str, edit) -> None:
    """Rewrite model.safetensors after `edit(tensors)` changed the name -> tensor dict."""
    tensors = load_file(weights_file(path))
    edit(tensors)
    save_file(tensors, weights_file(path), metadata={"format": "pt"})


# -- the three ways a checkpoint is opened -----------------------------------------------------
def open_llm(path: str) -> None:
    LLM(path, **ENGINE).shutdown()


def open_load_model(path: str) -> None:
    hf = ModelConfig.from_pretrained(path)
    load_model(model_class(hf.architecture)(hf), path)


def open_check(path: str) -> None:
    check_checkpoint(path, ModelConfig.from_pretrained(path))


ENTRY_POINTS = pytest.mark.parametrize("open_model", [open_llm, open_load_model, open_check],
                                       ids=["LLM", "load_model", "check_checkpoint"])


# -- config.json -------------------------------------------------------------------------------
def test_config_not_json(model_dir):
    with open(config_file(model_dir), "w") as f:
        f.write('{\n  "hidden_size": 96,\n  "vocab_size": 640\n  "num_hidden_layers": 4\n}\n')
    # The missing comma is noticed where the next field starts: line 4, column 3.
    want = f"{re.escape(config_file(model_dir))} is not valid JSON: .* at line 4, column 3"
    with pytest.raises(ValueError, match=want):
        LLM(model_dir, **ENGINE)
    with pytest.raises(ValueError, match=want):
        ModelConfig.from_pretrained(model_dir)


@pytest.mark.parametrize("missing", [
    ["hidden_size"], ["intermediate_size"], ["num_hidden_layers"], ["num_attention_heads"],
    ["vocab_size"], ["hidden_size", "vocab_size"],
])
def test_config_missing_required_fields(model_dir, missing):
    edit_config(model_dir, **dict.fromkeys(missing))
    want = (f"{re.escape(config_file(model_dir))} lacks required field\\(s\\) "
            f"{', '.join(missing)}$")
    with pytest.raises(ValueError, match=want):
        LLM(model_dir, **ENGINE)


def test_config_is_a_json_list(model_dir):
    with open(config_file(model_dir)) as f:
        d = json.load(f)
    with open(config_file(model_dir), "w") as f:
        json.dump([d], f)
    want = f"{re.escape(config_file(model_dir))} must hold a JSON object .*, not a JSON list"
    with pytest.raises(ValueError, match=want):
        LLM(model_dir, **ENGINE)


@pytest.mark.parametrize("field, value, kind", [
    ("hidden_size", "96", "an integer >= 1"),
    ("num_key_value_heads", 2.5, "an integer >= 1"),
    ("num_hidden_layers", 0, "an integer >= 1"),
    ("vocab_size", True, "an integer >= 1"),
    ("rms_norm_eps", "1e-6", "a number > 0"),
    ("rope_theta", -1.0, "a number > 0"),
    ("tie_word_embeddings", "yes", "true or false"),
    ("eos_token_id", "</s>", "a token id >= 0"),
])
def test_config_wrong_type(model_dir, field, value, kind):
    edit_config(model_dir, **{field: value})
    want = f"{re.escape(config_file(model_dir))}: {field}={re.escape(repr(value))} must be {kind}"
    with pytest.raises(ValueError, match=want):
        LLM(model_dir, **ENGINE)


def test_config_rope_theta_from_rope_parameters(model_dir):
    # transformers 5.x writes rope_theta inside rope_parameters.
    edit_config(model_dir, rope_theta=None,
                rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    assert ModelConfig.from_pretrained(model_dir).rope_theta == 5e5


# -- model.safetensors -------------------------------------------------------------------------
@ENTRY_POINTS
@pytest.mark.parametrize("keep", [
    pytest.param(lambda n: n - 100, id="data-cut"),
    pytest.param(lambda n: 20, id="header-cut"),
    pytest.param(lambda n: 0, id="empty"),
])
def test_truncated_safetensors(model_dir, open_model, keep):
    file = weights_file(model_dir)
    with open(file, "rb") as f:
        data = f.read()
    with open(file, "wb") as f:
        f.write(data[: keep(len(data))])
    with pytest.raises(ValueError, match=f"{re.escape(file)} is truncated"):
        open_model(model_dir)


@ENTRY_POINTS
def test_config_disagrees_with_weights(model_dir, open_model):
    # The checkpoint's MLP is 128 wide; a config.json claiming 256 used to fail in narrow()
    # ("start (0) + length (256) exceeds dimension size (128)") with no tensor or file named.
    edit_config(model_dir, intermediate_size=256)
    want = (rf"tensor 'model\.layers\.\d\.mlp\.\w+_proj\.weight' in "
            rf"{re.escape(weights_file(model_dir))} has shape \[\d+, \d+\], config\.json implies")
    with pytest.raises(ValueError, match=want):
        open_model(model_dir)


@ENTRY_POINTS
@pytest.mark.parametrize("name, shape, implied", [
    # A packed shard (k of qkv_proj) too narrow.
    ("model.layers.1.self_attn.k_proj.weight", (16, 96), (32, 96)),
    # A row-parallel weight transposed.
    ("model.layers.2.mlp.down_proj.weight", (128, 96), (96, 128)),
    # Broadcastable: copy_ would have filled the whole norm with this one value.
    ("model.norm.weight", (1,), (96,)),
    # A smaller vocabulary: the embedding loader would have zero-padded it silently.
    ("model.embed_tokens.weight", (600, 96), (640, 96)),
])
def test_tensor_shape_disagrees_with_config(model_dir, open_model, name, shape, implied):
    edit_weights(model_dir, lambda t: t.update({name: torch.zeros(shape)}))
    want = (f"tensor '{name}' in {weights_file(model_dir)} has shape {list(shape)}, "
            f"config.json implies {list(implied)}")
    with pytest.raises(ValueError, match=re.escape(want) + "$"):
        open_model(model_dir)


def test_shape_mismatch_under_tensor_parallelism(model_dir):
    # Was a gloo "connection reset" from rank 0 after rank 1 died in narrow(). Every rank now
    # checks the full, unsharded shape, so rank 0 raises the same ValueError as TP=1. Once
    # the engine calls check_checkpoint before spawning workers, this fails before any spawn.
    edit_config(model_dir, intermediate_size=256)
    want = f"in {re.escape(weights_file(model_dir))} has shape .*, config.json implies"
    with pytest.raises(ValueError, match=want):
        LLM(model_dir, tensor_parallel_size=2, **ENGINE)
    assert tp_workers() == []


@ENTRY_POINTS
def test_missing_tensors_are_listed(model_dir, open_model):
    drop = ["model.layers.1.self_attn.k_proj.weight", "model.norm.weight"]
    edit_weights(model_dir, lambda t: [t.pop(n) for n in drop])
    want = f"the checkpoint in {model_dir} lacks 2 tensor(s) the model needs: {', '.join(drop)}"
    with pytest.raises(ValueError, match=re.escape(want) + "$"):
        open_model(model_dir)


def test_untied_head_is_required(toy_models, tmp_path):
    path = str(shutil.copytree(toy_models["untied_gqa4_d64"], tmp_path / "m"))
    edit_weights(path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=r"lacks 1 tensor\(s\) the model needs: lm_head\.weight$"):
        open_check(path)


@ENTRY_POINTS
def test_unused_tensors_warn_but_load(model_dir, open_model, caplog):
    # The tied head needs no lm_head.weight; the checkpoint really omits it.
    assert "lm_head.weight" not in load_file(weights_file(model_dir))
    extra = "model.layers.0.mlp.extra_proj.weight"
    edit_weights(model_dir, lambda t: t.update({
        extra: torch.zeros(4, 4),
        # Old checkpoints carry RoPE's inverse frequencies; recomputed, so not worth a warning.
        "model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8),
    }))
    with caplog.at_level(logging.WARNING, logger="nanovllm.models.loader"):
        open_model(model_dir)
    warnings = [r.getMessage() for r in caplog.records if r.name == "nanovllm.models.loader"]
    assert len(warnings) == 1
    assert f"{extra} (model.safetensors)" in warnings[0] and "inv_freq" not in warnings[0]
    assert "ignoring 1 checkpoint tensor(s)" in warnings[0]


def test_weights_still_load_exactly(model_dir):
    # The checks must not change what a good checkpoint loads to.
    hf = ModelConfig.from_pretrained(model_dir)
    model = model_class(hf.architecture)(hf)
    load_model(model, model_dir)
    tensors = load_file(weights_file(model_dir))
    qkv = model.model.layers[1].self_attn.qkv_proj.weight
    q, k, v = (tensors[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
    assert torch.equal(qkv, torch.cat([q, k, v]))
    assert torch.equal(model.model.norm.weight, tensors["model.norm.weight"])
    assert model.lm_head.weight is model.model.embed_tokens.weight


# -- packed experts (Qwen3-MoE) ----------------------------------------------------------------
@ENTRY_POINTS
def test_moe_checkpoint_missing_or_misshapen_expert(arch_models, tmp_path, open_model):
    path = str(shutil.copytree(arch_models["moe_e4_top1"], tmp_path / "moe"))
    gone = "model.layers.2.mlp.experts.3.up_proj.weight"
    edit_weights(path, lambda t: t.pop(gone))
    want = f"lacks 1 tensor\\(s\\) the model needs: {re.escape(gone)}"
    with pytest.raises(ValueError, match=want):
        open_model(path)
    bad = "model.layers.0.mlp.experts.1.down_proj.weight"
    edit_weights(path, lambda t: t.update({gone: torch.zeros(32, 64), bad: torch.zeros(64, 16)}))
    with pytest.raises(ValueError, match=f"tensor '{re.escape(bad)}' .* has shape \\[64, 16\\], "
                                         "config.json implies \\[64, 32\\]"):
        open_model(path)
