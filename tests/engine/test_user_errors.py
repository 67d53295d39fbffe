"""What a user can get wrong when creating an engine or calling generate: each is a clear
ValueError (or accepted, where vLLM accepts it), and the engine keeps serving afterwards."""
import pathlib
import shutil

import numpy as np
import pytest
import torch

from nanovllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture
def llm(small_llm):
    return small_llm


def ids(outputs):
    return [o["token_ids"] for o in outputs]


@pytest.mark.parametrize("prompts", [None, 123, 4.5, b"bytes", {"a": 1}, [1, 2, 3],
                                     np.array([1, 2, 3]), ["ok", 7]])
def test_bad_prompt_arguments_are_value_errors(llm, prompts):
    with pytest.raises(ValueError, match="prompt"):
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.is_finished()
    assert len(llm.generate(["still serving"], GREEDY, use_tqdm=False)) == 1


def test_one_string_prompt_gives_one_output(llm):
    one = llm.generate("hello", GREEDY, use_tqdm=False)
    assert len(one) == 1 and ids(one) == ids(llm.generate(["hello"], GREEDY, use_tqdm=False))


def test_any_iterable_of_prompts_and_numpy_ids(llm):
    want = ids(llm.generate([[4, 5, 6], [7, 8]], GREEDY, use_tqdm=False))
    assert ids(llm.generate((p for p in ([4, 5, 6], [7, 8])), GREEDY, use_tqdm=False)) == want
    as_numpy = [list(np.array([4, 5, 6], dtype=np.int64)), np.array([7, 8], dtype=np.int32)]
    assert ids(llm.generate(as_numpy, GREEDY, use_tqdm=False)) == want
    assert ids(llm.generate([torch.tensor([4, 5, 6]), (7, 8)], GREEDY, use_tqdm=False)) == want
    assert llm.generate([], GREEDY, use_tqdm=False) == []


@pytest.mark.parametrize("prompt", [[1.0, 2.0], [True, 3], [-1], [10 ** 6], []])
def test_bad_token_ids(llm, prompt):
    with pytest.raises(ValueError, match="token ids|empty"):
        llm.generate([prompt], GREEDY, use_tqdm=False)
    assert len(llm.generate([[1, 2]], GREEDY, use_tqdm=False)) == 1


def test_path_like_model_path(toy_models):
    llm = LLM(pathlib.Path(toy_models["tied_mha_d16"]), kvcache_block_size=16, max_model_len=64)
    assert len(llm.generate(["hi"], GREEDY, use_tqdm=False)) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")
@pytest.mark.parametrize("kw, match", [
    (dict(device="cuda"), "no CUDA GPU"),
    (dict(device="cuda:1"), "no CUDA GPU"),
    (dict(device="tpu"), "device"),
    (dict(attention_backend="triton"), "needs a CUDA GPU"),
    (dict(attention_backend="flash"), "needs a CUDA GPU"),
    (dict(enforce_eager="yes"), "enforce_eager"),
])
def test_device_and_backend_errors_on_cpu(toy_models, kw, match):
    with pytest.raises(ValueError, match=match):
        LLM(toy_models["tied_mha_d16"], kvcache_block_size=16, **kw)


def test_missing_tokenizer_is_named_at_load_time(toy_models, tmp_path):
    d = tmp_path / "no_tokenizer"
    shutil.copytree(toy_models["tied_mha_d16"], d)
    removed = [f for f in d.iterdir() if f.name.startswith(("tokenizer", "vocab", "merges",
                                                            "special_tokens"))]
    assert removed
    for f in removed:
        f.unlink()
    with pytest.raises(ValueError, match=r"no_tokenizer.*no tokenizer.*tokenizer\.json.*"
                                         r"skip_tokenizer_init=True"):
        LLM(str(d), kvcache_block_size=16)

    # Token ids only, by explicit choice: works, with eos from config.json and no text.
    llm = LLM(str(d), kvcache_block_size=16, max_model_len=64, skip_tokenizer_init=True)
    assert llm.clients[0].core.scheduler.eos_ids == {2}
    out = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0]
    assert len(out["token_ids"]) == 4 and out["text"] == ""
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        llm.generate(["text"], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="stop strings"):
        llm.generate([[5]], SamplingParams(stop="x"), use_tqdm=False)
    assert len(llm.generate([[5, 6]], GREEDY, use_tqdm=False)) == 1


def test_empty_tokenizer_is_refused(toy_models, tmp_path):
    # A tokenizer.json that defines no tokens: transformers loads it without complaint.
    d = tmp_path / "empty_tokenizer"
    shutil.copytree(toy_models["tied_mha_d16"], d)
    from tokenizers import Tokenizer, models

    for f in d.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "merges", "special_tokens")):
            f.unlink()
    Tokenizer(models.WordLevel({}, unk_token=None)).save(str(d / "tokenizer.json"))
    with pytest.raises(ValueError, match="tokenizer"):
        LLM(str(d), kvcache_block_size=16)


BIG = 2 ** 63


@pytest.mark.parametrize("prompt, sp, priority, match", [
    ("hi", dict(top_k=BIG, temperature=1.0), 0, "top_k"),
    ("hi", dict(seed=BIG), 0, "seed"),
    ("hi", dict(n=1000), 0, "n="),
    ("hi", dict(stop=["x"] * 1000), 0, "stop"),
    ("hi", dict(stop_token_ids=[BIG]), 0, "stop_token_ids"),
    ("\ud800", {}, 0, "prompt is not valid UTF-8"),
    ({"prompt": "a\udfff"}, {}, 0, "prompt is not valid UTF-8"),
    ("hi", {}, BIG, "priority"),
    ("hi", {}, -BIG - 1, "priority"),
])
def test_issue_26_values_offline_are_value_errors(llm, prompt, sp, priority, match):
    """The values that broke the server (issue 26) are ValueErrors offline too, and the
    engine keeps serving."""
    with pytest.raises(ValueError, match=match):
        llm.generate([prompt], [SamplingParams(**sp)] if sp else GREEDY, use_tqdm=False,
                     priority=[priority])
    assert llm.is_finished()
    assert len(llm.generate(["still serving"], GREEDY, use_tqdm=False)) == 1


def test_surrogate_in_chat_content_is_a_value_error(llm):
    with pytest.raises(ValueError, match="message 0 content is not valid UTF-8"):
        llm.chat([{"role": "user", "content": "\ud800"}], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="message 1 role is not valid UTF-8"):
        llm.chat([{"role": "user", "content": "a"}, {"role": "\udc00", "content": "b"}],
                 GREEDY, use_tqdm=False)


def test_max_tokens_past_max_model_len_is_a_value_error(llm):
    """As the server answers 400 (issue 27): no silent cap at max_model_len (256 here)."""
    with pytest.raises(ValueError, match=r"max_tokens=300 .*prompt has 3 tokens.*"
                                         r"max_model_len=256.*at most 253"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=300), use_tqdm=False)
    with pytest.raises(ValueError, match="max_tokens"):
        llm.add_request([1, 2, 3], SamplingParams(max_tokens=254))
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=253, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 253 and out.outputs[0].finish_reason == "length"
