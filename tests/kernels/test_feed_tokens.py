"""The one-launch feed of pending tokens (kernels/feed_tokens.py) against the torch form."""
import pytest
import torch

from nanovllm.kernels.feed_tokens import feed_tokens_gpu
from nanovllm.worker.step_context import feed_tokens

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n", [1, 5, 37])
def test_feed_kernel_matches_torch(n):
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, 100, (n,), dtype=torch.int32, generator=g)
    feed = torch.randint(-1, 4, (n,), dtype=torch.int32, generator=g)
    sampled = torch.randint(0, 1000, (8,), dtype=torch.int32, generator=g)
    want = ids.clone()
    feed_tokens(want, feed, sampled)  # on the CPU: the torch form
    got = ids.to(DEVICE)
    feed_tokens_gpu(got, feed.to(DEVICE), sampled.to(DEVICE))
    assert torch.equal(got.cpu(), want)
