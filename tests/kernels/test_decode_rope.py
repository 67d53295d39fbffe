"""The decode kernel with its q/k norm + RoPE + K/V store prologue (kernels/decode_rope.py,
decode_config's FUSE_ROPE) against the two launches it replaces (triton_rope, then the decode).

Interpreter tests on CPU (tiny shapes); the engine's greedy tokens with it on and off on a GPU.
"""
import os

import pytest
import torch

from nanovllm.kernels import decode_config
from nanovllm.kernels.decode_rope import new_token_of
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.rotary_embedding import RotaryEmbedding

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
on_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _case(ctx_lens, heads, kv_heads, head_dim, with_norm, dtype=torch.float32, block=16,
          seed=0):
    """(q, k, v views of one qkv buffer, positions, slots, rope, norms, caches, tables, ctx)
    for a decode step whose rows end at ctx_lens (their last key the new one)."""
    g = torch.Generator().manual_seed(seed)
    rows = len(ctx_lens)
    pages = [-(-n // block) for n in ctx_lens]
    num_blocks = sum(pages) + 1
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.zeros(rows, max(pages), dtype=torch.int32)
    at = 0
    for r, n in enumerate(pages):
        tables[r, :n] = perm[at:at + n]
        at += n
    ctx = torch.tensor(ctx_lens, dtype=torch.int32)
    positions = (ctx - 1).long()
    slots = torch.stack([tables[r, p // block] * block + p % block
                         for r, p in enumerate(positions.tolist())]).int()
    width = (heads + 2 * kv_heads) * head_dim
    qkv = torch.randn(rows, width, generator=g).to(dtype)
    q = qkv[:, :heads * head_dim].view(rows, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].view(rows, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim:].view(rows, kv_heads, head_dim)
    rope = RotaryEmbedding(head_dim, 1024, 1e6)
    norms = (None, None)
    if with_norm:
        norms = tuple(RMSNorm(head_dim, 1e-6).to(dtype=dtype) for _ in range(2))
        for n in norms:
            n.weight.data = (1 + 0.5 * torch.randn(head_dim, generator=g)).to(dtype)
    caches = [torch.randn(num_blocks, block, kv_heads, head_dim, generator=g).to(dtype)
              for _ in range(2)]
    return q, k, v, positions, slots, rope, norms, caches, tables, ctx


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("heads,kv_heads,head_dim,splits,lens", [
    (4, 2, 16, 1, [1, 17, 40, 33]), (4, 2, 16, 3, [1, 17, 40, 33]),
    (3, 1, 32, 2, [1, 17, 40, 33]), (4, 2, 16, 3, [40])])
def test_fused_matches_rope_store_then_decode(heads, kv_heads, head_dim, splits, lens,
                                              with_norm):
    from nanovllm.kernels.triton_decode import decode_attention
    from nanovllm.kernels.triton_rope import norm_rope_store

    q, k, v, pos, slots, rope, (qn, kn), (kc, vc), tables, ctx = _case(
        lens, heads, kv_heads, head_dim, with_norm)
    weights = (qn.weight, kn.weight, qn.eps) if with_norm else (None, None, 0.0)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    q_rot = norm_rope_store(q, k, v, pos, rope.cos_sin_cache, *weights, ref_kc, ref_vc, slots)
    ref = decode_attention(q_rot, ref_kc, ref_vc, ctx, tables, head_dim ** -0.5,
                           num_splits=splits)
    new = new_token_of(q, k, v, pos, rope.cos_sin_cache, qn, kn, slots)
    assert new is not None
    out = decode_attention(q, kc, vc, ctx, tables, head_dim ** -0.5, num_splits=splits, new=new)
    torch.testing.assert_close(kc, ref_kc, rtol=1e-5, atol=1e-5)
    assert torch.equal(vc, ref_vc)  # v is copied, never rounded
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_new_token_of_wants_one_packed_row():
    q, k, v, pos, slots, rope, _, _, _, _ = _case([3, 5], 4, 2, 16, False)
    new = new_token_of(q, k, v, pos, rope.cos_sin_cache, None, None, slots)
    assert new.qkv.shape == (2, (4 + 2 * 2) * 16) and new.q_norm is None
    assert new.qkv.data_ptr() == q.data_ptr()
    # Parts of different buffers, or a partial rotary table: the unfused path.
    assert new_token_of(q.clone(), k, v, pos, rope.cos_sin_cache, None, None, slots) is None
    assert new_token_of(q, k, v.clone(), pos, rope.cos_sin_cache, None, None, slots) is None
    half = rope.cos_sin_cache[..., :8]
    assert new_token_of(q, k, v, pos, half, None, None, slots) is None


def test_new_token_of_takes_a_single_row():
    """Batch 1: view() gives the size-1 dim of q / k / v its own strides (q's is H * D, not
    the row's), which must not send one row down the unfused path."""
    q, k, v, pos, slots, rope, _, _, _, _ = _case([7], 4, 2, 16, False)
    assert q.stride(0) == 4 * 16  # (what view() does; the row is (4 + 2 * 2) * 16 wide)
    new = new_token_of(q, k, v, pos, rope.cos_sin_cache, None, None, slots)
    assert new is not None and new.qkv.shape == (1, (4 + 2 * 2) * 16)
    assert new.qkv.data_ptr() == q.data_ptr() and new.qkv.stride() == ((4 + 2 * 2) * 16, 1)
    assert new_token_of(q, k, v.clone(), pos, rope.cos_sin_cache, None, None, slots) is None


@on_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_engine_greedy_with_and_without_fusion(toy_models, monkeypatch, dtype):
    """The engine's greedy tokens with FUSE_ROPE off and on (batched decode steps, graphs)."""
    from nanovllm import LLM, SamplingParams

    prompts = [[(7 * i + j) % 300 + 10 for j in range(n)] for i, n in enumerate((5, 90, 300))]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = {}
    for fuse in (False, True):
        monkeypatch.setitem(decode_config.CONFIG, "FUSE_ROPE", fuse)
        llm = LLM(toy_models["untied_gqa4_d64"], device="cuda", dtype=dtype,
                  num_kvcache_blocks=64, max_model_len=1024)
        try:
            outs[fuse] = [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)]
        finally:
            llm.shutdown()
    assert outs[False] == outs[True]


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
@pytest.mark.parametrize("lens", [[9, 40, 3], [40]])
def test_attention_layer_takes_the_fused_step_for_pure_decode(monkeypatch, lens):
    """Attention.attend over TritonBackend: a pure decode step with FUSE_ROPE on gives the
    unfused path's output and caches (rows started longest first, as the engine orders them)."""
    from nanovllm.layers.attention import Attention
    from nanovllm.layers.attention_backend import TritonBackend
    from nanovllm.utils.context import reset_context, set_context

    q, k, v, pos, slots, rope, (qn, kn), caches, tables, ctx = _case(lens, 4, 2, 16, True)
    got = {}
    for fuse in (False, True):
        monkeypatch.setitem(decode_config.CONFIG, "FUSE_ROPE", fuse)
        attn = Attention(4, 16, 0.25, 2)
        attn.backend = TritonBackend()
        if fuse:  # no triton_rope launch before the decode
            attn.backend._rope_store = None
        attn.k_cache, attn.v_cache = (c.clone() for c in caches)
        set_context(slot_mapping=slots, context_lens=ctx, block_tables=tables,
                    decode_order=ctx.argsort(descending=True).int())
        try:
            got[fuse] = attn.attend(q, k, v, pos, rope, qn, kn), attn.k_cache, attn.v_cache
        finally:
            reset_context()
    for a, b in zip(got[False], got[True]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@on_gpu
@pytest.mark.gpu
def test_gpu_speculation_keeps_the_unfused_store(toy_models, monkeypatch):
    """Verify steps (a sequence's rows read each other's new keys) never take the prologue,
    which stores a row's own key only: with FUSE_ROPE on, ngram and self-draft speculation
    still give plain greedy decoding's tokens."""
    from nanovllm import LLM
    from tests.test_speculative import GREEDY, NGRAM, draft_config, ids, repeating_prompts

    monkeypatch.setitem(decode_config.CONFIG, "FUSE_ROPE", True)
    path = toy_models["untied_gqa4_d64"]
    kw = dict(device="cuda", dtype="float32", kvcache_block_size=16, max_model_len=256,
              max_num_seqs=16)
    outs = {}
    for name, spec in (("plain", None), ("ngram", NGRAM), ("self", draft_config(path, k=4))):
        llm = LLM(path, speculative_config=spec, **kw)
        try:
            # (not kept in a local: a runner outliving its LLM keeps its cache on the GPU)
            backend = llm.clients[0].core.executor.runner.attn_layers[0].backend
            assert (backend.decode_new is None) == (spec is not None)
            del backend
            outs[name] = ids(llm.generate(repeating_prompts(6, 12), GREEDY, use_tqdm=False))
        finally:
            llm.shutdown()
    assert outs["ngram"] == outs["plain"] and outs["self"] == outs["plain"]
