"""Which batch sizes get a decode CUDA graph (arithmetic, on CPU); on the device, the
graphs that sample against eager steps."""
import pytest

from nanovllm.worker.cuda_graph import graph_batch_sizes


@pytest.mark.parametrize("max_bs", [1, 3, 16, 100, 256, 300, 512])
def test_graph_sizes_cover_every_batch_with_bounded_padding(max_bs):
    sizes = graph_batch_sizes(max_bs)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == max_bs
    for n in range(1, max_bs + 1):
        fit = next(b for b in sizes if b >= n)
        # Padding rows stay few against the batch (at most half of it, or 7 rows).
        assert fit - n <= max(n // 2, 7)


def test_graph_count_for_the_default_batch():
    assert len(graph_batch_sizes(512)) == 19


@pytest.mark.gpu
def test_graphs_that_sample_match_eager_steps(toy_models, monkeypatch):
    """Plain decode steps run as one replay (forward, logits, sample) at every batch size:
    greedy ids of a batch equal eager steps', and sampled steps go through that replay."""
    from nanovllm import LLM, SamplingParams
    from nanovllm.worker.cuda_graph import DecodeGraphs

    replays = []
    real = DecodeGraphs.run_sampled
    monkeypatch.setattr(DecodeGraphs, "run_sampled",
                        lambda self, n: (replays.append(n), real(self, n))[1])
    prompts = [[3, 14, 15, 92], [65, 35], [89, 79, 32, 38, 46]]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = {}
    for eager in (True, False):
        llm = LLM(toy_models["untied_gqa4_d64"], enforce_eager=eager, max_model_len=256,
                  dtype="bfloat16")
        try:
            replays.clear()
            outs[eager] = [o["token_ids"] for o in llm.generate(prompts, greedy, use_tqdm=False)]
            assert replays == ([] if eager else [3] * 11)  # the batch of 3 in its 4-row graph
            outs[eager] += [llm.generate([p], greedy, use_tqdm=False)[0]["token_ids"]
                            for p in prompts]
            if not eager:
                replays.clear()
                hot = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
                sampled = llm.generate(prompts[:1], hot, use_tqdm=False)[0]["token_ids"]
                assert len(sampled) == 12 and replays == [1] * 11
        finally:
            llm.shutdown()
    assert outs[True] == outs[False]
