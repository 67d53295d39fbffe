"""Start-up cost on a CPU: the GPU's memory-sizing warm-up must not run there."""
from nanovllm import LLM, SamplingParams
from nanovllm.models.qwen3 import Qwen3ForCausalLM


def test_cpu_start_up_runs_no_sizing_prefill(toy_models, monkeypatch):
    seen = []
    forward = Qwen3ForCausalLM.forward

    def counting(self, input_ids, positions):
        seen.append(input_ids.numel())
        return forward(self, input_ids, positions)

    monkeypatch.setattr(Qwen3ForCausalLM, "forward", counting)
    # Defaults: the GPU warm-up would prefill max_num_batched_tokens (16,384) tokens here,
    # which for a Qwen3-0.6B-shaped model took 149 s of a CPU start-up.
    llm = LLM(toy_models["tied_mha_d16"], device="cpu")
    assert seen == []
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0]["token_ids"]) == 2 and seen == [3, 1]
