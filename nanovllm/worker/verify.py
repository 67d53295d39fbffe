"""Verification of speculative drafts on the device, in one pass over a verify step's rows.

Row j of a sequence holds the target model's logits for the token after its j-th input (its
last token, then its drafts); the draft row j judges is drafts[j] (-1 on a sequence's last
row). A draft is accepted with probability p(draft) / q(draft), q being the proposer's
distribution: a point mass for n-gram drafts, so min(1, p / q) = p(draft). At the first
rejected row the token is drawn from the residual max(p - q, 0), renormalized (for a point
mass: p without the draft); a sequence whose drafts were all accepted draws a bonus token
from its last row's p. The tokens out are then distributed exactly as the target model's
own (Leviathan et al., 2023). Greedy rows accept a draft iff it is the argmax, and emit the
argmax: exactly the tokens of plain greedy decoding.
"""
import torch

from nanovllm.worker.sampler import Sampler, SamplingTensors, constrain, race, seeded_generator


def verify_drafts(sampler: Sampler, logits: torch.Tensor, st: SamplingTensors,
                  drafts: torch.Tensor) -> torch.Tensor:
    """[2R] int32: each row's token if kept (the draft when accepted, else the one drawn),
    then each row's accept flag. The host, which knows where each sequence's rows start,
    keeps a sequence's rows up to its first rejection (step_output._split): a handful of
    device ops a step instead of a segmented scan."""
    # Penalties: each row's own history (its drafts before it count); a grammar row is a
    # sequence's only row (grammar sequences get no drafts).
    logits = constrain(logits, st)
    has = drafts >= 0
    d = drafts.clamp(min=0).long()
    greedy = logits.argmax(-1)
    if st.all_greedy:
        accept, tokens = has & (greedy == d), greedy
    else:
        probs = sampler.probs(logits, st)
        p_draft = probs.gather(1, d.unsqueeze(1)).squeeze(1)
        residual = torch.where(has.unsqueeze(1), probs.scatter(1, d.unsqueeze(1), 0.0), probs)
        sampled = temperature_rows(st)
        u = uniforms(st, logits.size(0), logits.device)
        accept = has & torch.where(sampled, u < p_draft, greedy == d)
        drawn = torch.where(sampled, race(residual, st), greedy)
        tokens = torch.where(accept, d, drawn)
    # A row without a draft (a sequence's last) is never "accepted": its token is drawn.
    return torch.cat([tokens, accept]).to(torch.int32)


def temperature_rows(st: SamplingTensors) -> torch.Tensor:
    """[R] bool: the rows that sample (temperature > 0)."""
    return st.temperatures > 0


def uniforms(st: SamplingTensors, rows: int, device) -> torch.Tensor:
    """[R] U(0, 1) draws for the accept tests; seeded rows from their own streams."""
    u = torch.rand(rows, device=device)
    for row, seed, step in st.seeds or ():
        u[row] = torch.rand(1, device=device, generator=seeded_generator(seed, step, device, 1))
    return u
