"""Piecewise CUDA graphs for prefill and mixed steps: the forward without its attention is
captured once per bucketed token count and replayed; each layer's attention (shapes and
metadata that change every step) runs eagerly between two pieces. vLLM's piecewise graphs,
cut at Attention.forward instead of through torch.compile.

Why: an eager forward of Qwen3-0.6B costs ~17-22 ms of host time at any prompt size (H100,
docs/PERF_NOTES.md, twelfth session), twice a graphed 256-sequence decode step, so prefill
and mixed steps were host-bound. A replay leaves the host ~28 attention calls and ~30 graph
launches.

How a capture cuts: while a bucket is captured, Attention.forward hands its arguments to
`_Pieces.cut` (utils/context.attention_cut). The cut copies the q/k/v projections into a
static buffer inside the current piece, ends that piece's graph, starts the next one and
returns a static output buffer that the next piece reads (o_proj). On replay, after piece i
the layer's real attention runs on views of that buffer (same shapes and strides as in the
eager forward, so the same compiled kernels) and its result is copied into the output
buffer. Padding rows (bucket - real tokens) are computed by the pieces and never attended.
Every bucket shares one memory pool and the two static buffers.
"""
import torch

from nanovllm.config import OFFLINE_PREFILL_GRAPH_TOKENS, STREAMING_PREFILL_GRAPH_TOKENS
from nanovllm.utils.context import set_attention_cut


def prefill_graph_tokens(config) -> int:
    """Config.prefill_graph_tokens resolved (None here: the streaming reach with mixed steps,
    else the offline one; the streaming front ends set it first), and never past the step
    budget, which no step exceeds."""
    tokens = config.prefill_graph_tokens
    if tokens is None:
        tokens = (STREAMING_PREFILL_GRAPH_TOKENS if config.enable_mixed_steps
                  else OFFLINE_PREFILL_GRAPH_TOKENS)
    return min(tokens, config.max_num_batched_tokens)


def bucket_sizes(max_tokens: int) -> list[int]:
    """Token counts to capture: 64, 128, 256, 512, then steps of 512 up to max_tokens."""
    sizes = [t for t in (64, 128, 256) if t < max_tokens]
    t = 512
    while t < max_tokens:
        sizes.append(t)
        t += 512
    return sizes + [max_tokens]


class _Cut:
    """One layer's attention between two pieces: its module, the static views it reads and
    the static output the next piece reads."""

    def __init__(self, attn, q, k, v, positions, extra, out):
        self.attn, self.q, self.k, self.v, self.positions = attn, q, k, v, positions
        self.extra, self.out = extra, out

    def run(self, n: int) -> None:
        """Attention over the first n rows (the real tokens), into the static output."""
        o = self.attn.attend(self.q[:n], self.k[:n], self.v[:n], self.positions[:n],
                             *self.extra)
        self.out[:n].copy_(o.reshape(n, *self.out.shape[1:]))


class _Pieces:
    """The graphs and cuts of one bucket, made by capturing one forward."""

    def __init__(self, owner: "PiecewiseGraphs"):
        self.owner = owner
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.cuts: list[_Cut] = []
        self.output = None

    def begin(self) -> None:
        """Start capturing the next piece (into the shared pool)."""
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=self.owner.pool)
        self.graphs.append(graph)

    def cut(self, attn, q, k, v, positions, *extra):
        """Attention.forward while capturing: end the piece here (see the module doc)."""
        views = self.owner.stage_inputs((q, k, v))
        self.graphs[-1].capture_end()
        out = self.owner.output_buffer(q)
        self.cuts.append(_Cut(attn, *views, positions, extra, out))
        self.begin()
        return out

    def replay(self, n: int) -> None:
        """The forward of n real tokens: each piece, then its layer's attention."""
        for graph, cut in zip(self.graphs, self.cuts):
            graph.replay()
            cut.run(n)
        self.graphs[-1].replay()


