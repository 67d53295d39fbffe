"""Batched token sampling: greedy, temperature, top-k, top-p, min-p, per-request seeds."""
from dataclasses import dataclass

import torch
from torch import nn

from nanovllm.layers.penalties import PenaltyTensors
from nanovllm.sampling_params import SamplingParams


@dataclass
class SamplingTensors:
    """Per-row sampling settings of one batch, on the logits' device."""

    temperatures: torch.Tensor          # [B] float; 0 = greedy
    top_ks: torch.Tensor | None = None   # [B] long; vocab size = off
    top_ps: torch.Tensor | None = None   # [B] float; 1 = off
    min_ps: torch.Tensor | None = None   # [B] float; 0 = off
    seeds: list[tuple[int, int, int]] | None = None  # (row, seed, step) for seeded rows
    all_greedy: bool = False
    # Penalties and min_tokens: applied to the logits before sampling (see layers/penalties.py);
    # None, the usual case, when no row uses them.
    penalties: PenaltyTensors | None = None

    @classmethod
    def from_params(cls, params: list[SamplingParams], steps: list[int], vocab_size: int,
                    device: torch.device) -> "SamplingTensors":
        """The batch's settings; steps[i] = tokens row i generated so far (seeded streams)."""
        temps = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        st = cls(temps.to(device, non_blocking=True),
                 all_greedy=all(p.temperature == 0 for p in params))
        if st.all_greedy:
            return st
        # Each optional tensor exists only when some row uses it, so plain batches take
        # the fused single-pass sampler.
        if any(p.top_k != -1 for p in params):
            # Clamped to the vocabulary: a larger top_k keeps every token anyway, and the
            # value must fit the int64 tensor.
            st.top_ks = torch.tensor([vocab_size if p.top_k == -1 else min(p.top_k, vocab_size)
                                      for p in params], device=device)
        if any(p.top_p < 1 for p in params):
            st.top_ps = torch.tensor([p.top_p for p in params], device=device)
        if any(p.min_p > 0 for p in params):
            st.min_ps = torch.tensor([p.min_p for p in params], device=device)
        seeded = [(i, p.seed, step) for i, (p, step) in enumerate(zip(params, steps))
                  if p.seed is not None and p.temperature > 0]
        st.seeds = seeded or None
        return st


class Sampler(nn.Module):
    """Turns last-position logits into token ids without any per-token Python loop."""

    def __init__(self):
        super().__init__()
        self.steps = 0  # varies the fused kernel's random stream from step to step

    def forward(self, logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        if st.all_greedy:
            return logits.argmax(-1)
        plain = st.top_ks is None and st.top_ps is None and st.min_ps is None and not st.seeds
        if plain and logits.is_cuda:
            from nanovllm.kernels.triton_sample import sample_temperature

            self.steps += 1
            seed = (torch.initial_seed() + self.steps * 0x9E3779B1) & 0x7FFFFFFF
            return sample_temperature(logits, st.temperatures, seed)
        logits = logits.float()
        greedy = logits.argmax(-1)
        temps = st.temperatures.unsqueeze(1)
        logits = logits / torch.where(temps > 0, temps, torch.ones_like(temps))
        if st.top_ks is not None or st.top_ps is not None:
            logits = self._top_k_top_p(logits, st.top_ks, st.top_ps)
        probs = torch.softmax(logits, -1)
        if st.min_ps is not None:
            keep = probs >= st.min_ps.unsqueeze(1) * probs.max(-1, keepdim=True).values
            probs = probs * keep
        # Exponential race (Gumbel-max): argmax(p / E) with E ~ Exp(1) samples from p
        # without a cumulative sum over the vocabulary.
        noise = torch.empty_like(probs).exponential_()
        for row, seed, step in st.seeds or ():
            g = torch.Generator(device=probs.device).manual_seed(hash((seed, step)) & (2**63 - 1))
            noise[row] = torch.empty(probs.size(1), device=probs.device).exponential_(generator=g)
        sampled = (probs / noise).argmax(-1)
        return torch.where(st.temperatures > 0, sampled, greedy)

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
