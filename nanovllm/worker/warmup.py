"""Start-up passes of a ModelRunner: the activation peak that sizes the KV cache, and one
run of every kernel variant so none compiles in the middle of a user's generate. Each pass
runs once compile-only first (utils/compile_ahead.py), so its kernels compile in parallel;
the batch-1 layer kernel compiles on a thread of its own across the passes."""
import logging
import threading

import torch

from nanovllm.engine.sequence import Sequence
from nanovllm.kernels.host_copy import copy_words
from nanovllm.sampling_params import SamplingParams
from nanovllm.utils.compile_ahead import compile_ahead
from nanovllm.utils.context import reset_context, set_context
from nanovllm.worker.sampler import SamplingTensors

logger = logging.getLogger(__name__)


@torch.inference_mode()
def size_activations(runner) -> None:
    """Run the largest prefill and sampling batch once, to size activation memory."""
    if runner.device.type != "cuda":
        # Only the GPU sizes its KV cache from this peak; on a CPU the same 16k-token
        # prefill would cost minutes of start-up for nothing.
        return
    runner.layer_kernel_compile = _compile_layer_kernel(runner)
    with compile_ahead() as ahead:
        if ahead:
            _largest_prefill(runner)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    _largest_prefill(runner)
    torch.cuda.synchronize()


def _compile_layer_kernel(runner) -> threading.Thread | None:
    """Start compiling the batch-1 decode layers' one kernel (models/one_launch.py) on a
    thread of its own: the longest compile of a fresh start (seconds), it then overlaps the
    warm-up passes up to the decode graphs' (compile_kernels joins it)."""
    model = getattr(runner.model, "model", None)
    if not (getattr(model, "one_launch", False) and runner.kv_dtype == runner.dtype):
        return None
    from nanovllm.models import one_launch

    def compile_it():
        try:
            with compile_ahead(workers=1) as ahead:
                if ahead:  # (never a real launch from this thread)
                    one_launch.warm(model.layers, runner.dtype, runner.block_size)
        except Exception as e:  # the decode graphs' pass compiles it then
            logger.warning("compiling the layer kernel ahead failed: %r", e)

    thread = threading.Thread(target=compile_it, name="nanovllm-layer-kernel", daemon=True)
    thread.start()
    return thread


def _largest_prefill(runner) -> None:
    """The largest prefill the token budget allows, its logits, and sampling its batch."""
    cfg = runner.config
    seq_len = min(cfg.max_model_len, cfg.max_num_batched_tokens)
    num_seqs = max(1, min(cfg.max_num_batched_tokens // seq_len, cfg.max_num_seqs))
    n = num_seqs * seq_len
    input_ids = torch.zeros(n, dtype=torch.int32, device=runner.device)
    positions = (torch.arange(n, device=runner.device) % seq_len).int()
    cu = torch.arange(0, n + 1, seq_len, dtype=torch.int32, device=runner.device)
    set_context(is_prefill=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=seq_len,
                max_seqlen_k=seq_len)
    runner.model.compute_logits(runner.model(input_ids, positions))
    reset_context()
    if runner.rank == 0:
        warm_sampler(runner, min(cfg.max_num_seqs, 512), 1.0, torch.float32)


def compile_kernels(runner, graphs=None) -> None:
    """Run real prefills (short and long) and sampling so every kernel variant is compiled
    before the first request, not in the middle of someone's generate. graphs (DecodeGraphs
    not yet captured): their steps' kernels compile in the same parallel pass (on a fresh
    H100, a pass of its own after this one took the decode graphs' ~10 s of start-up)."""
    if runner.device.type != "cuda":
        return
    with compile_ahead() as ahead:
        if ahead:
            warm_prefills(runner)
            if runner.rank == 0:
                for rows in (1, 8, 64):  # the sampler's three variants
                    warm_sampler(runner, rows, 0.6, runner.dtype)
            warm_host_copies(runner)
            if graphs is not None:
                # Batch 1 runs the layer kernel: its step waits for that kernel's own compile
                # (not compiled twice); the other sizes' compiles start before.
                graphs.compile_steps(lambda bs: bs > 1)
                _join_layer_kernel(runner)
                graphs.compile_steps(lambda bs: bs == 1)
    warm_prefills(runner)
    if runner.rank == 0:
        for rows in (1, 8, 64):  # the sampler's three variants
            warm_sampler(runner, rows, 0.6, runner.dtype)
    warm_host_copies(runner)
    _join_layer_kernel(runner)  # (without decode graphs, before an eager batch-1 step)
    torch.cuda.synchronize()


def warm_host_copies(runner) -> None:
    """The step copies' kernel (kernels/host_copy.py), both ways, on scratch buffers."""
    host = torch.zeros(4, dtype=torch.int32, pin_memory=True)
    dev = torch.zeros(4, dtype=torch.int32, device=runner.device)
    copy_words(dev, host)
    copy_words(host, dev)


def _join_layer_kernel(runner) -> None:
    """Wait for _compile_layer_kernel's thread, if one runs."""
    thread = getattr(runner, "layer_kernel_compile", None)
    if thread is not None:
        thread.join()
        runner.layer_kernel_compile = None


def warm_prefills(runner) -> None:
    """Real prefills: a short one, the whole token budget, and with an fp8 cache one after
    cached tokens, which reads the cache where the others attend to their own K/V
    (attention_backend.exact_chunk).

    Every tile config and variant a run can meet compiles here: left to a request, the long
    fp8 chunk over cached tokens once compiled inside the timed bench run on an H100 (~1.8 s,
    docs/PERF_NOTES.md); the full-budget prefill also grows the caching allocator to a full
    step's size before the first request."""
    cfg = runner.config
    max_len = cfg.max_model_len - 1
    seq_len = min(max_len, cfg.max_num_batched_tokens)
    num_seqs = max(1, min(cfg.max_num_batched_tokens // seq_len, cfg.max_num_seqs))
    batches = [[(min(16, max_len), 0)], [(seq_len, 0)] * num_seqs]
    if runner.kv_scales is not None:
        # Short and long chunks over cached tokens: the two tile configs of the prefill
        # kernel reading the fp8 cache (a later chunk of a long prompt, a prefix hit).
        cached = min(16, max_len // 2)
        for n in (16, 600):
            batches.append([(min(cached + n, max_len), cached)])
    sp = SamplingParams(temperature=0.6, max_tokens=1)
    for batch in batches:
        seqs, next_block = [], 0
        for n, cached in batch:
            seq = Sequence([0] * n, sp, runner.block_size)
            need = -(-n // runner.block_size)
            # Blocks 0.. are scratch here: any block is written before it is read later.
            seq.block_table = list(range(next_block, next_block + need))
            next_block += need
            seq.num_cached_tokens = cached
            seq.num_scheduled_tokens = n - cached
            seqs.append(seq)
        if next_block <= runner.num_kvcache_blocks:
            runner.launch(seqs, True).result()


def warm_sampler(runner, rows: int, temperature: float, dtype: torch.dtype) -> None:
    """Sample once from random logits of `rows` rows (compiles that sampler variant)."""
    logits = torch.randn(rows, runner.config.hf_config.vocab_size, device=runner.device,
                         dtype=dtype)
    runner.sampler(logits, SamplingTensors(torch.full((rows,), temperature,
                                                      device=runner.device)))
