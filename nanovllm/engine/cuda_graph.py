"""Decode CUDA graphs: captured once per batch size, replayed with inputs staged in place."""
import torch

from nanovllm.engine.step_inputs import StepInputs
from nanovllm.utils.context import reset_context, set_context


def graph_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_bs (and max_bs itself)."""
    sizes = [b for b in (1, 2, 4, 8) if b <= max_bs] + list(range(16, max_bs + 1, 16))
    if sizes[-1] < max_bs:
        sizes.append(max_bs)
    return sizes


class DecodeGraphs:
    """One graph per batch size, sharing a memory pool and one device input buffer."""

    def __init__(self, model, max_bs: int, width: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device):
        self.model = model
        self.batch_sizes = graph_batch_sizes(max_bs)
        self.max_bs, self.width = max_bs, width
        # One device buffer holds every graph input, so a step uploads with one copy; its
        # pinned host mirror is written in place.
        self.buf = torch.zeros((4 + width) * max_bs, dtype=torch.int32, device=device)
        self.meta = self.buf[: 4 * max_bs].view(4, max_bs)
        self.table = self.buf[4 * max_bs:].view(max_bs, width)
        self.host_t = torch.zeros(self.buf.numel(), dtype=torch.int32).pin_memory()
        self.host = self.host_t.numpy()
        self.outputs = torch.zeros(max_bs, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._capture()

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = None
        for bs in reversed(self.batch_sizes):
            set_context(is_prefill=False, slot_mapping=self.meta[2, :bs],
                        context_lens=self.meta[3, :bs], block_tables=self.table[:bs])
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

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Stage the decode inputs (padded to max_bs rows) and replay the smallest graph that
        holds them; returns the hidden states of the real rows."""
        n, rows = inputs.num_seqs, self.max_bs
        self.host[: 4 * rows] = inputs.decode_meta.ravel()
        self.host[4 * rows:] = inputs.block_tables.ravel()
        # Safe to reuse the pinned buffer: the previous step's copy finished before its
        # sampled ids came back to the host.
        self.buf.copy_(self.host_t, non_blocking=True)
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
