"""Decode CUDA graphs: captured once per batch size, replayed with inputs staged in place."""
import torch

from nanovllm.engine.step_inputs import DECODE_META_ROWS
from nanovllm.utils.compile_ahead import compile_ahead
from nanovllm.utils.context import reset_context, set_context
from nanovllm.worker.stager import Stager
from nanovllm.worker.step_context import feed_tokens

def graph_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, then steps of 32 to 256 and of 64 beyond (and max_bs itself).

    Each graph costs ~0.25 s of start-up. A batch runs in the smallest graph that holds it,
    and the padding rows are nearly free: the matmuls are bound by reading the weights at
    these sizes and padding rows attend to nothing. 19 sizes instead of 36 halve capture time.
    """
    steps = [1, 2, 4, 8, 16, 24, 32, 48, *range(64, 257, 32), *range(320, max(max_bs, 320) + 1, 64)]
    sizes = [b for b in steps if b < max_bs]
    return sizes + [max_bs]


def decode_graph_rows(config) -> int:
    """Rows of the largest decode graph: max_num_seqs (at most 512), or with speculative
    decoding a row per token its verify steps compute."""
    max_bs = min(config.max_num_seqs, 512)
    spec = config.speculative_config
    if spec is not None:
        seqs = min(spec.disable_by_batch_size, max_bs)
        max_bs = min(max(max_bs, seqs * (1 + spec.num_speculative_tokens)), 512)
    return max_bs


def staged_graphs(model, config, device: torch.device, dtype: torch.dtype,
                  sampled: torch.Tensor, blocks_per_seq: int,
                  draft: bool = False) -> "tuple[Stager, DecodeGraphs]":
    """Decode graphs and the stager whose fixed buffer they read their inputs from; not
    captured yet (their kernels compile in the kernel warm-up's parallel pass first).
    draft: a speculative draft model's, which takes argmaxes of hidden states, never a
    sample."""
    max_bs = decode_graph_rows(config)
    stager = Stager(device, [(DECODE_META_ROWS, max_bs), (max_bs, blocks_per_seq)])
    meta, table = stager.graph_views
    # One rank samples the whole step in a graph: with tensor parallelism the logits gather
    # across ranks, which stays outside.
    sample = config.tensor_parallel_size == 1 and not draft
    graphs = DecodeGraphs(model, max_bs, meta, table, config.hf_config.hidden_size, dtype,
                          sampled, sample=sample, capture=False)
    return stager, graphs


class DecodeGraphs:
    """One graph per batch size, sharing a memory pool and reading their inputs from one
    device buffer that the stager fills in place (worker/stager.py). Each takes the pending
    input tokens from `sampled` (the previous step's ids) first. With sample=True a plain
    batch's whole step (forward, LM head, temperature sample into `sampled`) also replays:
    at batch 1 as one graph; at larger sizes as the forward's graph, then a small "tail"
    graph of the LM head and the sampler over its hidden states. From the host, the LM head's
    launch waited behind the replay just queued (125-400 us a step on an H100), and a small
    model's large batches were host-bound: with whole sampling graphs at every size,
    Qwen2.5-0.5B's bench.py went from 49,584-53,865 to 55,582-55,796 tok/s and Qwen3-0.6B's
    from 20,322 to 20,652, for 1-2 s more start-up (19 more captures of the whole forward);
    a tail graph holds three kernels, so it captures in a moment."""

    def __init__(self, model, max_bs: int, meta: torch.Tensor, table: torch.Tensor,
                 hidden_size: int, dtype: torch.dtype, sampled: torch.Tensor,
                 sample: bool = False, capture: bool = True):
        self.model = model
        self.batch_sizes = graph_batch_sizes(max_bs)
        self.max_bs = max_bs
        # meta [DECODE_META_ROWS, max_bs]: ids, positions, slots, context lens, order, feed
        # rows, temperatures; table [max_bs, width]: the block table.
        self.meta, self.table, self.sampled = meta, table, sampled
        self.meta[4] = torch.arange(max_bs, dtype=torch.int32, device=meta.device)  # a permutation
        self.meta[5] = -1  # no pending tokens
        self.outputs = torch.zeros(max_bs, hidden_size, dtype=dtype, device=meta.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.sample_sizes = [b for b in self.batch_sizes if sample and b <= len(sampled)]
        self.sample_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # The sampling graphs' seed: read by the sampler, bumped by each replay.
        self.seed = torch.tensor([torch.initial_seed() & 0x7FFFFFFF], dtype=torch.int32,
                                 device=meta.device)
        self._compiled = False
        if capture:
            self.capture()

    def _set_batch(self, bs: int) -> tuple:
        """The decode context of a bs-row graph; returns the model's inputs."""
        set_context(is_prefill=False, slot_mapping=self.meta[2, :bs],
                    context_lens=self.meta[3, :bs], block_tables=self.table[:bs],
                    decode_order=self.meta[4, :bs])
        return self.meta[0, :bs], self.meta[1, :bs]

    def _step(self, bs: int, kind: str) -> None:
        """What a graph of bs rows runs. "forward": the pending tokens fed in and the model,
        its hidden states into self.outputs; "tail": the LM head over those and a sample into
        self.sampled; "whole": the forward and the tail without the hidden states' copy."""
        ids, pos = self._set_batch(bs)
        if kind == "tail":
            hidden = self.outputs[:bs]
        else:
            feed_tokens(ids, self.meta[5, :bs], self.sampled)
            hidden = self.model(ids, pos)
            if kind == "forward":
                self.outputs[:bs] = hidden
                return
        from nanovllm.kernels.triton_sample import sample_temperature

        logits = self.model.compute_logits(hidden)
        temps = self.meta[6, :bs].view(torch.float32)
        sample_temperature(logits, temps, self.seed, out=self.sampled[:bs])  # bumps the seed

    def _todo(self) -> list[tuple[int, str]]:
        """(batch size, kind) of every graph, largest first (the pool grows once)."""
        return ([(bs, "forward") for bs in reversed(self.batch_sizes)]
                + [(bs, "whole" if bs == 1 else "tail") for bs in reversed(self.sample_sizes)])

    @torch.inference_mode()
    def compile_steps(self, rows=None) -> None:
        """Every graph's step once (rows: only those of rows(bs) true), for its kernels'
        compiles: called inside a compile_ahead block (the kernel warm-up's, so these
        compile in parallel with the prefills')."""
        for bs, kind in self._todo():
            if rows is None or rows(bs):
                self._step(bs, kind)
        reset_context()
        self._compiled = True

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every graph (compiling their kernels ahead first unless compile_steps
        ran in an earlier compile_ahead block)."""
        if not self._compiled:
            with compile_ahead() as ahead:  # every graph's kernel variants, in parallel
                if ahead:
                    self.compile_steps()
        pool = None
        for bs, kind in self._todo():
            self._step(bs, kind)  # warm-up (compiles, autotunes)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                self._step(bs, kind)
            pool = pool or graph.pool()
            # Every graph's temporaries live only within its replay: the graphs replay one
            # at a time, and a tail reads only self.outputs (outside the pool).
            (self.graphs if kind == "forward" else self.sample_graphs)[bs] = graph
            torch.cuda.synchronize()
        self.sampled.zero_()  # the warm-ups sampled from zero inputs
        reset_context()

    def can_run(self, num_seqs: int) -> bool:
        """Whether a decode batch of num_seqs fits a captured graph (and graphs are alive)."""
        return bool(self.graphs) and num_seqs <= self.max_bs

    def run(self, num_seqs: int) -> torch.Tensor:
        """Replay the smallest graph that holds the batch (its inputs already staged in
        place, padded to max_bs rows); returns the hidden states of the real rows."""
        bs = next(b for b in self.batch_sizes if b >= num_seqs)
        # The graph baked in its own tensors; the context only serves code outside the graph.
        set_context(is_prefill=False, context_lens=self.meta[3, :bs])
        self.graphs[bs].replay()
        return self.outputs[:num_seqs]

    def can_sample(self, num_seqs: int) -> bool:
        """Whether a batch of num_seqs has a graph that samples too."""
        return bool(self.sample_graphs) and num_seqs <= self.sample_sizes[-1]

    def run_sampled(self, num_seqs: int) -> None:
        """Replay the smallest sampling step that holds the batch (batch 1's whole graph, or
        a forward graph and its tail): the step's ids land in sampled[:num_seqs] (a plain
        batch: temperatures only, no logprobs)."""
        bs = next(b for b in self.sample_sizes if b >= num_seqs)
        if bs > 1:
            self.graphs[bs].replay()
        self.sample_graphs[bs].replay()

    def release(self, device: torch.device) -> None:
        """Destroy the graphs: NCCL cannot tear down a communicator that a live graph has
        captured (pytorch/pytorch#115388), so this comes before leaving the group."""
        torch.cuda.synchronize(device)
        for graphs in (self.graphs, self.sample_graphs):
            for graph in graphs.values():
                graph.reset()
            graphs.clear()

