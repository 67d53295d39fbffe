"""The step copies' kernel (kernels/host_copy.py): pinned host <-> device words, exact
(interpreter on CPU, where both sides are host tensors; the real thing on a GPU)."""
import pytest
import torch

from nanovllm.kernels import host_copy
from nanovllm.kernels.host_copy import copy_words

CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("n", [1, 5, 1024, 2500])
def test_copy_words_both_ways(n):
    host = torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32)
    if CUDA:
        host = host.pin_memory()
    dev = torch.full((n + 3,), 7, dtype=torch.int32, device="cuda" if CUDA else "cpu")
    copy_words(dev, host)  # host -> device, into a longer buffer
    assert dev[:n].cpu().tolist() == host.tolist() and dev[n:].cpu().tolist() == [7] * 3
    back = torch.zeros(n + 1, dtype=torch.int32, pin_memory=CUDA)
    copy_words(back, dev[:n])  # device -> host
    if CUDA:
        torch.cuda.synchronize()
    assert back[:n].tolist() == host.tolist() and back[n] == 0


def test_float_words_and_the_memcpy_switch(monkeypatch):
    src = torch.randn(300, pin_memory=CUDA)  # a plain host tensor is not mapped on a GPU
    dst = torch.zeros(300, device="cuda" if CUDA else "cpu")
    copy_words(dst, src)
    assert torch.equal(dst.cpu(), src)
    monkeypatch.setattr(host_copy, "KERNEL", False)
    dst.zero_()
    copy_words(dst, src)
    assert torch.equal(dst.cpu(), src)


def test_rejects_other_widths():
    with pytest.raises(AssertionError):
        copy_words(torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_copy_in_stream_order():
    """A device write, the copy to the host, then an event: the host sees the write."""
    dev = torch.zeros(64, dtype=torch.int32, device="cuda")
    host = torch.zeros(64, dtype=torch.int32, pin_memory=True)
    for i in range(20):
        dev.fill_(i)
        copy_words(host, dev)
        done = torch.cuda.Event()
        done.record()
        done.synchronize()
        assert host.tolist() == [i] * 64


def test_step_copy_runs_inside_compile_ahead(monkeypatch):
    """compile_ahead's passes skip Triton launches; the step's inputs must still arrive."""
    from nanovllm.utils import compile_ahead
    from nanovllm.worker.stager import step_copy

    monkeypatch.setattr(compile_ahead._local, "on", True, raising=False)
    assert compile_ahead.active()
    monkeypatch.setattr(host_copy, "_copy_kernel", None)  # a launch would fail
    src, dst = torch.arange(10, dtype=torch.int32), torch.zeros(12, dtype=torch.int32)
    step_copy(dst, src)
    assert dst[:10].tolist() == list(range(10))
