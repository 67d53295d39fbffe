"""A mixed step's attention: the leading decode rows (one query each, at the end of a cached
context) through the backend's decode kernel and the rest through its prefill, as
worker/step_context.py lays the two parts out, equal the whole step run as one varlen prefill
(where a decode row is a one-token chunk over its context) and an fp64 oracle. The torch path
is the CPU oracle; the Triton kernels run under the interpreter on CPU and compiled on a GPU."""
from types import SimpleNamespace

import pytest
import torch

from nanovllm.layers.attention import Attention
from nanovllm.layers.attention_backend import FlashBackend, TorchBackend, flash_attn_available
from nanovllm.utils.context import Context
from nanovllm.worker.step_context import prefill_context
from tests.support.markers import needs_interpreter, on_gpu
from tests.support.paged import make_paged_case, naive_attention, rel_err

# (query rows, context): three decode rows, then a chunk over cached tokens and a fresh prompt.
CPU_SEQS = [(1, 5), (1, 40), (1, 17), (9, 30), (6, 6)]
GPU_SEQS = [(1, 700), (1, 3000), (1, 1), (1, 257), (512, 1536), (300, 300), (1, 90)]


def mixed_case(seqs, num_decode, block_size, heads, dtype, device):
    """The paged case, the mixed step's context (as the model runner publishes it) and the
    same step as one prefill."""
    c = make_paged_case(seqs, block_size, heads[0], heads[1], heads[2], seed=5, dtype=dtype,
                        device=device)
    tables = c.block_tables.clamp(min=0)
    lens = c.context_lens[:num_decode]
    dev = dict(cu_seqlens_q=c.cu_seqlens_q, cu_seqlens_k=c.cu_seqlens_k,
               slot_mapping=torch.zeros(c.q.shape[0], dtype=torch.int32, device=device),
               block_tables=tables[num_decode:], decode_tables=tables[:num_decode],
               decode_rows=torch.stack([lens, lens.argsort(descending=True).int()]))
    rest = seqs[num_decode:]
    inputs = SimpleNamespace(num_decode_rows=num_decode, num_seqs=len(seqs),
                             max_seqlen_q=max((q for q, _ in rest), default=0),
                             max_seqlen_k=max((k for _, k in rest), default=0),
                             has_cached_context=any(k > q for q, k in rest))
    mixed = Context(**prefill_context(inputs, dev))
    whole = Context(is_prefill=True, cu_seqlens_q=c.cu_seqlens_q, cu_seqlens_k=c.cu_seqlens_k,
                    max_seqlen_q=c.max_seqlen_q, max_seqlen_k=c.max_seqlen_k,
                    block_tables=tables, has_cached_context=True)
    return c, mixed, whole


def run_both(backend, c, mixed, whole):
    """(mixed step's output, the whole step as one prefill's) through backend."""
    attn = Attention(c.q.shape[1], c.q.shape[2], c.scale, c.k_cache.shape[2])
    attn.backend, attn.k_cache, attn.v_cache = backend, c.k_cache, c.v_cache
    v = torch.zeros(c.q.shape[0], *c.k_cache.shape[2:], dtype=c.q.dtype, device=c.q.device)
    out = attn._mixed(c.q, None, v, mixed, {})
    return out, backend.prefill(c.q, None, v, c.k_cache, c.v_cache, whole, c.scale)


def test_torch_path_mixed_equals_one_prefill_and_the_oracle():
    c, mixed, whole = mixed_case(CPU_SEQS, 3, 16, (4, 2, 16), torch.float32, "cpu")
    out, one = run_both(TorchBackend(), c, mixed, whole)
    assert torch.equal(out, one)  # the same reference math, row for row
    assert rel_err(out, naive_attention(c)) < 1e-5


def test_decode_rows_only():
    c, mixed, whole = mixed_case(CPU_SEQS[:3], 3, 16, (4, 2, 16), torch.float32, "cpu")
    assert mixed.prefill_part is None
    out, one = run_both(TorchBackend(), c, mixed, whole)
    assert torch.equal(out, one)


@needs_interpreter
def test_triton_mixed_under_the_interpreter():
    from nanovllm.layers.attention_backend import TritonBackend

    c, mixed, whole = mixed_case(CPU_SEQS, 3, 16, (4, 2, 16), torch.float32, "cpu")
    out, one = run_both(TritonBackend(), c, mixed, whole)
    ref = naive_attention(c)
    assert rel_err(out, ref) < 1e-5 and rel_err(one, ref) < 1e-5


@on_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("backend", ["triton", "flash"])
def test_mixed_on_gpu(dtype, block_size, backend):
    from nanovllm.layers.attention_backend import TritonBackend

    if backend == "flash" and (not flash_attn_available() or block_size % 256
                               or dtype != torch.bfloat16):
        pytest.skip("flash-attn: installed, bf16, blocks of 256")
    c, mixed, whole = mixed_case(GPU_SEQS, 4, block_size, (16, 8, 128), dtype, "cuda")
    out, one = run_both(FlashBackend() if backend == "flash" else TritonBackend(), c, mixed,
                        whole)
    ref = naive_attention(c)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert rel_err(out, ref) < tol and rel_err(one, ref) < tol
