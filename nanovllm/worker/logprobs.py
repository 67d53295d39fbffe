"""Log probabilities on the device: the chosen token's logprob and rank plus the top-k, packed
into one float32 tensor (ids as int32 bits) so that they reach the host in one copy. A step
where nobody asks does no logprob work at all (the host builder plans none)."""
import numpy as np
import torch

from nanovllm.engine.logprobs import StepLogprobs
from nanovllm.engine.sampling_rows import LogprobPlan

# Prompt positions per LM-head pass for prompt logprobs: bounds the [rows, vocab] float32
# temporaries (a 16k-token chunk at once would take ~10 GB with Qwen3's 152k vocabulary).
PROMPT_ROWS_PER_PASS = 256


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """float32 log_softmax of logits as the model produced them: vLLM's default logprobs, of
    the raw distribution (before temperature, top-k/top-p/min-p and penalties)."""
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32)


def pack_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor, k: int) -> torch.Tensor:
    """[rows, 2 + 2k]: the chosen token's logprob, its rank (int32 bits), the top-k logprobs,
    then the top-k ids (int32 bits); logprobs is [rows, vocab], chosen [rows] token ids."""
    out = torch.empty(logprobs.size(0), 2 + 2 * k, dtype=torch.float32, device=logprobs.device)
    ints = out.view(torch.int32)
    own = logprobs.gather(1, chosen.long().unsqueeze(1))
    out[:, 0] = own.squeeze(1)
    # vLLM's rank: how many tokens are at least as likely (itself included), so a token tied
    # with others ranks last among them.
    ints[:, 1] = (logprobs >= own).sum(-1)
    if k:
        top = logprobs.topk(k, dim=-1)
        out[:, 2: 2 + k] = top.values
        ints[:, 2 + k:] = top.indices
    return out


class LogprobsStep:
    """Rank 0's logprob work in one step: which rows want logprobs, their device results,
    and the packed copy on its way to the host."""

    def __init__(self, plan: LogprobPlan, dev: dict[str, torch.Tensor]):
        # The plan's arrays are already on the device (`dev`, by name).
        self.num_seqs, self.sample, self.prompt, self.k = (plan.num_seqs, plan.sample,
                                                           plan.prompt, plan.k)
        self.rows = dev.get("logprob_rows")  # None: every row of the step samples
        self.targets = dev.get("logprob_targets")  # the prompt rows' next tokens
        self.raw = None
        self.packed: list[torch.Tensor] = []
        self.host = None

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


def prompt_pass(model, hidden: torch.Tensor, prompt_rows: torch.Tensor,
                lp: LogprobsStep | None) -> None:
    """Logits of the prompt-logprob rows, a slice at a time, on every rank (the LM head
    gathers across ranks, so all take the same slices); rank 0 (lp) packs their logprobs."""
    for first in range(0, prompt_rows.numel(), PROMPT_ROWS_PER_PASS):
        rows = prompt_rows[first: first + PROMPT_ROWS_PER_PASS]
        logits = model.compute_all_logits(hidden[rows])
        if lp is not None:
            lp.add_prompt(logits, first)
