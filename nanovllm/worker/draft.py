"""Draft-model proposals for speculative decoding, made on the device inside a verify step.

The draft model has its own ModelRunner and KV cache, with the target's block count and
block size, so every sequence's block table serves both caches. Pass 0 catches the draft's
cache up on the tokens it has not seen (usually the last one; the whole prompt the first
time) as decode rows, the last of which gives the first draft; passes 1..k-1 each decode the
previous draft. Drafts are the draft model's argmax: point masses, which the verification
(worker/verify.py) judges exactly, greedy or sampled. They go straight into the verify
step's staged inputs; the host never sees them (the accepted ones come back as tokens).
"""
import torch

from nanovllm.config import Config
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.step_inputs import (
    decode_inputs,
    prefill_inputs,
    verify_inputs,
)
from nanovllm.utils.context import reset_context
from nanovllm.worker.kv_cache import kv_bytes_per_block

# Catch-ups of more tokens than this run as a prefill (decode rows would each read the whole
# context: quadratic in a long prompt).
CATCH_UP_ROWS = 8


def draft_config(target: Config) -> Config:
    """The draft model's engine settings: the target's limits and block size, a plain
    cache (an fp8 one would need its own calibration), no tokenizer."""
    path = target.speculative_config.model
    config = Config(path, max_num_batched_tokens=target.max_num_batched_tokens,
                    max_num_seqs=target.max_num_seqs, max_model_len=target.max_model_len,
                    gpu_memory_utilization=target.gpu_memory_utilization,
                    enforce_eager=target.enforce_eager,
                    kvcache_block_size=target.kvcache_block_size, device=target.device,
                    dtype=target.dtype, attention_backend=target.attention_backend,
                    seed=target.seed, skip_tokenizer_init=True,
                    load_format="dummy" if target.load_format == "dummy" else "auto")
    if config.hf_config.vocab_size > target.hf_config.vocab_size:
        raise ValueError(
            f"speculative_config['model']={path!r} has vocab_size="
            f"{config.hf_config.vocab_size}, more than the target's "
            f"{target.hf_config.vocab_size}: the draft must share the target's tokenizer")
    return config