class PiecewiseGraphs:
    """Piecewise graphs of the model's forward for bucketed token counts up to max_tokens,
    reading token ids and positions from their own static buffers."""

    def __init__(self, model, max_tokens: int, device: torch.device):
        self.model = model
        self.sizes = bucket_sizes(max_tokens)
        self.max_tokens = self.sizes[-1]
        self.ids = torch.zeros(self.max_tokens, dtype=torch.int32, device=device)
        self.positions = torch.zeros(self.max_tokens, dtype=torch.int32, device=device)
        self.pool = torch.cuda.graph_pool_handle()
        # Flat static buffers shared by every layer and bucket (one layer runs at a time),
        # made at the first (largest) capture.
        self._inputs = self._outputs = None
        self.buckets: dict[int, _Pieces] = {}
        self._capture()

    def stage_inputs(self, tensors) -> list[torch.Tensor]:
        """Copy the storage spans the tensors view (the packed q/k/v projection: one span)
        into the static input buffer, inside the capture, and return the same views (shape,
        strides, relative offset) of the copy. Spans are found through the storage, not
        `_base`, which tensors made under inference_mode do not keep."""
        spans: dict[int, list] = {}  # storage address -> [first, end, a tensor on it]
        for t in tensors:
            first = t.storage_offset()
            end = first + 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
            span = spans.setdefault(t.untyped_storage().data_ptr(), [first, end, t])
            span[0], span[1] = min(span[0], first), max(span[1], end)
        total = sum(end - first for first, end, _ in spans.values())
        if self._inputs is None:  # the largest bucket comes first
            t = tensors[0]
            self._inputs = torch.empty(total, dtype=t.dtype, device=t.device)
        assert total <= self._inputs.numel(), (total, self._inputs.numel())
        at, starts = 0, {}
        for key, (first, end, t) in spans.items():
            assert t.dtype == self._inputs.dtype
            self._inputs[at:end - first + at].copy_(t.as_strided((end - first,), (1,), first))
            starts[key] = at - first
            at += end - first
        return [self._inputs.as_strided(t.shape, t.stride(),
                                        starts[t.untyped_storage().data_ptr()]
                                        + t.storage_offset())
                for t in tensors]

    def output_buffer(self, q: torch.Tensor) -> torch.Tensor:
        """The static attention output (shape of q) the next piece reads."""
        if self._outputs is None:
            self._outputs = torch.empty(q.numel(), dtype=q.dtype, device=q.device)
        return self._outputs[:q.numel()].view(q.shape)

    @torch.inference_mode()
    def _capture(self) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        for size in reversed(self.sizes):
            ids, pos = self.ids[:size], self.positions[:size]
            # Warm-up with attention skipped: compiles and sizes every other kernel at this
            # token count (and the skinny GEMM's workspace) before a capture may not.
            set_attention_cut(lambda attn, q, *args: torch.zeros_like(q))
            try:
                self.model(ids, pos)
            finally:
                set_attention_cut(None)
            torch.cuda.synchronize()
            pieces = _Pieces(self)
            with torch.cuda.stream(stream):
                set_attention_cut(pieces.cut)
                try:
                    pieces.begin()
                    pieces.output = self.model(ids, pos)
                    pieces.graphs[-1].capture_end()
                except BaseException:
                    # End the failed capture first: destroying a graph that is still
                    # capturing only adds errors to the one that matters.
                    try:
                        pieces.graphs[-1].capture_end()
                    except Exception:  # noqa: BLE001 - the original error is raised below
                        pass
                    raise
                finally:
                    set_attention_cut(None)
            torch.cuda.current_stream().wait_stream(stream)
            self.buckets[size] = pieces
        torch.cuda.synchronize()

    def can_run(self, num_tokens: int) -> bool:
        """Whether a step of num_tokens fits a captured bucket (and the graphs are alive)."""
        return bool(self.buckets) and num_tokens <= self.max_tokens

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The forward of these tokens (the step's context already set): returns the hidden
        states of its rows."""
        n = input_ids.numel()
        size = next(s for s in self.sizes if s >= n)
        self.ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        pieces = self.buckets[size]
        pieces.replay(n)
        return pieces.output[:n]

    def release(self) -> None:
        """Destroy the graphs (see DecodeGraphs.release)."""
        for pieces in self.buckets.values():
            for graph in pieces.graphs:
                graph.reset()
            pieces.owner = None  # (the cycle through the buckets)
        self.buckets.clear()
        self._inputs = self._outputs = None
