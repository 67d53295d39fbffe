"""Batched token sampling: penalties, min_tokens and grammar masks (structured output) on the
logits, then greedy, temperature, top-k, top-p, min-p, per-request seeds."""
from dataclasses import dataclass

import torch
from torch import nn

from nanovllm.engine.sampling_rows import SamplingRows
from nanovllm.worker.penalties import PenaltyTensors, apply_penalties


@dataclass
class SamplingTensors:
    """Per-row sampling settings of one batch, on the logits' device."""

    temperatures: torch.Tensor          # [B] float; 0 = greedy
    top_ks: torch.Tensor | None = None   # [B] int; vocab size = off
    top_ps: torch.Tensor | None = None   # [B] float; 1 = off
    min_ps: torch.Tensor | None = None   # [B] float; 0 = off
    seeds: list[tuple[int, int, int]] | None = None  # (row, seed, step) for seeded rows
    all_greedy: bool = False
    # Penalties and min_tokens: applied to the logits before sampling (see penalties.py);
    # None, the usual case, when no row uses them.
    penalties: PenaltyTensors | None = None
    # [B, words] int32: the tokens each row's grammar allows (bit set = allowed) over the
    # grammar's vocabulary, and [B] int32, 1 on the rows a grammar constrains (their logits
    # past that vocabulary, padding ids, are forbidden); None when no row has a grammar.
    bitmask: torch.Tensor | None = None
    grammar_rows: torch.Tensor | None = None

    @property
    def plain(self) -> bool:
        """Temperatures alone (0 = greedy): what the fused sampler and the decode graphs
        that sample compute, with no top-k/p, min-p, seeds, penalties or grammar."""
        return (self.top_ks is None and self.top_ps is None and self.min_ps is None
                and not self.seeds and self.penalties is None and self.bitmask is None)

    @classmethod
    def from_rows(cls, rows: SamplingRows, dev: dict[str, torch.Tensor],
                  penalties: PenaltyTensors | None = None) -> "SamplingTensors":
        """The host builder's SamplingRows, their arrays already uploaded (`dev`, by name:
        see StepInputs.device_parts)."""
        return cls(dev["temperatures"], dev.get("top_ks"), dev.get("top_ps"),
                   dev.get("min_ps"), rows.seeds, rows.all_greedy, penalties,
                   dev.get("grammar_bitmask"), dev.get("grammar_rows"))


class Sampler(nn.Module):
    """Turns last-position logits into token ids without any per-token Python loop."""

    def __init__(self):
        super().__init__()
        self.steps = 0  # varies the fused kernel's random stream from step to step

    def forward(self, logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        """[B, V] logits -> [B] token ids (the input logits are left as they were)."""
        logits = constrain(logits, st)
        if st.all_greedy:
            return logits.argmax(-1)
        plain = st.top_ks is None and st.top_ps is None and st.min_ps is None and not st.seeds
        if plain and logits.is_cuda:
            from nanovllm.kernels.triton_sample import sample_temperature

            self.steps += 1
            seed = (torch.initial_seed() + self.steps * 0x9E3779B1) & 0x7FFFFFFF
            return sample_temperature(logits, st.temperatures, seed)
        greedy = logits.argmax(-1)
        sampled = race(self.probs(logits, st), st)
        return torch.where(st.temperatures > 0, sampled, greedy)

    def probs(self, logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        """[B, V] float32 probabilities after temperature, top-k, top-p and min-p (rows
        with temperature 0 come out as temperature 1: the caller takes their argmax)."""
        logits = logits.float()
        temps = st.temperatures.unsqueeze(1)
        logits = logits / torch.where(temps > 0, temps, torch.ones_like(temps))
        if st.top_ks is not None or st.top_ps is not None:
            logits = self._top_k_top_p(logits, st.top_ks, st.top_ps)
        probs = torch.softmax(logits, -1)
        if st.min_ps is not None:
            keep = probs >= st.min_ps.unsqueeze(1) * probs.max(-1, keepdim=True).values
            probs = probs * keep
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    @staticmethod
    def _top_k_top_p(logits, top_ks, top_ps):
        sorted_logits, order = logits.sort(-1, descending=True)
        vocab = logits.size(-1)
        rank = torch.arange(vocab, device=logits.device).unsqueeze(0)
        drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
        if top_ks is not None:
            drop |= rank >= top_ks.unsqueeze(1)
        if top_ps is not None:
            probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), -1)
            # Drop a token when the mass before it already reaches top_p (the top one stays).
            before = probs.cumsum(-1) - probs
            drop |= before >= top_ps.unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def constrain(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """The logits with penalties and min_tokens applied and the tokens each row's grammar
    forbids at -inf; a new tensor when either applies (the input stays as it was)."""
    if st.penalties is not None:
        logits = apply_penalties(logits, st.penalties)  # a new tensor
    elif st.bitmask is not None:
        logits = logits.clone()
    if st.bitmask is not None:
        # Only a batch holding a grammar gets here, so xgrammar is installed; its kernel
        # unpacks the bits and masks every row in one call (CUDA, or its CPU path).
        from xgrammar import apply_token_bitmask_inplace

        covered = min(st.bitmask.size(1) * 32, logits.size(-1))
        apply_token_bitmask_inplace(logits, st.bitmask, vocab_size=covered)
        if covered < logits.size(-1):
            logits[:, covered:].masked_fill_(st.grammar_rows[:, None].bool(), float("-inf"))
    return logits


def seeded_generator(seed: int, step: int, device, salt: int = 0) -> torch.Generator:
    """The random stream of a seeded row at one of its steps (salt: a second stream)."""
    key = hash((seed, step) if not salt else (seed, step, salt)) & (2**63 - 1)
    return torch.Generator(device=device).manual_seed(key)


def race(probs: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """One token per row drawn from probs [B, V] (unnormalized is fine). Exponential race
    (Gumbel-max): argmax(p / E) with E ~ Exp(1) samples from p without a cumulative sum
    over the vocabulary; seeded rows draw their E from their own streams."""
    noise = torch.empty_like(probs).exponential_()
    for row, seed, step in st.seeds or ():
        g = seeded_generator(seed, step, probs.device)
        noise[row] = torch.empty(probs.size(1), device=probs.device).exponential_(generator=g)
    return (probs / noise).argmax(-1)
