"""StepInputs: the arrays of one step, in numpy (no torch), as StepBuilder (step_inputs.py)
builds them and the device side uploads them (`device_parts()`, one host-to-device copy)."""
from dataclasses import dataclass

import numpy as np

from nanovllm.engine.sampling_rows import LogprobPlan, PenaltyRows, SamplingRows

# Rows of StepInputs.decode_meta, in order; the decode graphs read them at fixed places.
# The last: the rows' temperatures (float32 bits; 0 where none), which a decode graph that
# samples reads (worker/cuda_graph.py).
DECODE_META_ROWS = 7  # ids, positions, slots, context lens, order, feed rows, temperatures


@dataclass
class StepInputs:
    """Everything the model, the attention context and the sampler need for one step."""

    is_prefill: bool
    num_seqs: int
    input_ids: np.ndarray        # [tokens] (decode: [rows], padding rows hold 0)
    positions: np.ndarray        # [tokens]
    slot_mapping: np.ndarray     # [tokens] cache slot each new K/V goes to; -1 = nowhere
    block_tables: np.ndarray     # [rows, width] physical block ids, 0-padded
    context_lens: np.ndarray | None = None  # decode: [rows] tokens attended, 0 = padding row
    # decode: [rows] the real rows by context length, longest first, then the padding rows:
    # the order the decode kernel may start their programs in (see triton_decode's LPT).
    order: np.ndarray | None = None
    cu_seqlens_q: np.ndarray | None = None  # prefill: [num_seqs + 1]
    cu_seqlens_k: np.ndarray | None = None  # prefill: [num_seqs + 1]
    # prefill: of the rows after the decode rows (the prefill part; block_tables too)
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    has_cached_context: bool = False  # prefill: some sequence attends to cached tokens
    # prefill: leading sequences computing just their last token (a mixed step's decodes),
    # with their context lens and kernel order ([2, rows rounded up to 4]) and their
    # block-table rows.
    num_decode_rows: int = 0
    decode_rows: np.ndarray | None = None
    decode_tables: np.ndarray | None = None
    # async scheduling: [rows] (prefill: [num_decode_rows]) row of the previous step's
    # sampled ids holding this row's input token (still on the device), -1 where input_ids
    # has it; None = none.
    feed_rows: np.ndarray | None = None
    # prefill: rows (of the step's tokens) whose logits give prompt logprobs; None = none.
    prompt_rows: np.ndarray | None = None
    # decode: real rows (num_seqs, or more when a verify step gives a sequence one row per
    # token it computes: its last token, then its drafts).
    num_rows: int = 0
    # verify steps: [rows] the draft each row's logits judge (-1: none, a sequence's last
    # row), and [num_seqs + 1] each sequence's first row. None in other steps.
    spec_drafts: np.ndarray | None = None
    spec_starts: np.ndarray | None = None
    # Rank 0 (the rank that samples) only; None elsewhere, and for penalties and logprobs
    # also when no sequence uses them.
    sampling: SamplingRows | None = None
    penalties: PenaltyRows | None = None
    logprobs: LogprobPlan | None = None
    # Structured output (see sampling_rows.grammar_bitmask): [rows, words] int32, the tokens
    # each row's grammar allows, and [rows] int32, 1 on the constrained rows; None when no
    # sequence has a grammar, or when the step's masks come late (StepBuilder.build).
    grammar_bitmask: np.ndarray | None = None
    grammar_rows: np.ndarray | None = None
    # decode_inputs' steps: [DECODE_META_ROWS, rows], whose rows input_ids .. feed rows are
    # views of (decode_meta fills the temperatures' row and returns it, no copy); None for
    # steps built otherwise.
    meta: np.ndarray | None = None

    @property
    def decode_meta(self) -> np.ndarray:
        """[DECODE_META_ROWS, rows]: ids, positions, slots, context lens, order, feed rows
        (-1: none), temperatures (float32 bits; 0 past the sampled rows and off rank 0)."""
        if self.meta is not None:
            temps = self.meta[6].view(np.float32)
        else:
            temps = np.zeros(len(self.input_ids), np.float32)
        if self.sampling is not None:
            t = self.sampling.temperatures[:len(temps)]
            temps[:len(t)] = t
        if self.meta is not None:
            return self.meta
        feed = np.full_like(self.input_ids, -1) if self.feed_rows is None else self.feed_rows
        return np.stack([self.input_ids, self.positions, self.slot_mapping, self.context_lens,
                         self.order, feed, temps.view(np.int32)])

    def device_parts(self) -> dict[str, np.ndarray]:
        """The arrays the device needs, by name, in upload order: a decode step's meta and
        block table come first (the decode graphs read them at fixed places)."""
        if self.is_prefill:
            parts = dict(input_ids=self.input_ids, positions=self.positions,
                         slot_mapping=self.slot_mapping, cu_seqlens_q=self.cu_seqlens_q,
                         cu_seqlens_k=self.cu_seqlens_k, block_tables=self.block_tables)
            optional = dict(prompt_rows=self.prompt_rows, decode_rows=self.decode_rows,
                            decode_tables=self.decode_tables, feed_rows=self.feed_rows)
            parts.update((k, v) for k, v in optional.items() if v is not None)
        else:
            parts = dict(decode_meta=self.decode_meta, block_tables=self.block_tables)
            if self.spec_drafts is not None:
                parts["spec_drafts"] = self.spec_drafts
        sr, pr, lp = self.sampling, self.penalties, self.logprobs
        if sr is not None:
            optional = dict(temperatures=sr.temperatures, top_ks=sr.top_ks, top_ps=sr.top_ps,
                            min_ps=sr.min_ps)
            parts.update((k, v) for k, v in optional.items() if v is not None)
        if pr is not None:
            parts.update(penalty_ids=pr.ids, penalty_settings=pr.settings)
        if lp is not None:
            optional = dict(logprob_rows=lp.sample_rows, logprob_targets=lp.targets)
            parts.update((k, v) for k, v in optional.items() if v is not None)
        if self.grammar_bitmask is not None:
            parts.update(grammar_bitmask=self.grammar_bitmask, grammar_rows=self.grammar_rows)
        return parts
