"""Shared builders for paged-KV attention tests: random sequences scattered over shuffled blocks."""
import types

import pytest
import torch


def make_paged_case(seqs, block_size, num_heads, num_kv_heads, head_dim, dtype=torch.float32,
                    device="cpu", seed=0, spare_blocks=3):
    """seqs: list of (seqlen_q, seqlen_k). K/V of each sequence's first seqlen_k tokens are written
    straight into a NaN-poisoned cache (so any read outside a context shows up as NaN)."""
    g = torch.Generator().manual_seed(seed)
    nblk = [(sk + block_size - 1) // block_size for _, sk in seqs]
    num_blocks = sum(nblk) + spare_blocks
    perm = torch.randperm(num_blocks, generator=g)
    max_blocks = max(nblk) + 1  # at least one trailing -1 column
    block_tables = torch.full((len(seqs), max_blocks), -1, dtype=torch.int32)
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    ks, vs, used = [], [], 0
    for i, (_, sk) in enumerate(seqs):
        block_tables[i, :nblk[i]] = perm[used:used + nblk[i]].int()
        used += nblk[i]
        k = torch.randn(sk, num_kv_heads, head_dim, generator=g)
        v = torch.randn(sk, num_kv_heads, head_dim, generator=g)
        pos = torch.arange(sk)
        blocks = block_tables[i, (pos // block_size)].long()
        k_cache[blocks, pos % block_size] = k.to(dtype)
        v_cache[blocks, pos % block_size] = v.to(dtype)
        ks.append(k.to(dtype))
        vs.append(v.to(dtype))
    q = torch.randn(sum(sq for sq, _ in seqs), num_heads, head_dim, generator=g).to(dtype)
    cu_q = torch.tensor([0] + [sq for sq, _ in seqs], dtype=torch.int32).cumsum(0).int()
    cu_k = torch.tensor([0] + [sk for _, sk in seqs], dtype=torch.int32).cumsum(0).int()
    to = lambda t: t.to(device)
    return types.SimpleNamespace(
        q=to(q), k_cache=to(k_cache), v_cache=to(v_cache), block_tables=to(block_tables),
        cu_seqlens_q=to(cu_q), cu_seqlens_k=to(cu_k), context_lens=to(cu_k.diff().int()),
        ks=[to(k) for k in ks], vs=[to(v) for v in vs], seqs=seqs, scale=head_dim ** -0.5,
        max_seqlen_q=max(sq for sq, _ in seqs), max_seqlen_k=max(sk for _, sk in seqs))


def naive_attention(case):
    """Independent oracle: dense per-sequence K/V, fp64 SDPA with an explicit causal mask."""
    outs = []
    cu = case.cu_seqlens_q.tolist()
    for i, (sq, sk) in enumerate(case.seqs):
        q = case.q[cu[i]:cu[i + 1]].double().transpose(0, 1)
        group = q.shape[0] // case.ks[i].shape[1]
        k = case.ks[i].double().repeat_interleave(group, 1).transpose(0, 1)
        v = case.vs[i].double().repeat_interleave(group, 1).transpose(0, 1)
        allowed = torch.arange(sk, device=q.device)[None, :] <= (sk - sq + torch.arange(sq, device=q.device))[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=case.scale)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


def rel_err(a, b):
    """||a - b|| / ||b|| in fp64 (NaN-propagating)."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture
def kv():
    return types.SimpleNamespace(make=make_paged_case, naive=naive_attention, rel_err=rel_err)


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """Every float tensor from torch.empty/empty_like starts as NaN, so unwritten outputs fail tests."""
    orig_empty, orig_empty_like = torch.empty, torch.empty_like

    def poisoned(fn):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            if out.is_floating_point():
                out.fill_(float("nan"))
            return out
        return wrapper

    monkeypatch.setattr(torch, "empty", poisoned(orig_empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(orig_empty_like))
