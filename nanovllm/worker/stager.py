"""The one stager: a step's host arrays -> device tensors in one host-to-device copy, for
prefill, eager decode and CUDA-graph decode alike. The copy is a kernel reading the pinned
buffer (kernels/host_copy.py), not the copy engine.

Every part is written into one int32 staging buffer at a 16-byte aligned offset (Triton
specialises kernels on pointer alignment, so unaligned slices would trigger recompiles
mid-run), copied over at once, and viewed back on the device with its own dtype and shape.
On a GPU the staging buffers are pinned and two take turns: with async scheduling the next
step is staged while this one's copy may still be queued. A buffer is written again only
after an event says its last copy ran: callers that stage steps back to back without reading
results (the draft model's passes, teacher-forced tools) would otherwise let a queued copy
read the step after next (seen: SmolLM2 fp32 decode through the layer kernel, H200).
"""
import numpy as np
import torch

from nanovllm.kernels.host_copy import copy_words
from nanovllm.utils import compile_ahead

# Words of room after the decode graphs' inputs for the rest of a graph step's parts
# (sampling, penalty and logprob rows); a step that needs more sends those in a second copy.
TAIL_WORDS = 1 << 16


def step_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst[:n] = src between pinned host memory and the device: by a kernel (no copy engine in
    the step's stream), or by cudaMemcpyAsync inside compile_ahead, whose passes skip Triton
    launches but still need their inputs (and by torch when neither side is on a GPU)."""
    if compile_ahead.active() or not (dst.is_cuda or src.is_cuda):
        dst[:src.numel()].copy_(src, non_blocking=True)
    else:
        copy_words(dst, src)


def layout(sizes: list[int]) -> tuple[list[int], int]:
    """Bytes of each part -> its offset in int32 words (16-byte aligned), and the words in
    all."""
    offsets, total = [], 0
    for nbytes in sizes:
        offsets.append(total)
        total += -(-nbytes // 16) * 4
    return offsets, total


class Stager:
    """Owns the staging buffers of one rank, and the device buffer the decode graphs read."""

    def __init__(self, device: torch.device, graph_parts: list[tuple[int, ...]] | None = None):
        self.device = device
        self.pinned = device.type == "cuda"
        self.hosts: list[torch.Tensor | None] = [None, None]
        self.host_arrays: list[np.ndarray | None] = [None, None]  # their numpy views
        self._fixed_views: dict[tuple, dict[str, torch.Tensor]] = {}
        self.turn = 0
        # Per staging buffer: an event recorded after its latest copy (None: never copied).
        self.copied: list[torch.cuda.Event | None] = [None, None]
        self.fixed = None
        self.fixed_words = 0
        if graph_parts:
            # The graphs captured views of this buffer's head: graph steps stage in place.
            offsets, self.fixed_words = layout([4 * int(np.prod(s)) for s in graph_parts])
            self.fixed = torch.zeros(self.fixed_words + TAIL_WORDS, dtype=torch.int32,
                                     device=device)
            self.graph_views = [self.fixed[o: o + int(np.prod(s))].view(s)
                                for o, s in zip(offsets, graph_parts)]
            if self.pinned:  # graph steps never grow them
                self.hosts = [torch.empty(self.fixed.numel(), dtype=torch.int32,
                                          pin_memory=True) for _ in range(2)]
                self.host_arrays = [h.numpy() for h in self.hosts]

    def upload(self, parts: dict[str, np.ndarray], graph: bool = False) -> dict[str, torch.Tensor]:
        """Device tensors of `parts` (same names, dtypes and shapes) after one copy; with
        graph=True the leading parts land where the decode graphs read them. The returned
        dict may be one returned before (a graph step's views into the fixed buffer are the
        same from step to step): callers write into its tensors, never into the dict."""
        arrays = list(parts.values())
        offsets, total = layout([a.nbytes for a in arrays])
        host_t, host = self._host(total)
        for a, o in zip(arrays, offsets):
            flat = np.ascontiguousarray(a).reshape(-1).view(np.int32)
            host[o: o + flat.size] = flat
        src = host_t[:total]
        head = self.fixed_words if graph else 0
        if not graph:
            tail = self._to_device(src)
        elif total <= self.fixed.numel():
            step_copy(self.fixed, src)
            self._copied()
            # Every part lies in the fixed buffer: the views of the last step of this
            # layout serve again (a view costs ~2 us of host time, a batch-1 step ~5 of them).
            key = tuple((name, a.dtype, a.shape) for name, a in parts.items())
            out = self._fixed_views.get(key)
            if out is None:
                if len(self._fixed_views) >= 4096:  # layouts vary with the batch: bounded
                    self._fixed_views.clear()
                out = self._fixed_views[key] = self._views(parts, offsets, self.fixed, 0)
            return out
        else:  # rare: a long penalty history outgrows the room after the graph inputs
            step_copy(self.fixed, src[:head])
            tail = self._to_device(src[head:])  # (records after both copies)
        return self._views(parts, offsets, tail, head)

    def _views(self, parts: dict[str, np.ndarray], offsets: list[int], tail: torch.Tensor,
               head: int) -> dict[str, torch.Tensor]:
        """Each part as a view of the fixed buffer (offsets below head) or of tail."""
        out = {}
        for (name, a), o in zip(parts.items(), offsets):
            base, start = (self.fixed, o) if o < head else (tail, o - head)
            out[name] = base[start: start + a.nbytes // 4].view(_TORCH[a.dtype]).view(a.shape)
        return out

    def _to_device(self, src: torch.Tensor) -> torch.Tensor:
        """A device copy of staged words: by a kernel from pinned memory (kernels/host_copy.py:
        no copy engine in the step's stream); on a CPU the words themselves."""
        if not self.pinned:
            return src.to(self.device)
        out = torch.empty(src.numel(), dtype=torch.int32, device=self.device)
        step_copy(out, src)
        self._copied()
        return out

    def _copied(self) -> None:
        """Record that the staging buffer just used (turn flipped since) has its copy queued:
        _host waits for this before writing into it again."""
        if not self.pinned:
            return
        used = self.turn ^ 1
        if self.copied[used] is None:
            self.copied[used] = torch.cuda.Event()
        self.copied[used].record()

    def _host(self, words: int) -> torch.Tensor:
        """A staging buffer of at least `words` int32 words and its numpy view: on a GPU the
        pinned one whose turn it is (grown when too small); on a CPU a fresh one, since the
        "device" tensors are views of it and may outlive the step."""
        if not self.pinned:
            host = torch.empty(words, dtype=torch.int32)
            return host, host.numpy()
        host = self.hosts[self.turn]
        if self.copied[self.turn] is not None:
            # Normally long done (its step is two back); not when steps are staged back to
            # back without a wait for results, where the copy may still be queued.
            self.copied[self.turn].synchronize()
        if host is None or host.numel() < words:
            # (The replaced buffer's last copy ran: waited for above.)
            host = torch.empty(max(words, 2 * (0 if host is None else host.numel())),
                               dtype=torch.int32, pin_memory=True)
            self.hosts[self.turn] = host
            self.host_arrays[self.turn] = host.numpy()
        array = self.host_arrays[self.turn]
        self.turn ^= 1
        return host, array


_TORCH = {np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
          np.dtype(np.float32): torch.float32}
