"""ModelRunner: the only owner of the device. Loads weights, sizes the KV cache, turns a
batch into tensors, runs the model (CUDA graphs for decode) and samples."""
import logging

import numpy as np
import torch

from nanovllm.config import Config
from nanovllm.engine.cuda_graph import DecodeGraphs, feed_tokens
from nanovllm.engine.device import resolve_device, resolve_dtype
from nanovllm.engine.kv_cache import allocate_kv_cache, allocate_kv_scales, kv_cache_dtype
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.step_inputs import BlockTables, StepInputs, decode_inputs, prefill_inputs
from nanovllm.engine.step_output import LogprobsStep, StepResult, prompt_pass
from nanovllm.engine.warmup import compile_kernels, size_activations
from nanovllm.layers.attention import Attention
from nanovllm.layers.attention_backend import choose_backend, mix_kv_wanted
from nanovllm.layers.penalties import apply_penalties, penalty_tensors
from nanovllm.layers.sampler import Sampler, SamplingTensors
from nanovllm.models import MODELS
from nanovllm.utils.clock import Clock
from nanovllm.utils.context import reset_context, set_context
from nanovllm.utils.loader import init_dummy_weights, load_model, read_kv_scales

logger = logging.getLogger(__name__)


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

        clock = Clock()
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
        clock.lap("weights")
        self.sampler = Sampler()
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.kv_dtype = kv_cache_dtype(config, self.dtype, self.device)
        fp8_kv = self.kv_dtype.itemsize == 1
        backend = choose_backend(config.attention_backend, self.device, self.block_size, fp8_kv)
        for layer in self.attn_layers:
            layer.backend = backend
        self.backend_name = backend.name
        # Block tables always have this many columns: one kernel specialisation for every batch.
        self.max_blocks_per_seq = -(-config.max_model_len // self.block_size)
        self.tables = BlockTables(2 * config.max_num_seqs, self.max_blocks_per_seq)
        self.pinned = self.device.type == "cuda"

        # The latest step's sampled ids stay here, on the device, for async scheduling: the
        # next step reads pending input tokens from them (row of each sequence: _prev_rows).
        self.sampled = torch.zeros(config.max_num_seqs, dtype=torch.int32, device=self.device)
        self._prev_rows: dict[int, int] = {}
        # The end tokens min_tokens holds back (rank 0 samples); the engine sets them.
        self.eos_ids: frozenset[int] = frozenset()
        self._id_hosts = ([torch.zeros(config.max_num_seqs, dtype=torch.int32).pin_memory()
                           for _ in range(2)] if self.pinned else [])
        self._turn = 0
        self._calibrate_kv = False  # see below: after the kernel warm-up
        size_activations(self)
        clock.lap("warm-up")
        self.kv_cache = allocate_kv_cache(config, self.attn_layers, self.kv_dtype, self.device,
                                          self.max_blocks_per_seq, log=rank == 0)
        self.num_kvcache_blocks = self.kv_cache.size(2)
        loaded = self._checkpoint_kv_scales() if fp8_kv else None
        self.kv_scales = (allocate_kv_scales(self.attn_layers, self.device, loaded)
                          if fp8_kv else None)
        # Hadamard-mixed q/k (attention_backend.hadamard_mix) only under scales calibrated
        # on mixed keys: a checkpoint's scales were measured on plain ones.
        backend.mix_kv = fp8_kv and loaded is None and mix_kv_wanted(
            self.attn_layers[0].head_dim)
        clock.lap("KV cache")
        compile_kernels(self)
        clock.lap("kernel warm-up")
        # Without checkpoint scales, the first real prefill sets them (warm-up wrote scratch).
        self._calibrate_kv = fp8_kv and loaded is None
        self.graphs = None
        if self.device.type == "cuda" and not config.enforce_eager:
            self.graphs = DecodeGraphs(self.model, min(config.max_num_seqs, 512),
                                       self.max_blocks_per_seq, hf.hidden_size, self.dtype,
                                       self.device)
            clock.lap("decode graphs")
        if rank == 0:
            logger.info("attention: %s; start-up %s", self.backend_name, clock)

    # -- set-up -----------------------------------------------------------------------------
    def _checkpoint_kv_scales(self) -> torch.Tensor | None:
        """This rank's heads of the checkpoint's k_scale/v_scale, or None (calibrate)."""
        if self.config.load_format == "dummy":
            return None
        hf = self.config.hf_config
        scales = read_kv_scales(self.config.model, hf.num_hidden_layers, hf.num_key_value_heads)
        if scales is None:
            return None
        if self.rank == 0:
            logger.info("fp8 KV cache: k/v scales from the checkpoint")
        local = self.attn_layers[0].num_kv_heads  # this rank's share
        return scales[:, :, self.rank * local:(self.rank + 1) * local]

    def release_graphs(self) -> None:
        """Destroy the decode graphs (before leaving an NCCL group: see DecodeGraphs.release)."""
        if self.graphs is not None:
            self.graphs.release(self.device)
            self.graphs = None

    # -- running ----------------------------------------------------------------------------
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

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """Upload the step's inputs, publish the attention context, run the model."""
        if inputs.is_prefill:
            ids, pos, slots, cu_q, cu_k, tables = self._upload(
                inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.cu_seqlens_q,
                inputs.cu_seqlens_k, inputs.block_tables)
            set_context(is_prefill=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                        max_seqlen_q=inputs.max_seqlen_q, max_seqlen_k=inputs.max_seqlen_k,
                        slot_mapping=slots, block_tables=tables,
                        has_cached_context=inputs.has_cached_context,
                        calibrate_kv=self._calibrate_kv)
            self._calibrate_kv = False
        else:
            n = inputs.num_seqs
            feed = inputs.feed_rows
            parts = self._upload(inputs.decode_meta, inputs.block_tables,
                                 *(() if feed is None else (feed,)))
            meta, tables = parts[0], parts[1]
            ids, pos, slots, lens, order = meta[:, :n]
            if feed is not None:
                feed_tokens(ids, parts[2][:n], self.sampled)
            set_context(is_prefill=False, slot_mapping=slots, context_lens=lens,
                        block_tables=tables[:n], decode_order=order)
        return self.model(ids, pos)

    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int] | None:
        """One engine step on this rank; rank 0 returns the sampled token ids."""
        return self.launch(seqs, is_prefill).result()

    @torch.inference_mode()
    def launch(self, seqs: list[Sequence], is_prefill: bool) -> "StepResult":
        """Start one step without waiting for the device; the sampled ids come back through
        the returned handle (rank 0) and stay on the device for the next step."""
        graphed = not is_prefill and self.graphs is not None and self.graphs.can_run(len(seqs))
        width = self.max_blocks_per_seq
        if is_prefill:
            inputs = prefill_inputs(seqs, self.block_size, width, self.tables)
        else:
            # Rows padded to a multiple of 4 (eager) keep every packed part 16-byte aligned;
            # a graph takes its full batch.
            rows = self.graphs.max_bs if graphed else -(-len(seqs) // 4) * 4
            inputs = decode_inputs(seqs, self.block_size, width, rows, self._prev_rows,
                                   self.tables)
        st = lp = None
        if self.rank == 0:
            vocab = self.config.hf_config.vocab_size
            st = SamplingTensors.from_params(
                [s.sampling_params for s in seqs], [s.num_completion_tokens for s in seqs],
                vocab, self.device)
            # Now, while self.sampled still holds the tokens that are pending on the host.
            st.penalties = penalty_tensors(seqs, self.eos_ids, self._prev_rows, self.sampled,
                                           vocab)
            lp = LogprobsStep.plan(seqs, is_prefill, inputs.prompt_rows, self._upload)
        hidden = self.graphs.run(inputs, self.sampled) if graphed else self.forward(inputs)
        logits = self.model.compute_logits(hidden)
        if inputs.prompt_rows is not None:  # on every rank: the LM head gathers across ranks
            prompt_pass(self.model, hidden, inputs.prompt_rows, lp, self._upload)
        reset_context()
        self._prev_rows = {s.seq_id: i for i, s in enumerate(seqs)}
        if self.rank != 0:
            return StepResult(None)
        n = len(seqs)
        if lp is not None:  # logprobs of the raw logits (vLLM's default): before any change
            lp.take_raw(logits)
        if st.penalties is not None:
            logits = apply_penalties(logits, st.penalties)
        self.sampled[:n].copy_(self.sampler(logits, st))
        if lp is not None:
            lp.finish(self.sampled[:n], self.pinned)
        if not self.pinned:
            return StepResult(self.sampled[:n].tolist(), logprobs=lp)
        # The step's device->host transfer (ids, and logprobs if any), waited for when asked.
        host = self._id_hosts[self._turn]
        self._turn ^= 1
        host[:n].copy_(self.sampled[:n], non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return StepResult(host[:n], done, lp)

