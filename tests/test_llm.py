"""LLM, the offline front end: generate and chat on the shared small engine, the step API
(add_request / step / is_finished) and how it meets generate(), and on a GPU the Triton
backend against the torch reference."""
import pytest
import torch

from nanovllm import LLM, SamplingParams
from tests.support.prompts import make_prompts
from tests.support.text import STOP_PROMPT, greedy_with_stop

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
# A template of our own, so the test does not depend on the one the toy tokenizer ships.
TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture
def llm(small_llm, monkeypatch):
    monkeypatch.setattr(small_llm.tokenizer, "chat_template", TEMPLATE, raising=False)
    return small_llm


def test_one_conversation_is_one_output_of_its_templated_prompt(llm):
    out = llm.chat(HELLO, GREEDY, use_tqdm=False)
    text = "[system] Be brief.\n[user] hello\n[assistant] "
    assert len(out) == 1 and out[0].prompt == text
    assert out[0].prompt_token_ids == llm.tokenizer.encode(text, add_special_tokens=False)
    want = llm.generate([{"prompt_token_ids": out[0].prompt_token_ids}], GREEDY, use_tqdm=False)
    assert out[0]["token_ids"] == want[0]["token_ids"] and out[0]["finish_reason"] == "length"


def test_a_list_of_conversations_and_template_options(llm):
    other = [{"role": "user", "content": "bye"}]
    outs = llm.chat([HELLO, other], GREEDY, use_tqdm=False)
    assert [o.prompt for o in outs] == [llm.chat(c, GREEDY, use_tqdm=False)[0].prompt
                                        for c in (HELLO, other)]
    bare = llm.chat(other, GREEDY, use_tqdm=False, add_generation_prompt=False)[0]
    assert bare.prompt == "[user] bye\n"
    mine = llm.chat(other, [GREEDY], use_tqdm=False, chat_template="<{{ messages[0].content }}>")
    assert mine[0].prompt == "<bye>"


@pytest.mark.parametrize("messages, match", [
    ([], "empty list"),
    ("hello", "got str"),
    ({"role": "user", "content": "hi"}, "got dict"),
    ([{"role": "user"}], 'message 0 needs a string "role" and a string "content"'),
    ([{"role": "user", "content": 3}], 'message 0 needs a string "role"'),
    ([HELLO, []], "conversation 1: it has no messages"),
    ([HELLO, "hi"], "an item is a str"),
    ([HELLO, [{"role": "user", "content": "x"}, "x"]], "conversation 1: message 1 is a str"),
])
def test_bad_conversations(llm, messages, match):
    with pytest.raises(ValueError, match=match):
        llm.chat(messages, GREEDY, use_tqdm=False)
    assert llm.is_finished() and len(llm.chat(HELLO, GREEDY, use_tqdm=False)) == 1


def test_bad_templates(llm):
    with pytest.raises(ValueError, match="chat template failed"):
        llm.chat(HELLO, GREEDY, use_tqdm=False, chat_template="{% for %}")
    with pytest.raises(ValueError, match="chat_template must be"):
        llm.chat(HELLO, GREEDY, use_tqdm=False, chat_template=5)
    saved, llm.tokenizer.chat_template = llm.tokenizer.chat_template, None
    try:
        with pytest.raises(ValueError, match="no chat template.*chat_template="):
            llm.chat(HELLO, GREEDY, use_tqdm=False)
        assert llm.chat(HELLO, GREEDY, use_tqdm=False, chat_template=TEMPLATE)[0].prompt
    finally:
        llm.tokenizer.chat_template = saved
    assert llm.is_finished()


