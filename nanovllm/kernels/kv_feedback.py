"""An fp8 K cache rounded with the queries in mind: the plain-torch reference (issue 27).

Plain rounding gives each element of a key row its own error d_i, so a score q.k errs by sum_i
q_i d_i. Rounding the row's elements in turn and pushing each one's error onto those not yet
rounded, weighted by the queries' second moments H = E[q q^T] (GPTQ's update), minimizes
E[(q.d)^2] instead of sum_i d_i^2. H comes from the queries of the first FIT_TOKENS prefill
tokens (Attention.fit_feedback refits after each prefill until then). The feedback stays within
groups of GROUP channels (H's entries across groups dropped), so a store rounds the D / GROUP
groups side by side in GROUP sequential steps rather than D: emulated on SmolLM2
(tools/kv_gptq_emulate.py, docs/PERF_NOTES.md) groups of 32 keep the dense feedback's gain
(decode error 0.0549 -> 0.0378 nats vs 0.0373). The torch path and the fused RoPE-store kernel
(triton_rope, through triton_feedback) round this way when feedback_wanted() (the default;
NANOVLLM_KV_FEEDBACK=0 turns it off).
"""
import os

import torch

# Added to H's diagonal, times its mean: best of 0.01-1.0 on both emulated texts.
DAMP = 0.1
# Channels per feedback group (at most half a head: the store kernel's tiles are halves).
GROUP = 32
# Prefill tokens whose queries fit the feedback: the calibrating prefill's alone may be a
# short chat turn, whose few query directions say little about the rest (SmolLM2, first
# prompt "Hi": the gain was gone). The matrix is refitted on every prefill until then.
FIT_TOKENS = 2048


def feedback_wanted() -> bool:
    """Whether an fp8_e4m3 cache with calibrated scales rounds K this way: yes unless
    NANOVLLM_KV_FEEDBACK=0 (docs/PERF_NOTES.md, sixteenth session: SmolLM2's decode error
    0.055 -> 0.037 nats for ~1-3% of bench.py on an H100)."""
    return os.environ.get("NANOVLLM_KV_FEEDBACK", "1") != "0"


def group_size(head_dim: int) -> int:
    """Channels per feedback group for this head size."""
    return min(GROUP, head_dim // 2)


def identity_feedback(num_kv_heads: int, head_dim: int, device=None) -> torch.Tensor:
    """The feedback matrix that pushes no error anywhere (plain rounding), [Hkv, D, G]."""
    g = group_size(head_dim)
    rows = torch.arange(head_dim, device=device)
    eye = (rows[:, None] % g == torch.arange(g, device=device)).float()
    return eye.expand(num_kv_heads, -1, -1).contiguous()


def query_moments(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """Sum over rows of q q^T per kv head [Hkv, D, D] for the rotated queries q [T, Hq, D]
    (each kv head's group of query heads pooled): H times its row count."""
    t, hq, d = q.shape
    rows = q.float().view(t, num_kv_heads, hq // num_kv_heads, d).permute(1, 0, 2, 3)
    rows = rows.reshape(num_kv_heads, -1, d)
    return rows.transpose(1, 2) @ rows


def factor_from_moments(h: torch.Tensor, damp: float = DAMP,
                        group: int | None = None) -> torch.Tensor:
    """The feedback matrix [Hkv, D, G] for second moments h [Hkv, D, D] (see
    feedback_factor). No host sync: the damping keeps every block positive definite."""
    hkv, d, _ = h.shape
    g = group or group_size(d)
    assert d % g == 0, (d, g)
    eye = torch.eye(d, device=h.device)
    h = h + damp * h.diagonal(dim1=-2, dim2=-1).mean(-1)[:, None, None] * eye
    blocks = h.view(hkv, d // g, g, d // g, g).diagonal(dim1=1, dim2=3)
    blocks = blocks.permute(0, 3, 1, 2)  # [Hkv, groups, G, G]
    # U (upper, H^-1 = U^T U) without inverting H: with J the reversal, J H J = (J U^-1 J)
    # (J U^-1 J)^T and J U^-1 J is lower, so U = J L^-1 J for L the Cholesky factor of J H J.
    # Two batched calls, not three (H100, 32 blocks: 0.13 ms for cholesky_inverse alone).
    low = torch.linalg.cholesky_ex(blocks.flip(-2, -1)).L
    eye_g = torch.eye(g, device=h.device).expand_as(low)
    u = torch.linalg.solve_triangular(low, eye_g, upper=False).flip(-2, -1)
    u = u / u.diagonal(dim1=-2, dim2=-1)[..., None]
    return u.reshape(hkv, d, g).contiguous()  # the store kernel reads rows of it


def feedback_factor(q: torch.Tensor, num_kv_heads: int, damp: float = DAMP,
                    group: int | None = None) -> torch.Tensor:
    """The feedback matrix [Hkv, D, G] per kv head from the rotated queries q [T, Hq, D] of
    that kv head's group: row r holds, over the G channels of r's group, the upper Cholesky
    factor U of (H + damp * mean(diag H) * I)^-1 (H = E[q q^T], block-diagonal in groups
    of G) divided by U[r, r], so a rounding error e at r takes e * row off the channels
    after r."""
    rows = q.shape[0] * (q.shape[1] // num_kv_heads)
    return factor_from_moments(query_moments(q, num_kv_heads) / rows, damp, group)


def quantize_feedback(k: torch.Tensor, scale: torch.Tensor, feedback: torch.Tensor,
                      dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """k [T, Hkv, D] as `dtype` codes of k / scale[kv head], each group's channels rounded in
    turn with GPTQ's error feedback through `feedback` (feedback_factor's [Hkv, D, G]).
    Works in units of the scale, in the order the fused store kernel does
    (triton_feedback.feedback_round)."""
    fmax = torch.finfo(dtype).max
    t, hkv, d = k.shape
    g = feedback.shape[-1]
    y = (k.float() / scale.float()[:, None]).view(t, hkv, d // g, g)
    rows = feedback.float().view(hkv, d // g, g, g)
    for i in range(g):
        col = y[..., i:i + 1]
        err = col - col.clamp(-fmax, fmax).to(dtype).float()
        # Row i is 1 at i: channel i becomes its rounded value, exactly (Sterbenz).
        y = y - err * rows[:, :, i]
    return y.view(t, hkv, d).clamp(-fmax, fmax).to(dtype)
