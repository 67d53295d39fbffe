"""LLM.chat: conversations through the tokenizer's chat template, outputs as generate's."""
import pytest

from nanovllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
# A template of our own, so the test does not depend on the one the toy tokenizer ships.
TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module")
def llm(toy_models):
    llm = LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256)
    llm.tokenizer.chat_template = TEMPLATE  # this engine's own tokenizer object only
    yield llm
    llm.shutdown()


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
