"""The one stager: every part comes back with its dtype, shape and values, 16-byte aligned,
after one copy; graph steps land where the decode graphs read, even when the rest of the
step outgrows the room after them."""
import numpy as np
import pytest
import torch

from nanovllm.worker import stager as stager_module
from nanovllm.worker.stager import Stager, layout

CPU = torch.device("cpu")


def parts(rng: np.random.Generator, rows: int, width: int, extra: int) -> dict[str, np.ndarray]:
    return dict(decode_meta=rng.integers(-5, 99, (7, rows), dtype=np.int32),
                block_tables=rng.integers(0, 99, (rows, width), dtype=np.int32),
                temperatures=rng.random(rows - 1, dtype=np.float32),  # odd size: padding
                penalty_ids=rng.integers(0, 2**40, (3, extra), dtype=np.int64),
                penalty_settings=rng.random((3, 3), dtype=np.float32))


def assert_same(dev: dict[str, torch.Tensor], host: dict[str, np.ndarray]) -> None:
    assert list(dev) == list(host)
    for name, a in host.items():
        t = dev[name]
        assert t.dtype == getattr(torch, str(a.dtype)) and tuple(t.shape) == a.shape, name
        assert np.array_equal(t.cpu().numpy(), a), name
        assert t.data_ptr() % 16 == 0, name  # Triton specialises on pointer alignment


def test_layout_aligns_every_part_to_16_bytes():
    offsets, total = layout([12, 48, 20])
    assert offsets == [0, 4, 16] and total == 24


def test_parts_come_back_as_they_were():
    rng = np.random.default_rng(0)
    host = parts(rng, rows=8, width=5, extra=7)
    assert_same(Stager(CPU).upload(host), host)


@pytest.mark.parametrize("extra", [7, 40000], ids=["fits", "outgrows the room"])
def test_graph_steps_land_in_the_graph_buffer(monkeypatch, extra):
    monkeypatch.setattr(stager_module, "TAIL_WORDS", 1024)
    rows, width = 8, 5
    st = Stager(CPU, [(7, rows), (rows, width)])
    meta, table = st.graph_views
    host = parts(np.random.default_rng(1), rows, width, extra)
    dev = st.upload(host, graph=True)
    assert_same(dev, host)
    # The graphs read these very tensors: the step's meta and table are written into them.
    assert dev["decode_meta"].data_ptr() == meta.data_ptr()
    assert dev["block_tables"].data_ptr() == table.data_ptr()
    assert np.array_equal(meta.numpy(), host["decode_meta"])


def test_graph_steps_of_one_layout_reuse_their_views_and_carry_each_steps_values():
    st = Stager(CPU, [(7, 8), (8, 5)])
    rng = np.random.default_rng(3)
    first = parts(rng, 8, 5, 7)
    dev1 = st.upload(first, graph=True)
    second = parts(rng, 8, 5, 7)  # the same layout, other values
    dev2 = st.upload(second, graph=True)
    assert all(dev2[k] is dev1[k] for k in first)  # the views were kept...
    assert_same(dev2, second)  # ...and show the second step's values
    third = parts(rng, 8, 5, 9)  # another layout: views of its own
    assert_same(st.upload(third, graph=True), third)
    assert_same(st.upload(second, graph=True), second)


@pytest.mark.gpu
def test_pinned_buffers_take_turns_and_grow_on_a_gpu():
    """Steps through both pinned buffers (grown on the way), eager and into the graph
    buffer, arrive intact on the GPU."""
    st = Stager(torch.device("cuda"), [(7, 8), (8, 5)])
    rng = np.random.default_rng(2)
    for extra in (7, 5000, 70000, 3):
        for graph in (False, True):
            host = parts(rng, 8, 5, extra)
            assert_same(st.upload(host, graph=graph), host)
    assert min(h.numel() for h in st.hosts) >= 3 * 70000 * 2  # both grew past the graph room


@pytest.mark.gpu
def test_a_queued_copy_keeps_its_values_when_steps_are_staged_back_to_back():
    """Three steps staged while the GPU is still busy (no wait for results between them, as
    the draft model's passes and teacher-forced tools stage): the third waits for the first's
    copy before reusing its pinned buffer, so the first still arrives with its own values."""
    st = Stager(torch.device("cuda"))
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time ahead of the copies
    steps = [dict(decode_meta=np.full((7, 4), v, np.int32)) for v in (1, 2, 3)]
    dev = [st.upload(s) for s in steps]
    for d, s in zip(dev, steps):
        assert_same(d, s)
