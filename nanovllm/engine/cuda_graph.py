"""Decode CUDA graphs: captured once per batch size, replayed with inputs staged in place."""
import torch

from nanovllm.engine.step_inputs import StepInputs
from nanovllm.utils.context import reset_context, set_context


def graph_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, then steps of 32 to 256 and of 64 beyond (and max_bs itself).

    Each graph costs ~0.25 s of start-up. A batch runs in the smallest graph that holds it,
    and the padding rows are nearly free: the matmuls are bound by reading the weights at
    these sizes and padding rows attend to nothing. 19 sizes instead of 36 halve capture time.
    """
    steps = [1, 2, 4, 8, 16, 24, 32, 48, *range(64, 257, 32), *range(320, max(max_bs, 320) + 1, 64)]
    sizes = [b for b in steps if b < max_bs]
    return sizes + [max_bs]


class DecodeGraphs:
    """One graph per batch size, sharing a memory pool and one device input buffer."""

    def __init__(self, model, max_bs: int, width: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device):
        self.model = model
        self.batch_sizes = graph_batch_sizes(max_bs)
        self.max_bs, self.width = max_bs, width
        # One device buffer holds every graph input, so a step uploads with one copy: rows
        # ids, positions, slots, context lens, order, feed rows (read outside the graph),
        # then the block table. Two pinned host mirrors take turns: with async scheduling the
        # next step is staged while this one's copy may still be queued.
        self.buf = torch.zeros((6 + width) * max_bs, dtype=torch.int32, device=device)
        self.meta = self.buf[: 6 * max_bs].view(6, max_bs)
        self.meta[4] = torch.arange(max_bs, dtype=torch.int32, device=device)  # a permutation
        self.table = self.buf[6 * max_bs:].view(max_bs, width)
        self.hosts = [torch.zeros(self.buf.numel(), dtype=torch.int32).pin_memory()
                      for _ in range(2)]
        self.turn = 0
        self.outputs = torch.zeros(max_bs, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._capture()

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = None
        for bs in reversed(self.batch_sizes):
            set_context(is_prefill=False, slot_mapping=self.meta[2, :bs],
                        context_lens=self.meta[3, :bs], block_tables=self.table[:bs],
                        decode_order=self.meta[4, :bs])
            args = self.meta[0, :bs], self.meta[1, :bs]
            self.outputs[:bs] = self.model(*args)  # warm-up (compiles, autotunes)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                self.outputs[:bs] = self.model(*args)
            pool = pool or graph.pool()
            self.graphs[bs] = graph
            torch.cuda.synchronize()
        reset_context()

    def can_run(self, num_seqs: int) -> bool:
        """Whether a decode batch of num_seqs fits a captured graph (and graphs are alive)."""
        return bool(self.graphs) and num_seqs <= self.max_bs

    def run(self, inputs: StepInputs, sampled: torch.Tensor) -> torch.Tensor:
        """Stage the decode inputs (padded to max_bs rows), take pending input tokens from
        `sampled` (the previous step's ids), and replay the smallest graph that holds the
        batch; returns the hidden states of the real rows."""
        n, rows = inputs.num_seqs, self.max_bs
        host_t = self.hosts[self.turn]
        self.turn ^= 1
        host = host_t.numpy()
        host[: 5 * rows] = inputs.decode_meta.ravel()
        host[5 * rows: 6 * rows] = -1 if inputs.feed_rows is None else inputs.feed_rows
        host[6 * rows:] = inputs.block_tables.ravel()
        self.buf.copy_(host_t, non_blocking=True)
        if inputs.feed_rows is not None:
            feed_tokens(self.meta[0, :n], self.meta[5, :n], sampled)
        bs = next(b for b in self.batch_sizes if b >= n)
        # The graph baked in its own tensors; the context only serves code outside the graph.
        set_context(is_prefill=False, context_lens=self.meta[3, :bs])
        self.graphs[bs].replay()
        return self.outputs[:n]

    def release(self, device: torch.device) -> None:
        """Destroy the graphs: NCCL cannot tear down a communicator that a live graph has
        captured (pytorch/pytorch#115388), so this comes before leaving the group."""
        torch.cuda.synchronize(device)
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()


def feed_tokens(ids: torch.Tensor, feed_rows: torch.Tensor, sampled: torch.Tensor) -> None:
    """ids[i] = sampled[feed_rows[i]] where feed_rows[i] >= 0, on the device (no host sync)."""
    ids.copy_(torch.where(feed_rows >= 0, sampled[feed_rows.clamp(min=0)], ids))
