"""EngineCore. Defence in depth: a step that raises (here: building one batch's sampling
tensors) fails only the requests of that step, frees their KV blocks and leaves the engine
serving; only steps failing again and again (a broken device) let the error out. And the
core alone, on a fake executor: streamed deltas add up to whole outputs, aborts are reported
once."""
import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.engine import core as engine_core
from nanovllm.engine import step_inputs

POISON_SEED = 4242  # a request with this seed makes its step raise
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
POISON = SamplingParams(temperature=1.0, seed=POISON_SEED, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(toy_models):
    # Separate prefill steps: a prompt arriving while others decode then runs in a step of
    # its own (a mixed step would hold both, and fail both).
    llm = LLM(toy_models["tied_mha_d16"], device="cpu", dtype="float32", kvcache_block_size=16,
              max_model_len=128, num_kvcache_blocks=32, enable_mixed_steps=False)
    yield llm
    llm.shutdown()


@pytest.fixture
def poisoned(monkeypatch):
    """The host builder's sampling rows raise for a batch holding a POISON_SEED request."""
    original = step_inputs.sampling_rows

    def sampling_rows(params, *args, **kwargs):
        if any(p.seed == POISON_SEED for p in params):
            raise OverflowError("injected failure")
        return original(params, *args, **kwargs)

    monkeypatch.setattr(step_inputs, "sampling_rows", sampling_rows)


def run_steps(llm, limit=200):
    outputs = {}
    for _ in range(limit):
        if llm.is_finished():
            return outputs
        for out in llm.step()[0]:
            outputs[out.request_id] = out
    raise AssertionError("the engine did not finish")


def test_failed_step_fails_only_its_requests(llm, poisoned):
    want = llm.generate(["the quick brown fox"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    bm = llm.clients[0].core.scheduler.block_manager
    good = llm.add_request("the quick brown fox", GREEDY)
    for _ in range(3):  # the good request is decoding when the poisoned one arrives
        llm.step()
    bad = llm.add_request("jumps over", POISON)  # its prefill step (alone) raises
    outputs = run_steps(llm)
    assert outputs[bad].outputs[0].finish_reason == "error"
    assert "injected failure" in outputs[bad].outputs[0].stop_reason
    assert outputs[good].outputs[0].finish_reason == "length"
    assert outputs[good].outputs[0].token_ids == want  # untouched by its neighbour's failure
    assert bm.num_free_blocks == bm.num_blocks
    assert llm.generate(["still serving"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_failed_step_in_a_shared_decode_batch(llm, poisoned):
    """A decode batch holds every running request: all of them fail, together, and the
    next requests are served."""
    a = llm.add_request("one", GREEDY)
    b = llm.add_request("two", POISON)
    outputs = run_steps(llm)
    assert {outputs[a].outputs[0].finish_reason, outputs[b].outputs[0].finish_reason} == {"error"}
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert len(llm.generate(["again"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 12


def test_generate_raises_and_engine_keeps_serving(llm, poisoned):
    with pytest.raises(RuntimeError, match="injected failure"):
        llm.generate(["a", "b"], [GREEDY, POISON], use_tqdm=False)
    assert llm.is_finished()
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert len(llm.generate(["again"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 12


def test_parallel_samples_of_a_failed_request_all_fail(llm, poisoned):
    bad = llm.add_request("fork me", SamplingParams(n=3, seed=POISON_SEED, max_tokens=4))
    out = run_steps(llm)[bad]
    assert [c.finish_reason for c in out.outputs] == ["error"] * 3
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_steps_failing_again_and_again_raise(llm, monkeypatch):
    """A broken device fails every step: after MAX_STEP_FAILURES in a row the error
    propagates (through the core, the server then exits for its supervisor to restart)."""
    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    llm.generate(["a good step ends any earlier streak"], GREEDY, use_tqdm=False)
    monkeypatch.setattr(step_inputs, "sampling_rows", broken)
    for i in range(engine_core.MAX_STEP_FAILURES - 1):
        rid = llm.add_request(f"r{i}", GREEDY)
        assert run_steps(llm)[rid].outputs[0].finish_reason == "error"
    llm.add_request("last straw", GREEDY)
    with pytest.raises(RuntimeError, match="device lost"):
        llm.step()
    monkeypatch.undo()
    llm.abort_all()
    assert len(llm.generate(["back"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 12


# -- The core alone: a fake executor, no device -------------------------------------------
class FakeHandle:
    def __init__(self, ids):
        self.ids, self.logprobs = ids, None

    def result(self):
        return self.ids


class FakeExecutor:
    """Samples token (position % 7) + 10 for every sequence: an Executor with no device."""

    num_kvcache_blocks, on_gpu = 64, False

    def set_eos_ids(self, eos_ids):
        self.eos_ids = eos_ids

    def launch(self, seqs, is_prefill):
        return FakeHandle([s.num_tokens % 7 + 10 for s in seqs])

    def shutdown(self):
        pass


def fake_core(toy_models, stream, async_scheduling=False):
    from nanovllm.config import Config
    from nanovllm.engine.core import EngineCore

    config = Config(toy_models["tied_mha_d16"], kvcache_block_size=16, max_model_len=128,
                    async_scheduling=async_scheduling)
    return EngineCore(config, FakeExecutor(), {3}, stream=stream)


def drain(core):
    from nanovllm.engine.messages import Outputs

    out = Outputs()
    while not core.is_finished():
        out.extend(core.step())
    return out


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_stream_deltas_add_up_to_the_whole_outputs(toy_models, async_scheduling):
    from nanovllm.engine.messages import Request

    requests = [Request(7, [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True)),
                Request(9, [4, 5], SamplingParams(max_tokens=3, n=2, ignore_eos=True))]
    whole = {}
    for stream in (False, True):
        core = fake_core(toy_models, stream, async_scheduling)
        for r in requests:
            core.add(r)
        out = drain(core)
        tokens: dict = {}
        for delta in out.samples:
            tokens.setdefault((delta.request_id, delta.index), []).extend(delta.token_ids)
        ends = [(e.request_id, e.finish_reason) for e in out.ended]
        if not stream:  # one delta per sample, at its request's end
            assert len(out.samples) == 3
        else:
            assert len(out.samples) > 3
        whole[stream] = (tokens, sorted(ends))
        assert core.stats()["num_live_requests"] == 0 and core.stats()["idle"]
    assert whole[False] == whole[True]
    tokens, ends = whole[True]
    assert ends == [(7, "length"), (9, "length")]
    assert [len(tokens[k]) for k in sorted(tokens)] == [5, 3, 3]


def test_abort_reports_the_request_once_and_unknown_ids_are_ignored(toy_models):
    from nanovllm.engine.messages import Request

    core = fake_core(toy_models, stream=True)
    core.add(Request(1, [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True)))
    core.step()
    core.abort([1, 99])
    out = core.step()
    assert [(e.request_id, e.finish_reason) for e in out.ended] == [(1, "abort")]
    assert core.is_finished() and not core.step()
    assert core.stats()["num_aborted"] == 1


def test_engine_heap_frozen_while_serving_then_released(toy_models):
    """The objects alive when a core starts (model, torch, tokenizer) are frozen out of the
    collector's full passes while it serves, and collectable again after shutdown."""
    import gc

    gc.unfreeze()
    llm = LLM(toy_models["tied_mha_d16"], device="cpu", dtype="float32", kvcache_block_size=16,
              max_model_len=64, num_kvcache_blocks=8)
    try:
        assert gc.get_freeze_count() > 1000
        assert llm.generate(["a b"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    finally:
        llm.shutdown()
    assert gc.get_freeze_count() == 0
