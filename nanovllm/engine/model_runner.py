"""ModelRunner: the only owner of the device. Loads weights, sizes the KV cache, turns a
batch into tensors, runs the model (CUDA graphs for decode) and samples."""
import logging

import numpy as np
import torch

from nanovllm.config import Config
from nanovllm.engine.sequence import Sequence
from nanovllm.layers.attention import Attention
from nanovllm.layers.attention_backend import choose_backend
from nanovllm.layers.sampler import Sampler, SamplingTensors
from nanovllm.models import MODELS
from nanovllm.sampling_params import SamplingParams
from nanovllm.utils.context import reset_context, set_context
from nanovllm.utils.loader import init_dummy_weights, load_model

logger = logging.getLogger(__name__)

# KV cache the CPU path gets when num_kvcache_blocks is left at -1.
CPU_KV_CACHE_BYTES = 1 << 30
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(config: Config) -> torch.device:
    """config.device, or CUDA when available, else CPU."""
    name = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device={name!r} is not a device name ({e})") from e
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={name!r} but no CUDA GPU is available here: use "
                             "device='cpu' (or leave device unset to pick automatically)")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= count:
            raise ValueError(f"device={name!r} but only {count} CUDA GPU(s) are visible")
    return device


def resolve_dtype(config: Config, device: torch.device) -> torch.dtype:
    """'auto' = the checkpoint's dtype on GPU and float32 on CPU (bf16 matmuls are slow there)."""
    if config.dtype != "auto":
        return DTYPES[config.dtype]
    if device.type == "cpu":
        return torch.float32
    return DTYPES.get(str(config.hf_config.torch_dtype).replace("torch.", ""), torch.bfloat16)


