"""GGUF checkpoints of every supported architecture against transformers' own GGUF loader, and
the errors a bad GGUF gives."""
import os
import shutil

import numpy as np
import pytest
import torch

from nanovllm import LLM
from nanovllm.utils.gguf_file import GGUFCheckpoint, find_gguf
from nanovllm.utils.toy import save_random_model
from tests.support.gguf_files import write_gguf
from tests.support.hf_oracle import check_teacher_forced_logits
from tests.support.prompts import make_prompts

# name -> (architecture, config overrides); sizes fit Q8_0's 32-value blocks.
GGUF_MODELS = {
    # llama: q/k rows permuted by llama.cpp's converter; GQA 2, untied (output.weight written)
    "llama": ("LlamaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                       tie_word_embeddings=False)),
    # qwen2: q/k/v biases; tied (no output.weight)
    "qwen2": ("Qwen2ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2)),
    # qwen3: q/k norms, head_dim != hidden / heads (128: transformers' GGUF reader assumes it)
    "qwen3": ("Qwen3ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=128)),
    # qwen3moe: merged expert tensors, 8 experts top-2, written in F32 (see below)
    "qwen3moe": ("Qwen3MoeForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2)),
}
# transformers' GGUF reader of qwen3moe drops expert_feed_forward_length and norm_topk_prob
# (llama.cpp always renormalizes): there the oracle is HF on the safetensors the GGUF was
# written from, losslessly (F32).
SAFETENSORS_ORACLE = {"qwen3moe"}


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory, monkeypatch_module):
    """name -> (HF checkpoint dir, GGUF file of it: 2-D weights in Q8_0, or F32)."""
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for i, (name, (arch, kw)) in enumerate(GGUF_MODELS.items()):
        hf = save_random_model(str(root / name), arch, seed=i, **kw)
        quant = "F32" if name in SAFETENSORS_ORACLE else "Q8_0"
        out[name] = hf, write_gguf(hf, str(root / f"{name}.gguf"), quant=quant)
    return out


@pytest.fixture(scope="module")
def monkeypatch_module(tmp_path_factory):
    """The GGUF cache in a scratch directory for this module (not the user's)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    yield mp
    mp.undo()


def hf_from_gguf(file: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(file), gguf_file=os.path.basename(file), dtype=torch.float32,
        attn_implementation="eager").eval()


@pytest.mark.parametrize("name", list(GGUF_MODELS))
def test_logits_match_transformers_loading_the_same_gguf(gguf_models, name):
    hf, file = gguf_models[name]
    llm = LLM(file, skip_tokenizer_init=True, kvcache_block_size=16, num_kvcache_blocks=64)
    assert llm.config.model == file
    if name in SAFETENSORS_ORACLE:
        check_teacher_forced_logits(llm, hf, make_prompts(1, n=3))
    else:
        check_teacher_forced_logits(llm, file, make_prompts(1, n=3),
                                    ref_model=hf_from_gguf(file))


def test_a_directory_with_one_gguf_loads_it_and_the_index_is_cached(gguf_models, tmp_path):
    _, file = gguf_models["qwen3"]
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(file, d / "model.gguf")
    assert find_gguf(str(d)) == str(d / "model.gguf")
    first = GGUFCheckpoint(str(d / "model.gguf"))
    assert os.path.isfile(os.path.join(first.cache, "index.json"))
    assert GGUFCheckpoint(str(d / "model.gguf")).tensors == first.tensors
    llm = LLM(str(d), skip_tokenizer_init=True, kvcache_block_size=16, num_kvcache_blocks=16)
    assert llm.config.model == str(d / "model.gguf")
    out = llm.generate([[5, 6, 7]], use_tqdm=False)
    assert len(out[0]["token_ids"]) > 0


def test_the_cache_follows_the_file(gguf_models, tmp_path):
    # A different file written to the same path must not be read through the old index.
    f = tmp_path / "m.gguf"
    shutil.copy(gguf_models["qwen3"][1], f)
    a = GGUFCheckpoint(str(f))
    shutil.copy(gguf_models["qwen2"][1], f)
    b = GGUFCheckpoint(str(f))
    assert a.cache != b.cache
    assert b.config["architectures"] == ["Qwen2ForCausalLM"]


def test_unsupported_architecture_is_a_value_error(gguf_models, tmp_path):
    hf, _ = gguf_models["qwen3"]
    f = write_gguf(hf, str(tmp_path / "gpt2.gguf"), arch_name="gpt2")
    with pytest.raises(ValueError, match="'gpt2' is not supported.*llama, qwen2, qwen3"):
        LLM(f, skip_tokenizer_init=True)


def test_unsupported_tensor_type_is_a_value_error(gguf_models, tmp_path):
    hf, _ = gguf_models["qwen3"]
    f = write_gguf(hf, str(tmp_path / "odd.gguf"), tensor_types={"blk.0.attn_q.weight": "I8"})
    with pytest.raises(ValueError, match="'blk.0.attn_q.weight' has GGUF type I8.*Q4_K"):
        LLM(f, skip_tokenizer_init=True)


def test_llama3_rope_factors_are_refused(gguf_models, tmp_path):
    hf, _ = gguf_models["llama"]
    f = write_gguf(hf, str(tmp_path / "l3.gguf"),
                   extra_tensors={"rope_freqs.weight": np.ones(8, np.float32)})
    with pytest.raises(ValueError, match="rope_freqs"):
        LLM(f, skip_tokenizer_init=True)


def test_bad_gguf_paths_are_value_errors(gguf_models, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        LLM(str(junk))
    two = tmp_path / "two"
    two.mkdir()
    for n in ("a.gguf", "b.gguf"):
        shutil.copy(gguf_models["qwen3"][1], two / n)
    with pytest.raises(ValueError, match="2 GGUF files"):
        LLM(str(two))
    with pytest.raises(ValueError, match="load_format='safetensors'"):
        LLM(gguf_models["qwen3"][1], load_format="safetensors")
    with pytest.raises(ValueError, match="load_format='gguf'"):
        LLM(gguf_models["qwen3"][0], load_format="gguf")


def test_a_gguf_without_tokenizer_metadata_says_how_to_give_one(gguf_models):
    hf, file = gguf_models["qwen3"]
    with pytest.raises(ValueError, match="tokenizer=<"):
        LLM(file)
    # The HF directory's tokenizer fits the model: tokenizer= makes text prompts work.
    llm = LLM(file, tokenizer=hf, kvcache_block_size=16, num_kvcache_blocks=16)
    assert llm.generate("Hello", use_tqdm=False)[0]["text"] is not None
