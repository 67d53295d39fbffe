"""Which batch sizes get a decode CUDA graph (pure arithmetic, runs on CPU)."""
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
