"""Paged-KV attention cases: random sequences scattered over shuffled cache blocks, plus an
independent dense oracle and the error measure the kernel tests compare with."""
import types

import torch


def make_paged_case(seqs, block_size, num_heads, num_kv_heads, head_dim, *, seed=0,
                    dtype=torch.float32, device="cpu", spare_blocks=3):
    """seqs: list of (seqlen_q, seqlen_k); everything is built on `device` by one seeded generator.

    K/V of each sequence's first seqlen_k tokens are written into a NaN-filled cache, so any read
    outside a context (another sequence's slots, spare blocks, the -1 tail of a block table)
    shows up as NaN. Returns the kernels' arguments and the dense per-sequence K/V (ks, vs).
    """
    g = torch.Generator(device).manual_seed(seed)
    nblk = [(sk + block_size - 1) // block_size for _, sk in seqs]
    num_blocks = sum(nblk) + spare_blocks
    perm = torch.randperm(num_blocks, generator=g, device=device)
    max_blocks = max(nblk) + 1  # at least one trailing -1 column
    block_tables = torch.full((len(seqs), max_blocks), -1, dtype=torch.int32, device=device)
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"),
                         dtype=dtype, device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    ks, vs, used = [], [], 0
    for i, (_, sk) in enumerate(seqs):
        block_tables[i, :nblk[i]] = perm[used:used + nblk[i]].int()
        used += nblk[i]
        k = torch.randn(sk, num_kv_heads, head_dim, generator=g, device=device).to(dtype)
        v = torch.randn(sk, num_kv_heads, head_dim, generator=g, device=device).to(dtype)
        pos = torch.arange(sk, device=device)
        blocks = block_tables[i, pos // block_size].long()
        k_cache[blocks, pos % block_size] = k
        v_cache[blocks, pos % block_size] = v
        ks.append(k)
        vs.append(v)
    q = torch.randn(sum(sq for sq, _ in seqs), num_heads, head_dim, generator=g,
                    device=device).to(dtype)
    cu_q = torch.tensor([0] + [sq for sq, _ in seqs], device=device).cumsum(0).int()
    cu_k = torch.tensor([0] + [sk for _, sk in seqs], device=device).cumsum(0).int()
    return types.SimpleNamespace(
        q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, context_lens=cu_k.diff().int(),
        ks=ks, vs=vs, seqs=seqs, scale=head_dim ** -0.5,
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
        rows = sk - sq + torch.arange(sq, device=q.device)  # absolute positions of the queries
        allowed = torch.arange(sk, device=q.device)[None, :] <= rows[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                                             scale=case.scale)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


def rel_err(a, b):
    """||a - b|| / ||b|| in fp64 (NaN-propagating, so a NaN anywhere fails any tolerance)."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()
