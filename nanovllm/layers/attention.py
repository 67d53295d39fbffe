"""Attention over the paged KV cache; the implementation is a pluggable backend."""
import torch
from torch import nn

from nanovllm.kernels.kv_feedback import factor_from_moments, query_moments
from nanovllm.layers.attention_backend import TorchBackend, norm_and_rotate
from nanovllm.utils.context import attention_cut, get_context

# Calibrated fp8 scales map margin x the largest |K| (|V|) of the first prefill to the fp8
# maximum, so later tokens up to that many times larger still fit. The margin costs almost
# nothing: fp8 keeps its relative precision over its whole normal range (e4m3: 2^-6..448), and
# only values below amax * margin / 28672 (e4m3) fall into the coarser subnormals. 8 was too
# little for a one-word first request: SmolLM2 fp32 on an H100, "Hi" first, decode 0.060
# nats with 8 and 0.053 with 64, as after a long first prompt (0.053-0.055).
KV_SCALE_MARGIN = 64.0


class Attention(nn.Module):
    """Applies q/k norm and RoPE, stores this step's K/V in the cache, then attends (prefill
    or decode) through it. The backend may fuse the first three into one kernel."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.scale = scale
        self.backend = TorchBackend()  # ModelRunner installs the chosen one
        self.k_cache = self.v_cache = torch.tensor([])
        # Dequantization scales (None: a cache in the model dtype): fp32 [num_kv_heads] for
        # fp8; for int8 one per cached row, [num_blocks, block_size, num_kv_heads].
        self.k_scale = self.v_scale = None
        # fp32 [num_kv_heads, D, G] or None: an fp8 cache's K rounded with error feedback
        # through it (kernels/kv_feedback.py; NANOVLLM_KV_FEEDBACK=0 turns it off), fitted
        # to the queries' second moments summed so far ([num_kv_heads, D, D], over rows).
        self.k_feedback = None
        self.feedback_moments = None
        self.feedback_rows = 0

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                rope: nn.Module, q_norm: nn.Module | None = None,
                k_norm: nn.Module | None = None) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] straight from the projection; rope maps
        (positions, q, k) to rotated (q, k); q_norm/k_norm are per-head norms or None.
        Returns [T, H, D]."""
        cut = attention_cut()
        if cut is not None:  # a piecewise graph capture ends its piece here
            return cut(self, q, k, v, positions, rope, q_norm, k_norm)
        return self.attend(q, k, v, positions, rope, q_norm, k_norm)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               rope: nn.Module, q_norm: nn.Module | None = None,
               k_norm: nn.Module | None = None) -> torch.Tensor:
        """forward's work: norms, RoPE, the K/V store and attention under the step's
        context."""
        ctx = get_context()
        if self.k_cache.numel() == 0:
            # Warm-up before the cache exists (sizing the activations): attention is skipped,
            # but the rotated q and K the fused RoPE kernel returns and the V copy an fp8
            # prefill attends to (exact_chunk) are alive with its output, as in a real step.
            q, k = torch.empty_like(q), torch.empty_like(k)
            v = v.contiguous()
            return torch.zeros_like(q)
        if ctx.calibrate_kv and self.k_scale is not None:
            # Once, on the first prefill (ModelRunner's call): the unfused path yields the
            # rotated keys the cache will hold.
            q_rot, k_rot = norm_and_rotate(q, k, positions, rope, q_norm, k_norm,
                                           self.backend.mix_kv)
            fmax = torch.finfo(self.k_cache.dtype).max
            calibrate_kv_scales(k_rot, v, self.k_scale, self.v_scale, fmax)
        n = ctx.fit_feedback  # the first rows' queries only: FIT_TOKENS in all
        if n and self.k_feedback is not None:
            if ctx.calibrate_kv:
                q_rot = q_rot[:n]
            else:
                q_rot = norm_and_rotate(q[:n], k[:n], positions[:n], rope, q_norm, k_norm,
                                        self.backend.mix_kv)[0]
            self.fit_feedback(q_rot)
        if (self.backend.decode_new is not None and self.k_scale is None
                and not ctx.is_prefill and not ctx.num_decode_rows):
            out = self.backend.decode_new(q, k, v, positions, rope, q_norm, k_norm,
                                          self.k_cache, self.v_cache, ctx, self.scale)
            if out is not None:
                return out
        scales = dict(k_scale=self.k_scale, v_scale=self.v_scale)
        q, k = self.backend.rope_and_store(q, k, v, positions, rope, q_norm, k_norm,
                                           self.k_cache, self.v_cache, ctx, **scales,
                                           k_feedback=self.k_feedback)
        if ctx.num_decode_rows:
            return self._mixed(q, k, v, ctx, scales)
        if ctx.is_prefill:
            return self.backend.prefill(q, k, v, self.k_cache, self.v_cache, ctx, self.scale,
                                        **scales)
        return self.backend.decode(q, self.k_cache, self.v_cache, ctx, self.scale, **scales)

    def fit_feedback(self, q_rot: torch.Tensor) -> None:
        """Add rotated queries [T, H, D] to the K feedback's moments and refit its matrix in
        place (captured graphs read the same buffer)."""
        self.feedback_moments += query_moments(q_rot, self.num_kv_heads)
        self.feedback_rows += q_rot.shape[0] * (self.num_heads // self.num_kv_heads)
        self.k_feedback.copy_(factor_from_moments(self.feedback_moments / self.feedback_rows))

    def _mixed(self, q, k, v, ctx, scales: dict) -> torch.Tensor:
        """A mixed step: the leading decode rows through the decode kernel (the prefill
        kernel's query tiles would be one row of 64-128 there), the rest as a prefill."""
        d = ctx.num_decode_rows
        out = self.backend.decode(q[:d], self.k_cache, self.v_cache, ctx.decode_part,
                                  self.scale, **scales)
        if ctx.prefill_part is None:
            return out
        # k is None unless the backend's prefill reads this step's own keys (rope_and_store).
        rest = self.backend.prefill(q[d:], None if k is None else k[d:], v[d:], self.k_cache,
                                    self.v_cache, ctx.prefill_part, self.scale, **scales)
        return torch.cat((out, rest))


def calibrate_kv_scales(k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor,
                        v_scale: torch.Tensor, fmax: float,
                        margin: float = KV_SCALE_MARGIN) -> None:
    """Set k_scale/v_scale [Hkv] in place from k/v [T, Hkv, D]: amax * margin -> fmax."""
    for x, scale in ((k, k_scale), (v, v_scale)):
        amax = x.float().abs().amax(dim=(0, 2))
        # An all-zero head would get scale 0 (x / 0 = NaN): any positive scale stores zeros.
        scale.copy_(torch.where(amax > 0, amax * margin / fmax, 1.0))