class DraftProposer:
    """Runs the draft model over a verify step's sequences and fills in their drafts."""

    def __init__(self, runner):
        """runner: the draft's ModelRunner (built with draft=True: its cache comes later)."""
        self.runner = runner
        self.vocab_size = runner.config.hf_config.vocab_size
        self.block_size = runner.config.kvcache_block_size
        self.bytes_per_block = kv_bytes_per_block(runner.attn_layers, self.block_size,
                                                  runner.kv_dtype)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], inputs, dev: dict[str, torch.Tensor]) -> None:
        """Make each sequence's drafts and write them where the verify step reads them: the
        input ids of its rows after the first, and the draft each row's logits judge."""
        counts = [len(s.spec_token_ids) for s in seqs]
        drafts = torch.zeros(len(seqs), max(counts), dtype=torch.int32,
                             device=dev["spec_drafts"].device)
        drafts[:, 0] = self._catch_up(seqs)
        for j in range(1, max(counts)):
            live = [i for i, c in enumerate(counts) if c > j]
            drafts[live, j] = self._step([seqs[i] for i in live], j, drafts[live, j - 1])
        reset_context()
        rows, src = [], []
        for i, (start, c) in enumerate(zip(inputs.spec_starts.tolist(), counts)):
            rows += range(start, start + c)
            src += range(i * drafts.size(1), i * drafts.size(1) + c)
        rows_t = torch.tensor(rows, device=drafts.device)
        values = drafts.view(-1)[torch.tensor(src, device=drafts.device)]
        dev["spec_drafts"][rows_t] = values
        dev["decode_meta"][0][rows_t + 1] = values  # row 0 of the decode meta: input ids

    def _catch_up(self, seqs: list[Sequence]) -> torch.Tensor:
        """Pass 0: the tokens the draft's cache lacks, then the argmax after each sequence's
        last token (its first draft). Usually one or two tokens a sequence: decode rows (in
        a graph); a whole prompt (the first time, or after a preemption or a prefix hit):
        a prefill."""
        top = self.vocab_size - 1
        # A target token past the draft's vocabulary (padding ids) is clamped: it only makes
        # the draft worse there, never the output.
        tokens = [[min(t, top) for t in s.token_ids[s.num_draft_cached: s.num_tokens]]
                  for s in seqs]
        if max(map(len, tokens)) > CATCH_UP_ROWS:
            return self._prefill(seqs, tokens)
        views = []
        for s, new in zip(seqs, tokens):
            view = _view(s, s.num_draft_cached + 1)
            view.last_token, view.spec_token_ids = new[0], new[1:]
            views.append(view)
        runner = self.runner
        rows = sum(map(len, tokens))
        # The block-table rows are rewritten: a sequence's blocks change wholesale when it is
        # preempted and admitted again, which the draft, never prefilling, cannot tell.
        staged = verify_inputs(views, self.block_size, _padded(runner, rows),
                               runner.builder.tables, refresh=True)
        hidden = self._run(staged, rows)
        last = torch.tensor((staged.spec_starts[1:] - 1).tolist(), device=hidden.device)
        return runner.model.compute_logits(hidden[last]).argmax(-1).to(torch.int32)

    def _prefill(self, seqs: list[Sequence], tokens: list[list[int]]) -> torch.Tensor:
        """Pass 0 as a chunked prefill over each sequence's missing tokens."""
        runner = self.runner
        views = []
        for s, new in zip(seqs, tokens):
            view = _view(s, s.num_tokens)
            view.token_ids = [0] * s.num_draft_cached + new  # positions index it
            view.num_cached_tokens, view.num_scheduled_tokens = s.num_draft_cached, len(new)
            view.last_token = new[-1]
            views.append(view)
        staged = prefill_inputs(views, self.block_size, runner.max_blocks_per_seq,
                                runner.builder.tables)
        hidden = runner.forward(staged, runner.stager.upload(staged.device_parts()))
        return runner.model.compute_logits(hidden).argmax(-1).to(torch.int32)

    def _step(self, seqs: list[Sequence], j: int, tokens: torch.Tensor) -> torch.Tensor:
        """Pass j: each sequence's draft j - 1 in, its argmax (draft j) out."""
        runner = self.runner
        views = [_view(s, s.num_tokens + j) for s in seqs]
        staged = decode_inputs(views, self.block_size, runner.max_blocks_per_seq,
                               _padded(runner, len(views)), tables=runner.builder.tables)
        hidden = self._run(staged, len(views), tokens)
        return runner.model.compute_logits(hidden).argmax(-1).to(torch.int32)

    def _run(self, staged, rows: int, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """The draft model over decode rows (in a graph when one holds them); `tokens`
        replace the rows' input ids on the device."""
        runner = self.runner
        graphed = runner.graphs is not None and runner.graphs.can_run(rows)
        dev = runner.stager.upload(staged.device_parts(), graph=graphed)
        if tokens is not None:
            dev["decode_meta"][0][:rows] = tokens
        return runner.forward(staged, dev, graphed)


def _view(seq: Sequence, num_tokens: int) -> Sequence:
    """A stand-in for seq as the draft sees it with num_tokens tokens (its last computed
    now): its block table, no sampling settings."""
    view = Sequence.__new__(Sequence)
    view.seq_id, view.block_table, view.block_size = seq.seq_id, seq.block_table, seq.block_size
    view.num_tokens = num_tokens
    view.num_cached_tokens, view.num_scheduled_tokens = num_tokens - 1, 1
    view.last_token, view.spec_token_ids, view.prompt_logits_next = 0, [], None
    return view


def _padded(runner, rows: int) -> int:
    """Rows to stage: a graph's full batch, else a multiple of 4 (aligned decode meta)."""
    if runner.graphs is not None and runner.graphs.can_run(rows):
        return runner.graphs.max_bs
    return -(-rows // 4) * 4

