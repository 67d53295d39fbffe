"""What a launched step hands back: its sampled ids and, when some sequence asks for them,
its logprobs, computed on the device and brought to the host with the ids (the same event;
no per-token host syncs). A step where nobody asks does no logprob work at all."""
import numpy as np
import torch

from nanovllm.engine.logprobs import StepLogprobs
from nanovllm.engine.sequence import Sequence
from nanovllm.layers.logprobs import pack_logprobs, raw_logprobs

# Prompt positions per LM-head pass for prompt logprobs: bounds the [rows, vocab] float32
# temporaries (a 16k-token chunk at once would take ~10 GB with Qwen3's 152k vocabulary).
PROMPT_ROWS_PER_PASS = 256


class LogprobsStep:
    """Rank 0's logprob work in one step: which rows want logprobs, their device results,
    and the packed copy on its way to the host."""

    def __init__(self, num_seqs: int, sample: list[tuple[int, int]],
                 prompt: list[tuple[int, int, int]], targets: list[int], prompt_rows, upload):
        # (row of the step's sampled ids, k) and (sequence's row, prompt positions, k).
        self.num_seqs, self.sample, self.prompt = num_seqs, sample, prompt
        self.k = max(e[-1] for e in sample + prompt)
        # The step's host-to-device uploads, in one copy: sampled rows (unless all of them),
        # then the prompt positions' rows and tokens.
        some = 0 < len(sample) < num_seqs
        parts = [np.array([i for i, _ in sample], np.int32)] if some else []
        if prompt:
            parts += [prompt_rows, np.array(targets, np.int32)]
        dev = upload(*parts) if parts else []
        self.rows = dev[0] if some else None
        self.prompt_rows, self.targets = (dev[-2], dev[-1]) if prompt else (None, None)
        self.raw = None
        self.packed: list[torch.Tensor] = []
        self.host = None

    @classmethod
    def plan(cls, seqs: list[Sequence], is_prefill: bool, prompt_rows,
             upload) -> "LogprobsStep | None":
        """The step's logprob work, or None when no sequence asks (the common case: free)."""
        if prompt_rows is None and all(s.logprobs is None for s in seqs):
            return None
        sample, prompt, targets = [], [], []
        for i, s in enumerate(seqs):
            # A prefill chunk that stops short of the prompt's end samples nothing real.
            if s.logprobs is not None and (
                    not is_prefill or s.num_cached_tokens + s.num_scheduled_tokens >= len(s)):
                sample.append((i, s.sampling_params.logprobs))
            first, count = s.prompt_logit_rows() if is_prefill else (0, 0)
            if count:
                start = s.num_cached_tokens + first + 1  # position p's logits predict p + 1
                targets += s.token_ids[start: start + count]
                prompt.append((i, count, s.sampling_params.prompt_logprobs))
        if not sample and not prompt:
            return None
        return cls(len(seqs), sample, prompt, targets, prompt_rows, upload)

    def add_prompt(self, logits: torch.Tensor, first: int) -> None:
        """Pack the logprobs of prompt positions first.. from their logits."""
        targets = self.targets[first: first + logits.size(0)]
        self.packed.append(pack_logprobs(raw_logprobs(logits), targets, self.k))

    def take_raw(self, logits: torch.Tensor) -> None:
        """Keep the sampled rows' raw logprobs: called before anything changes the logits."""
        if self.sample:
            self.raw = raw_logprobs(logits if self.rows is None else logits[self.rows])

    def finish(self, sampled: torch.Tensor, pinned: bool) -> None:
        """Pack the sampled tokens' logprobs and start the copy to the host (non-blocking
        with pinned memory: the caller's event covers it)."""
        if self.raw is not None:
            chosen = sampled if self.rows is None else sampled[self.rows]
            self.packed.insert(0, pack_logprobs(self.raw, chosen, self.k))
            self.raw = None
        packed = torch.cat(self.packed) if len(self.packed) > 1 else self.packed[0]
        self.packed = []
        if not pinned:
            self.host = packed.cpu()
            return
        self.host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        self.host.copy_(packed, non_blocking=True)

    def unpack(self) -> StepLogprobs:
        """The host copy (which must have arrived) as plain Python entries per sequence."""
        data = self.host.numpy()
        ints = data.view(np.int32)
        k = self.k
        own, ranks = data[:, 0].tolist(), ints[:, 1].tolist()
        top_lp, top_id = data[:, 2: 2 + k].tolist(), ints[:, 2 + k:].tolist()
        sample, prompt = [None] * self.num_seqs, [None] * self.num_seqs
        for r, (i, kk) in enumerate(self.sample):
            sample[i] = (own[r], ranks[r], top_id[r][:kk], top_lp[r][:kk])
        r = len(self.sample)
        for i, count, kk in self.prompt:
            prompt[i] = [(own[q], ranks[q], top_id[q][:kk], top_lp[q][:kk])
                         for q in range(r, r + count)]
            r += count
        self.host = None
        return StepLogprobs(sample, prompt)


def prompt_pass(model, hidden: torch.Tensor, prompt_rows: np.ndarray,
                lp: LogprobsStep | None, upload) -> None:
    """Logits of the prompt-logprob rows, a slice at a time, on every rank (the LM head
    gathers across ranks, so all take the same slices); rank 0 (lp) packs their logprobs."""
    rows = upload(prompt_rows)[0] if lp is None else lp.prompt_rows
    for first in range(0, rows.numel(), PROMPT_ROWS_PER_PASS):
        logits = model.compute_all_logits(hidden[rows[first: first + PROMPT_ROWS_PER_PASS]])
        if lp is not None:
            lp.add_prompt(logits, first)


class StepResult:
    """A launched step's sampled ids, and logprobs when asked for: ready now, or once the
    device gets there (one event covers both copies)."""

    def __init__(self, ids, done=None, logprobs: LogprobsStep | None = None):
        self._ids, self._done, self._lp = ids, done, logprobs
        self.logprobs: StepLogprobs | None = None  # set by result()

    def result(self) -> list[int] | None:
        """The ids (None on ranks other than 0), waiting for the device if needed; then
        .logprobs holds the step's logprobs (None when no sequence asked)."""
        if self._done is not None:
            self._done.synchronize()
            self._ids, self._done = self._ids.tolist(), None
        if self._lp is not None:
            self.logprobs, self._lp = self._lp.unpack(), None
        return self._ids