def test_chat_needs_the_tokenizer(toy_models):
    llm = LLM(toy_models["tied_mha_d16"], kvcache_block_size=16, max_model_len=64,
              skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        llm.chat(HELLO, GREEDY, use_tqdm=False)
    llm.shutdown()


# -- The generate API end to end on a tiny random model (CPU).
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


# -- The step API (add_request / step / is_finished) and how it meets generate().
def run_steps(llm) -> dict:
    outputs = {}
    while not llm.is_finished():
        finished, _ = llm.step()
        outputs.update((o["request_id"], o) for o in finished)
    return outputs


def test_step_returns_the_outputs_generate_returns(llm):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["abc", [9, 8, 7]]
    expected = llm.generate(prompts, greedy, use_tqdm=False)
    ids = [llm.add_request(p, greedy) for p in prompts]
    got = run_steps(llm)
    assert sorted(got) == sorted(ids)
    for rid, want in zip(ids, expected):
        assert got[rid] == dict(want, request_id=rid)


def test_step_applies_stop_strings_and_hides_special_tokens(llm):
    text, stop, sp = greedy_with_stop(llm)
    want = llm.generate([STOP_PROMPT], sp, use_tqdm=False)[0]
    rid = llm.add_request(STOP_PROMPT, sp)
    out = run_steps(llm)[rid]
    assert out["finish_reason"] == "stop"
    assert out["text"] == want["text"] == text[: text.find(stop)]
    assert stop not in out["text"]
    # The end token of a finished request is not part of its text.
    eos = llm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    rid = llm.add_request([5, 6], SamplingParams(temperature=0, max_tokens=8,
                                                 stop_token_ids=[eos]))
    assert "<|im_end|>" not in run_steps(llm)[rid]["text"]


def test_generate_refuses_while_step_requests_are_pending(llm):
    sp = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    rid = llm.add_request([1, 2, 3], sp)
    with pytest.raises(ValueError, match="pending"):
        llm.generate(["x"], sp, use_tqdm=False)
    # Nothing was lost: the pending request still completes, and generate works afterwards.
    assert list(run_steps(llm)) == [rid]
    assert len(llm.generate(["x"], sp, use_tqdm=False)) == 1
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks


# -- End to end on a GPU: Triton backend against the torch reference, with and without graphs.
# Every third prompt starts with the same 60 random tokens; the rest are up to 89 tokens long.
GPU_PROMPTS = dict(shared=60, every=3, max_len=89)


def gpu_greedy(path, ps, **kw):
    llm = LLM(path, device="cuda", dtype="float32", max_num_seqs=16, **kw)
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    a = [o["token_ids"] for o in llm.generate(ps, sp, use_tqdm=False)]
    b = [o["token_ids"] for o in llm.generate(ps, sp, use_tqdm=False)]  # now with prefix hits
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    llm.shutdown()
    assert a == b
    return a


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 256])
def test_triton_matches_torch_eager_and_graphs(toy_models, block_size):
    path = toy_models["untied_gqa4_d64"]
    ps = make_prompts(0, 12, **GPU_PROMPTS)
    ref = gpu_greedy(path, ps, attention_backend="torch", enforce_eager=True,
                 kvcache_block_size=block_size)
    eager = gpu_greedy(path, ps, attention_backend="triton", enforce_eager=True,
                   kvcache_block_size=block_size)
    graphs = gpu_greedy(path, ps, attention_backend="triton", enforce_eager=False,
                    kvcache_block_size=block_size)
    assert eager == ref
    assert graphs == ref


@pytest.mark.gpu
@pytest.mark.parametrize("orders", [True, False])
def test_triton_launch_orders_match_torch(toy_models, monkeypatch, orders):
    # Decode programs started kv head by kv head and longest row first (the default), or in
    # plain grid order (eager and graphs): the engine's order row reaches the kernel and each
    # row's output lands in its place.
    from nanovllm.kernels import triton_decode

    path = toy_models["untied_gqa4_d64"]
    ps = make_prompts(2, 12, **GPU_PROMPTS)
    ref = gpu_greedy(path, ps, attention_backend="torch", enforce_eager=True, kvcache_block_size=16)
    monkeypatch.setitem(triton_decode.CONFIG, "HEAD_FAST", orders)
    monkeypatch.setitem(triton_decode.CONFIG, "LPT", orders)
    for eager in (True, False):
        assert gpu_greedy(path, ps, attention_backend="triton", enforce_eager=eager,
                      kvcache_block_size=16) == ref


@pytest.mark.gpu
def test_triton_chunked_prefill_and_preemption(toy_models):
    path = toy_models["tied_gqa4_d16_l4"]
    ps = make_prompts(1, 12, **GPU_PROMPTS)
    ref = gpu_greedy(path, ps, attention_backend="torch", enforce_eager=True, kvcache_block_size=16)
    got = gpu_greedy(path, ps, attention_backend="triton", kvcache_block_size=16,
                 max_num_batched_tokens=50, num_kvcache_blocks=24)
    assert got == ref


@pytest.mark.gpu
def test_bf16_graphs_run(toy_models):
    llm = LLM(toy_models["tied_mha_d16"], device="cuda", max_num_seqs=64)
    assert llm.clients[0].core.executor.runner.dtype == torch.float32  # the toy checkpoint is fp32
    llm.shutdown()
    llm = LLM(toy_models["tied_mha_d16"], device="cuda", dtype="bfloat16", max_num_seqs=64)
    sp = SamplingParams(temperature=0.6, max_tokens=20, ignore_eos=True)
    out = llm.generate(make_prompts(0, 40, **GPU_PROMPTS), sp, use_tqdm=False)
    assert all(len(o["token_ids"]) == 20 for o in out)
    llm.shutdown()