class ModelRunner:
    """Runs the model for one tensor-parallel rank."""

    def __init__(self, config: Config, rank: int = 0, device: torch.device | None = None):
        self.config = config
        self.rank = rank
        hf = config.hf_config
        self.block_size = config.kvcache_block_size
        self.device = device or resolve_device(config)
        self.dtype = resolve_dtype(config, self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.manual_seed(config.seed)

        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                self.model = MODELS[hf.architecture](hf)
        finally:
            torch.set_default_dtype(default_dtype)
        if config.load_format == "dummy":
            init_dummy_weights(self.model, config.seed)
        else:
            load_model(self.model, config.model)
        self.model.eval()
        self.sampler = Sampler()
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        backend = choose_backend(config.attention_backend, self.device, self.block_size)
        for layer in self.attn_layers:
            layer.backend = backend
        self.backend_name = backend.name
        self.max_blocks_per_seq = -(-config.max_model_len // self.block_size)
        self.pinned = self.device.type == "cuda"

        self.warmup()
        self.allocate_kv_cache()
        self.warmup_kernels()
        self.use_graphs = self.device.type == "cuda" and not config.enforce_eager
        if self.use_graphs:
            self.capture_cudagraph()

    # -- set-up -----------------------------------------------------------------------------
    @torch.inference_mode()
    def warmup(self) -> None:
        """Run the largest prefill and sampling batch once, to size activation memory."""
        if self.device.type != "cuda":
            # Only the GPU sizes its KV cache from this peak; on a CPU the same 16k-token
            # prefill would cost minutes of start-up for nothing.
            return
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        cfg = self.config
        seq_len = min(cfg.max_model_len, cfg.max_num_batched_tokens)
        num_seqs = max(1, min(cfg.max_num_batched_tokens // seq_len, cfg.max_num_seqs))
        n = num_seqs * seq_len
        input_ids = torch.zeros(n, dtype=torch.int32, device=self.device)
        positions = (torch.arange(n, device=self.device) % seq_len).int()
        cu = torch.arange(0, n + 1, seq_len, dtype=torch.int32, device=self.device)
        set_context(is_prefill=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=seq_len,
                    max_seqlen_k=seq_len)
        self.model.compute_logits(self.model(input_ids, positions))
        reset_context()
        if self.rank == 0:
            rows = min(cfg.max_num_seqs, 512)
            logits = torch.randn(rows, self.config.hf_config.vocab_size, device=self.device)
            self.sampler(logits, SamplingTensors(torch.ones(rows, device=self.device)))
        torch.cuda.synchronize()

    def warmup_kernels(self) -> None:
        """Run real prefills (short and long) and sampling so every kernel variant is compiled
        before the first request, not in the middle of someone's generate."""
        if self.device.type != "cuda":
            return
        lengths = {min(16, self.config.max_model_len - 1),
                   min(600, self.config.max_model_len - 1, self.config.max_num_batched_tokens)}
        sp = SamplingParams(temperature=0.6, max_tokens=1)
        for n in lengths:
            need = -(-n // self.block_size)
            if need > self.config.num_kvcache_blocks:
                continue
            seq = Sequence([0] * n, sp, self.block_size)
            # Blocks 0.. are scratch here: any block is written before it is read later.
            seq.block_table = list(range(need))
            seq.num_scheduled_tokens = n
            self.run([seq], True)
        if self.rank == 0:
            vocab = self.config.hf_config.vocab_size
            for rows in (1, 64):
                logits = torch.randn(rows, vocab, device=self.device, dtype=self.dtype)
                self.sampler(logits, SamplingTensors(torch.full((rows,), 0.6, device=self.device)))
        torch.cuda.synchronize()

    def _kv_shape(self, num_blocks: int) -> tuple[int, ...]:
        hf = self.config.hf_config
        attn = self.attn_layers[0]
        return (2, len(self.attn_layers), num_blocks, self.block_size, attn.num_kv_heads,
                hf.head_dim)

    def allocate_kv_cache(self) -> None:
        """One tensor for every layer's K and V; each Attention gets its views."""
        cfg = self.config
        per_block = int(np.prod(self._kv_shape(1))) * torch.tensor([], dtype=self.dtype).element_size()
        if cfg.num_kvcache_blocks > 0:
            num_blocks = cfg.num_kvcache_blocks
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            stats = torch.cuda.memory_stats(self.device)
            peak, current = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
            # Budget = utilisation share of the card, minus what others and our weights use
            # (total - free) and the activation peak the warm-up measured.
            budget = total * cfg.gpu_memory_utilization - (total - free) - (peak - current)
            num_blocks = int(budget) // per_block
        else:
            most = cfg.max_num_seqs * self.max_blocks_per_seq
            num_blocks = min(CPU_KV_CACHE_BYTES // per_block, most)
        num_blocks = self._agree_on_blocks(num_blocks)
        if num_blocks < 1:
            raise ValueError("no memory left for the KV cache: raise gpu_memory_utilization or "
                             "lower max_num_batched_tokens / max_num_seqs")
        cfg.num_kvcache_blocks = num_blocks
        self.kv_cache = torch.empty(self._kv_shape(num_blocks), dtype=self.dtype, device=self.device)
        for i, layer in enumerate(self.attn_layers):
            layer.k_cache, layer.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]
        if self.rank == 0:
            logger.info("KV cache: %d blocks of %d tokens = %d tokens (%.2f GiB), attention: %s",
                        num_blocks, self.block_size, num_blocks * self.block_size,
                        num_blocks * per_block / 2**30, self.backend_name)

    def _agree_on_blocks(self, num_blocks: int) -> int:
        """Every rank must use the same number of blocks (tensor parallelism)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return num_blocks
        t = torch.tensor([num_blocks], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    # -- batch -> tensors -------------------------------------------------------------------
    def _upload(self, *parts: np.ndarray) -> list[torch.Tensor]:
        """Pack int32 arrays into one host-to-device copy; returns device views of each."""
        # Every part starts 16-byte aligned: Triton specialises kernels on pointer alignment,
        # so unaligned slices would trigger recompiles mid-run.
        sizes = [-(-p.size // 4) * 4 for p in parts]
        host = np.zeros(sum(sizes), dtype=np.int32)
        offsets = np.cumsum([0] + sizes)
        for p, o in zip(parts, offsets):
            host[o: o + p.size] = p.ravel()
        t = torch.from_numpy(host)
        if self.pinned:
            t = t.pin_memory()
        dev = t.to(self.device, non_blocking=True)
        return [dev[o: o + p.size].view(p.shape) for p, o in zip(parts, offsets)]

    def _block_table_array(self, seqs: list[Sequence], rows: int | None = None) -> np.ndarray:
        # Fixed width (max_model_len's blocks): one kernel specialisation for every batch.
        table = np.zeros((rows or len(seqs), self.max_blocks_per_seq), dtype=np.int32)
        for i, s in enumerate(seqs):
            table[i, : len(s.block_table)] = s.block_table
        return table

    def prepare_prefill(self, seqs: list[Sequence]):
        """Token ids, positions and attention context for a (chunked) prefill step."""
        bs = self.block_size
        ids, pos, slots, cu_q, cu_k = [], [], [], [0], [0]
        for s in seqs:
            start, n = s.num_cached_tokens, s.num_scheduled_tokens
            ids += s.scheduled_token_ids()
            pos += range(start, start + n)
            cu_q.append(cu_q[-1] + n)
            cu_k.append(cu_k[-1] + start + n)
            for b in range(start // bs, (start + n - 1) // bs + 1):
                first, last = max(start, b * bs), min(start + n, (b + 1) * bs)
                base = s.block_table[b] * bs - b * bs
                slots += range(base + first, base + last)
        input_ids, positions, slot_mapping, cu_seqlens_q, cu_seqlens_k, block_tables = self._upload(
            *(np.asarray(x, dtype=np.int32) for x in (ids, pos, slots, cu_q, cu_k)),
            self._block_table_array(seqs))
        max_q = max(s.num_scheduled_tokens for s in seqs)
        max_k = max(s.num_cached_tokens + s.num_scheduled_tokens for s in seqs)
        set_context(is_prefill=True, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                    max_seqlen_q=max_q, max_seqlen_k=max_k, slot_mapping=slot_mapping,
                    block_tables=block_tables,
                    has_cached_context=any(s.num_cached_tokens for s in seqs))
        return input_ids, positions

    def _decode_host(self, seqs: list[Sequence], rows: int) -> np.ndarray:
        """[4 + width, rows] int32: ids, positions, slots, context lens, then the block table."""
        bs = self.block_size
        meta = np.zeros((4, rows), dtype=np.int32)
        meta[2].fill(-1)  # padding rows write nowhere
        n = len(seqs)
        lens = np.fromiter((len(s) for s in seqs), np.int32, n)
        meta[0, :n] = [s.last_token for s in seqs]
        meta[1, :n] = lens - 1
        meta[2, :n] = [s.block_table[(m - 1) // bs] * bs + (m - 1) % bs for s, m in zip(seqs, lens)]
        meta[3, :n] = lens
        return meta

    def prepare_decode(self, seqs: list[Sequence]):
        """Token ids, positions and attention context for a decode step (eager path)."""
        n = len(seqs)
        meta = self._decode_host(seqs, -(-n // 4) * 4)  # rows padded to keep them aligned
        meta_dev, block_tables = self._upload(meta, self._block_table_array(seqs))
        input_ids, positions, slot_mapping, context_lens = meta_dev[:, :n]
        set_context(is_prefill=False, slot_mapping=slot_mapping, context_lens=context_lens,
                    block_tables=block_tables)
        return input_ids, positions

    def prepare_sample(self, seqs: list[Sequence]) -> SamplingTensors:
        """Per-row sampling settings (rank 0 only)."""
        params = [s.sampling_params for s in seqs]
        temps = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        st = SamplingTensors(temps.to(self.device, non_blocking=True),
                             all_greedy=all(p.temperature == 0 for p in params))
        if st.all_greedy:
            return st
        vocab = self.config.hf_config.vocab_size
        if any(p.top_k != -1 for p in params):
            st.top_ks = torch.tensor([p.top_k if p.top_k != -1 else vocab for p in params],
                                     device=self.device)
        if any(p.top_p < 1 for p in params):
            st.top_ps = torch.tensor([p.top_p for p in params], device=self.device)
        if any(p.min_p > 0 for p in params):
            st.min_ps = torch.tensor([p.min_p for p in params], device=self.device)
        seeded = [(i, p.seed, s.num_completion_tokens) for i, (s, p) in enumerate(zip(seqs, params))
                  if p.seed is not None and p.temperature > 0]
        st.seeds = seeded or None
        return st

    # -- running ----------------------------------------------------------------------------
    @torch.inference_mode()
    def run_model(self, input_ids: torch.Tensor, positions: torch.Tensor, is_prefill: bool):
        """Forward pass -> logits of each sequence's sampling position."""
        if is_prefill or not self.use_graphs or input_ids.size(0) > self.graph_bs[-1]:
            return self.model.compute_logits(self.model(input_ids, positions))
        return self.model.compute_logits(self._replay(input_ids.size(0)))

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int] | None:
        """One engine step on this rank; rank 0 returns the sampled token ids."""
        if is_prefill:
            input_ids, positions = self.prepare_prefill(seqs)
        elif self.use_graphs and len(seqs) <= self.graph_bs[-1]:
            input_ids, positions = self._stage_graph_inputs(seqs)
        else:
            input_ids, positions = self.prepare_decode(seqs)
        st = self.prepare_sample(seqs) if self.rank == 0 else None
        logits = self.run_model(input_ids, positions, is_prefill)
        reset_context()
        if self.rank != 0:
            return None
        # The one device->host transfer of the step.
        return self.sampler(logits, st).tolist()

    # -- CUDA graphs ------------------------------------------------------------------------
    @torch.inference_mode()
    def capture_cudagraph(self) -> None:
        """Capture decode at batch sizes 1, 2, 4, 8, 16, 32, ... sharing one memory pool."""
        cfg = self.config
        max_bs = min(cfg.max_num_seqs, 512)
        self.graph_bs = [b for b in (1, 2, 4, 8) if b <= max_bs]
        self.graph_bs += list(range(16, max_bs + 1, 16))
        if self.graph_bs[-1] < max_bs:
            self.graph_bs.append(max_bs)
        width = self.max_blocks_per_seq
        # One device buffer holds every graph input, so a step uploads with one copy.
        self.graph_buf = torch.zeros((4 + width) * max_bs, dtype=torch.int32, device=self.device)
        meta = self.graph_buf[: 4 * max_bs].view(4, max_bs)
        table = self.graph_buf[4 * max_bs:].view(max_bs, width)
        self.graph_outputs = torch.zeros(max_bs, cfg.hf_config.hidden_size, dtype=self.dtype,
                                         device=self.device)
        self.graphs, pool = {}, None
        for bs in reversed(self.graph_bs):
            set_context(is_prefill=False, slot_mapping=meta[2, :bs], context_lens=meta[3, :bs],
                        block_tables=table[:bs])
            args = meta[0, :bs], meta[1, :bs]
            self.graph_outputs[:bs] = self.model(*args)  # warm-up (compiles, autotunes)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                self.graph_outputs[:bs] = self.model(*args)
            pool = pool or graph.pool()
            self.graphs[bs] = graph
            torch.cuda.synchronize()
        reset_context()
        self.graph_max_bs = max_bs
        self.graph_meta = meta
        self.graph_host_t = torch.zeros(self.graph_buf.numel(), dtype=torch.int32).pin_memory()
        self.graph_host = self.graph_host_t.numpy()

    def release_graphs(self) -> None:
        """Destroy the decode graphs: NCCL cannot tear down a communicator that a live graph
        has captured (pytorch/pytorch#115388), so this comes before leaving the group."""
        if not self.use_graphs:
            return
        torch.cuda.synchronize(self.device)
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.use_graphs = False

    def _stage_graph_inputs(self, seqs: list[Sequence]):
        n = len(seqs)
        bs = next(b for b in self.graph_bs if b >= n)
        rows, width = self.graph_max_bs, self.max_blocks_per_seq
        host = self.graph_host  # persistent pinned mirror of graph_buf
        host[: 4 * rows] = self._decode_host(seqs, rows).ravel()
        table = host[4 * rows:].reshape(rows, width)
        table[:n] = 0
        for i, s in enumerate(seqs):
            table[i, : len(s.block_table)] = s.block_table
        # Safe to reuse the pinned buffer: the previous step's copy finished before its
        # sampled ids came back to the host.
        self.graph_buf.copy_(self.graph_host_t, non_blocking=True)
        set_context(is_prefill=False, context_lens=self.graph_meta[3, :bs])
        self._graph_step = bs
        return self.graph_meta[0, :n], self.graph_meta[1, :n]

    def _replay(self, n: int) -> torch.Tensor:
        self.graphs[self._graph_step].replay()
        return self.graph_outputs[:n]
