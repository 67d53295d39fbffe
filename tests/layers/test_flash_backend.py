"""The flash-attn backend's calls, checked on CPU with a stand-in that follows flash-attn's
documented semantics (varlen + paged block_table; kvcache decode; bottom-right causal)."""
import random
import types

import torch

from nanovllm import LLM, SamplingParams
from nanovllm.layers.attention_backend import FlashBackend, TorchBackend
from tests.support.hf_oracle import hf_greedy


def _attend(q, k, v, scale):
    """q [M, H, D], k/v [N, Hkv, D]; causal aligned to the bottom right, as flash-attn 2.1+."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("mhd,nhd->hmn", q.float(), k.float()) * scale
    m, n = q.shape[0], k.shape[0]
    allowed = torch.arange(n)[None, :] <= torch.arange(m)[:, None] + (n - m)
    p = s.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hmn,nhd->mhd", p, v.float()).to(q.dtype)


def _paged(cache, row, n):
    bs = cache.shape[1]
    return cache[row[: -(-n // bs)].long()].flatten(0, 1)[:n]


class FakeFlashAttn(types.SimpleNamespace):
    """Records every call and computes what flash-attn would."""

    def __init__(self):
        super().__init__(calls=[])

    def flash_attn_varlen_func(self, q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k,
                               cu_seqlens_k, softmax_scale, causal, block_table=None):
        assert causal and q.dim() == 3
        self.calls.append(("varlen", block_table is not None))
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        assert max(b - a for a, b in zip(cq, cq[1:])) == max_seqlen_q
        assert max(b - a for a, b in zip(ck, ck[1:])) == max_seqlen_k
        out = torch.empty_like(q)
        for i in range(len(cq) - 1):
            n = ck[i + 1] - ck[i]
            if block_table is None:  # packed new tokens: k/v indexed by cu_seqlens_k
                ki, vi = k[ck[i]: ck[i + 1]], v[ck[i]: ck[i + 1]]
            else:  # k/v are the paged caches
                ki, vi = _paged(k, block_table[i], n), _paged(v, block_table[i], n)
            out[cq[i]: cq[i + 1]] = _attend(q[cq[i]: cq[i + 1]], ki, vi, softmax_scale)
        return out

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, cache_seqlens, block_table,
                                softmax_scale, causal):
        assert causal and q.dim() == 4 and q.shape[1] == 1
        assert k_cache.shape[1] % 256 == 0  # flash-attn's paged KV needs 256-token pages
        self.calls.append(("kvcache", True))
        out = torch.empty_like(q)
        for i, n in enumerate(cache_seqlens.tolist()):
            out[i] = _attend(q[i], _paged(k_cache, block_table[i], n),
                             _paged(v_cache, block_table[i], n), softmax_scale)
        return out


class FlashWithTorchStore(FlashBackend):
    """FlashBackend with the torch path's RoPE + K/V store in place of our Triton kernel
    (tests/kernels/test_triton_rope.py checks that one): under the CPU interpreter the kernel
    took ~25 s of this test, which is about the flash calls."""

    rope_and_store = TorchBackend.rope_and_store
    store_kv = TorchBackend.store_kv


def test_flash_backend_calls_give_hf_tokens(toy_models):
    path = toy_models["untied_gqa4_d64"]
    llm = LLM(path, kvcache_block_size=256, max_model_len=1024)
    fake = FakeFlashAttn()
    backend = FlashWithTorchStore(flash_attn=fake)
    for layer in llm.clients[0].core.executor.runner.attn_layers:
        layer.backend = backend
    rng = random.Random(0)
    shared = [rng.randrange(3, 400) for _ in range(300)]
    first = [shared + [5, 6]]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert llm.generate(first, sp, use_tqdm=False)[0]["token_ids"] == \
        hf_greedy(path, tuple(first[0]), 12)
    # A batch mixing a prefix hit (shared prefix) with a longer uncached prompt.
    batch = [shared + [7], [rng.randrange(3, 400) for _ in range(320)]]
    outs = llm.generate(batch, sp, use_tqdm=False)
    for p, o in zip(batch, outs):
        assert o["token_ids"] == hf_greedy(path, tuple(p), 12)
    kinds = set(fake.calls)
    assert ("varlen", False) in kinds and ("varlen", True) in kinds and ("kvcache", True) in kinds
