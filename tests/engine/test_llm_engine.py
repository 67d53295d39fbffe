"""The generate API end to end on a tiny random model (CPU)."""
import pytest

from nanovllm import LLM, SamplingParams
from tests.support.text import STOP_PROMPT, greedy_with_stop


@pytest.fixture(scope="module")
def llm(toy_models):
    return LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256)


def test_outputs_in_input_order_with_strings_and_ids(llm):
    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    single = [llm.generate([p], sp, use_tqdm=False)[0] for p in ("hello world", [4, 5, 6])]
    both = llm.generate(["hello world", [4, 5, 6]], sp, use_tqdm=True)
    strip = [{k: v for k, v in o.items() if k != "request_id"} for o in both]
    assert strip == [{k: v for k, v in o.items() if k != "request_id"} for o in single]
    assert set(both[0]) == {"request_id", "text", "token_ids", "finish_reason"}
    assert isinstance(both[0]["text"], str) and len(both[0]["token_ids"]) == 5


def test_per_prompt_params_and_seed(llm):
    sps = [SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True),
           SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)]
    a = llm.generate([[7, 8, 9], [7, 8, 9]], sps, use_tqdm=False)
    b = llm.generate([[7, 8, 9], [1, 2]], sps, use_tqdm=False)
    assert a[0]["token_ids"] == b[0]["token_ids"]  # seeded: same samples in another batch
    assert len(a[1]["token_ids"]) == 3


def test_eos_and_stop_token_ids(llm):
    greedy = llm.generate([[10, 11, 12]], SamplingParams(temperature=0, max_tokens=20,
                                                         ignore_eos=True), use_tqdm=False)[0]
    target = greedy["token_ids"][4]
    out = llm.generate([[10, 11, 12]], SamplingParams(temperature=0, max_tokens=20,
                                                      stop_token_ids=[target]), use_tqdm=False)[0]
    first = greedy["token_ids"].index(target)
    assert out["finish_reason"] == "stop" and out["token_ids"] == greedy["token_ids"][: first + 1]


def test_stop_string_cuts_text(llm):
    text, stop, sp = greedy_with_stop(llm)
    out = llm.generate([STOP_PROMPT], sp, use_tqdm=False)[0]
    assert out["finish_reason"] == "stop"
    assert out["text"] == text[: text.find(stop)]
    assert len(out["token_ids"]) < 24


def test_ids_beyond_the_tokenizer_decode(llm):
    # vocab_size (640) exceeds the tokenizer's (~400): such ids must not crash decoding.
    assert llm.text.decode([5, 600, 639]) == llm.text.decode([5])


def test_engine_step_api(llm):
    rid = llm.add_request([3, 4, 5], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    done = []
    while not llm.is_finished():
        finished, _ = llm.step()
        done += finished
    assert len(done) == 1 and len(done[0]["token_ids"]) == 2 and done[0]["request_id"] == rid


def test_unknown_config_argument(toy_models):
    with pytest.raises(ValueError, match="unknown argument"):
        LLM(toy_models["tied_mha_d16"], max_num_seq=3)


def test_missing_files(tmp_path, toy_models):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(toy_models["tied_mha_d16"], d)
    for f in d.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ValueError, match="safetensors"):
        LLM(str(d))
    with pytest.raises(ValueError, match="neither a local path nor a Hugging Face hub id"):
        LLM(str(tmp_path / "nope"))
