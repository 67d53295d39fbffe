"""Loading the tokenizer (cached on disk after the first time) and carrying it to an engine
process: PickledTokenizer unpickles it only on use."""
import json
import os
import pickle
import shutil
import sys

import pytest
import transformers

from nanovllm.engine.tokenizer import TextDecoder
from nanovllm.sampling_params import SamplingParams
from nanovllm.utils import tokenizer as tokenizer_module
from nanovllm.utils import tokenizer_cache
from nanovllm.utils.tokenizer import PickledTokenizer, load_tokenizer, unwrap_tokenizer
from tests.support.decode import check_decode_matches_the_tokenizers


def test_a_shipped_tokenizer_is_unpickled_only_when_text_is_needed(toy_models):
    real = load_tokenizer(toy_models["tied_mha_d16"])
    shipped = pickle.loads(pickle.dumps(PickledTokenizer(real)))  # what the process receives
    assert len(shipped) == len(real) and shipped._tokenizer is None  # len needs no unpickling
    ids = real.encode("The quick brown fox jumps over the lazy dog.")
    stop = SamplingParams(stop=["lazy"])
    assert TextDecoder(shipped).completion_text(ids, stop) == \
        TextDecoder(real).completion_text(ids, stop)
    assert shipped._tokenizer is not None and unwrap_tokenizer(shipped) is shipped._tokenizer
    assert type(unwrap_tokenizer(shipped)) is type(real) and unwrap_tokenizer(real) is real
    # Sent on again (a Ray actor's arguments), it carries the pickle, not the loaded copy.
    assert pickle.loads(pickle.dumps(shipped))._tokenizer is None


def test_decode_matches_the_tokenizers(toy_models):
    check_decode_matches_the_tokenizers(load_tokenizer(toy_models["tied_mha_d16"]))


def _copy_model(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def _same_tokenizer(a, b):
    text = "The quick brown fox <|im_end|> jumps. 123"
    assert type(a) is type(b) and len(a) == len(b)
    assert a.encode(text) == b.encode(text) and a.eos_token_id == b.eos_token_id
    assert a.decode(a.encode(text)) == b.decode(b.encode(text))
    msgs = [{"role": "user", "content": "hi"}]
    assert (a.apply_chat_template(msgs, tokenize=False)
            == b.apply_chat_template(msgs, tokenize=False))


def test_a_directorys_tokenizer_is_loaded_from_the_cache_after_the_first_time(
        toy_models, tmp_path, monkeypatch):
    monkeypatch.setenv(tokenizer_cache.CACHE_ENV, str(tmp_path / "cache"))
    model = _copy_model(toy_models["tied_mha_d16"], tmp_path / "model")
    first = load_tokenizer(model)
    assert len(os.listdir(tmp_path / "cache")) == 1

    def no_auto(*args, **kwargs):
        raise AssertionError("AutoTokenizer was used on a cache hit")

    with monkeypatch.context() as m:
        m.setattr(transformers.AutoTokenizer, "from_pretrained", no_auto)
        again = load_tokenizer(model)
    _same_tokenizer(first, again)
    # A changed tokenizer file is another key: loaded anew and cached...
    config = os.path.join(model, "tokenizer_config.json")
    with open(config) as f:
        settings = json.load(f)
    settings["eos_token"] = "<|endoftext|>"
    with open(config, "w") as f:
        json.dump(settings, f)
    changed = load_tokenizer(model)
    assert changed.eos_token == "<|endoftext|>" != first.eos_token
    # ... and replaces the directory's older entry; another directory's stays.
    assert len(os.listdir(tmp_path / "cache")) == 1
    load_tokenizer(_copy_model(toy_models["tied_mha_d16"], tmp_path / "other"))
    assert len(os.listdir(tmp_path / "cache")) == 2
    assert load_tokenizer(model).eos_token == "<|endoftext|>"


def test_a_broken_cache_entry_or_cache_dir_only_costs_the_slow_load(toy_models, tmp_path,
                                                                     monkeypatch):
    model = _copy_model(toy_models["tied_mha_d16"], tmp_path / "model")
    monkeypatch.setenv(tokenizer_cache.CACHE_ENV, str(tmp_path / "cache"))
    reference = load_tokenizer(model)
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_bytes(b"not a pickle")
    _same_tokenizer(reference, load_tokenizer(model))  # read fails: loaded and stored again
    _same_tokenizer(reference, pickle.loads(entry.read_bytes()))
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(tokenizer_cache.CACHE_ENV, str(tmp_path / "file" / "cache"))
    _same_tokenizer(reference, load_tokenizer(model))  # cannot store: still loads
    monkeypatch.setenv(tokenizer_cache.CACHE_ENV, "0")
    assert tokenizer_cache.cache_dir() is None
    _same_tokenizer(reference, load_tokenizer(model))



def test_a_first_load_in_a_child_gives_the_same_tokenizer_and_caches_it(toy_models, tmp_path,
                                                                          monkeypatch):
    # A GPU engine's first load runs AutoTokenizer in a child without torch (its imports off
    # this process's GIL): the same tokenizer, byte for byte as a pickle, then cached.
    monkeypatch.setenv(tokenizer_cache.CACHE_ENV, str(tmp_path / "cache"))
    model = _copy_model(toy_models["tied_mha_d16"], tmp_path / "model")
    child = tokenizer_module.load_in_child(model)
    here = transformers.AutoTokenizer.from_pretrained(model)
    _same_tokenizer(child, here)
    assert pickle.dumps(child) == pickle.dumps(pickle.loads(pickle.dumps(here, 5)))
    monkeypatch.delitem(sys.modules, tokenizer_module.AUTO_MODULE)  # as in a fresh process
    calls = []
    real = tokenizer_module.load_in_child
    monkeypatch.setattr(tokenizer_module, "load_in_child",
                        lambda path: calls.append(path) or real(path))
    _same_tokenizer(load_tokenizer(model, in_child=True), here)
    assert calls == [model] and len(os.listdir(tmp_path / "cache")) == 1


def test_a_failing_child_leaves_the_in_process_load_and_its_error(tmp_path, monkeypatch):
    assert tokenizer_module.load_in_child(str(tmp_path / "missing")) is None
    monkeypatch.setattr(sys, "executable", "")
    assert tokenizer_module.load_in_child(str(tmp_path)) is None
    (tmp_path / "tokenizer.json").write_text("not json")
    monkeypatch.delitem(sys.modules, tokenizer_module.AUTO_MODULE, raising=False)
    with pytest.raises(ValueError, match="could not load a tokenizer"):
        load_tokenizer(str(tmp_path), in_child=True)
