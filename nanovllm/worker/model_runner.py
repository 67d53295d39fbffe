"""ModelRunner: the only owner of the device. Loads weights, sizes the KV cache, stages each
step's host inputs (built by engine/step_inputs.py) in one copy, runs the model (CUDA graphs
for decode) and samples."""
import logging
from dataclasses import replace

import torch

from nanovllm.config import Config
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.step_inputs import StepBuilder, StepInputs
from nanovllm.kernels.kv_feedback import FIT_TOKENS
from nanovllm.layers.attention import Attention
from nanovllm.layers.attention_backend import choose_backend
from nanovllm.models.loader import build_model
from nanovllm.utils.clock import Clock
from nanovllm.utils.compile_ahead import prewarm
from nanovllm.utils.context import reset_context, set_context
from nanovllm.worker.cuda_graph import staged_graphs
from nanovllm.worker.device import resolve_device, resolve_dtype
from nanovllm.worker.draft import DraftProposer, draft_config
from nanovllm.worker.kv_cache import allocate_kv, kv_cache_dtype
from nanovllm.worker.logprobs import LogprobsStep, prompt_pass
from nanovllm.worker.penalties import penalty_tensors
from nanovllm.worker.piecewise_graph import PiecewiseGraphs, prefill_graph_tokens
from nanovllm.worker.late_sample import LateSample
from nanovllm.worker.sampler import Sampler, SamplingTensors
from nanovllm.worker.stager import Stager, step_copy
from nanovllm.worker.step_context import feed_tokens, prefill_context
from nanovllm.worker.step_output import HostBuffer, StepResult
from nanovllm.worker.verify import verify_drafts
from nanovllm.worker.warmup import compile_kernels, size_activations

logger = logging.getLogger(__name__)


class ModelRunner:
    """Runs the model for one tensor-parallel rank."""

    def __init__(self, config: Config, rank: int = 0, device: torch.device | None = None,
                 draft: bool = False):
        """draft: a speculative draft model's runner: its KV cache waits for finish_cache()
        (it must have the target's block count), and it never samples."""
        self.config = config
        self.rank = rank
        self.block_size = config.kvcache_block_size
        self.device = device or resolve_device(config)
        self.dtype = resolve_dtype(config, self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            prewarm()  # Triton's one-time set-up, beside the model build
        torch.manual_seed(config.seed)
        clock = Clock()
        self.model = build_model(config, self.dtype, self.device)
        clock.lap("weights")
        self.sampler = Sampler()
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.kv_dtype = kv_cache_dtype(config, self.dtype, self.device)
        backend = choose_backend(config.attention_backend, self.device, self.block_size,
                                 self.kv_dtype.itemsize == 1)
        if draft or config.speculative_config is not None:
            # A verify step's rows of one sequence read each other's new keys: they must all
            # be stored before any row attends (decode_rope's prologue stores its own only).
            backend.decode_new = None
        for layer in self.attn_layers:
            layer.backend = backend
        self.backend_name = backend.name
        # Block tables always have this many columns: one kernel specialisation for every batch.
        self.max_blocks_per_seq = -(-config.max_model_len // self.block_size)
        self.builder = StepBuilder(self.block_size, self.max_blocks_per_seq, config.max_num_seqs,
                                   config.hf_config.vocab_size if rank == 0 else None)
        self.pinned = self.device.type == "cuda"
        # The latest step's sampled ids stay here, on the device, for async scheduling: the
        # next step reads pending input tokens from them (row of each sequence: the
        # builder's prev_rows).
        self.sampled = torch.zeros(config.max_num_seqs, dtype=torch.int32, device=self.device)
        self._id_hosts = ([torch.zeros(config.max_num_seqs, dtype=torch.int32).pin_memory()
                           for _ in range(2)] if self.pinned else [])
        self._turn = 0
        self._verify_host = HostBuffer()  # a verify step's results, on their way back
        self._calibrate_kv = False  # see finish_cache: after the kernel warm-up
        self._feedback_fit_left = 0  # prefill tokens the K feedback still fits (finish_cache)
        self.kv_scales = None
        self.stager = Stager(self.device)
        self.mask_stager = Stager(self.device)  # LateSample's masks: their own buffers
        self.graphs = None
        self.prefill_graphs = None
        self._draft = draft
        # A draft model (speculative decoding) loads before our cache is sized: its weights
        # count as used memory, and each block gets room for its K/V too.
        spec = config.speculative_config
        self.drafter = None
        if not draft and rank == 0 and spec is not None and spec.method == "draft_model":
            runner = ModelRunner(draft_config(config), device=self.device, draft=True)
            self.drafter = DraftProposer(runner)
        size_activations(self)
        clock.lap("warm-up")
        self._backend, self._clock = backend, clock
        if not draft:
            self.finish_cache()

    def finish_cache(self, num_blocks: int | None = None) -> None:
        """Allocate the KV cache (num_blocks: a draft's, the target's count), warm the
        kernels up and capture the decode graphs."""
        if num_blocks is not None:
            self.config = replace(self.config, num_kvcache_blocks=num_blocks)
        extra = 0 if self.drafter is None else self.drafter.bytes_per_block
        self.kv_cache, self.kv_scales, calibrate = allocate_kv(
            self.config, self.rank, self.attn_layers, self.kv_dtype, self.device,
            self.max_blocks_per_seq, self._backend, extra)
        self.num_kvcache_blocks = self.kv_cache.size(2)
        self._clock.lap("KV cache")
        graphs = self.device.type == "cuda" and not self.config.enforce_eager
        if graphs:
            self.stager, self.graphs = staged_graphs(self.model, self.config, self.device,
                                                     self.dtype, self.sampled,
                                                     self.max_blocks_per_seq, self._draft)
        compile_kernels(self, self.graphs)
        self._clock.lap("kernel warm-up")
        # Without checkpoint scales, the first real prefill sets them (warm-up wrote scratch);
        # an fp8 K feedback is fitted to the first FIT_TOKENS prefill tokens' queries.
        self._calibrate_kv = calibrate
        if self.attn_layers[0].k_feedback is not None:
            self._feedback_fit_left = FIT_TOKENS
        if graphs:
            self.graphs.capture()
            self._clock.lap("decode graphs")
            tokens = prefill_graph_tokens(self.config)
            if tokens and not self._draft:
                self.prefill_graphs = PiecewiseGraphs(self.model, tokens, self.device)
                self._clock.lap("prefill graphs")
        if self.drafter is not None:
            self.drafter.runner.finish_cache(self.num_kvcache_blocks)
        if self.rank == 0:
            logger.info("attention: %s; start-up %s", self.backend_name, self._clock)

    # -- set-up -----------------------------------------------------------------------------
    def set_eos_ids(self, eos_ids: set[int]) -> None:
        """The end tokens min_tokens holds back (rank 0 samples; the engine sets them)."""
        self.builder.eos_ids = frozenset(eos_ids)

    def release_graphs(self) -> None:
        """Destroy the decode graphs (before leaving an NCCL group: see DecodeGraphs.release)."""
        if self.graphs is not None:
            self.graphs.release(self.device)
            self.graphs = None
        if self.prefill_graphs is not None:
            self.prefill_graphs.release()
            self.prefill_graphs = None

    # -- running ----------------------------------------------------------------------------
    @torch.inference_mode()
    def launch(self, seqs: list[Sequence], is_prefill: bool,
               late_masks: bool = False) -> "StepResult | LateSample":
        """Start one step without waiting for the device; the sampled ids come back through
        the returned handle (rank 0) and stay on the device for the next step. late_masks:
        queue the forward only, and return a LateSample that samples under the grammar
        masks the host fills meanwhile (worker/late_sample.py)."""
        # A verify step (speculative decoding) has a row per token computed.
        num_rows = len(seqs) if is_prefill else sum(s.num_scheduled_tokens for s in seqs)
        graphed = not is_prefill and self.graphs is not None and self.graphs.can_run(num_rows)
        # Rows padded to a multiple of 4 (eager) keep every row of the decode meta 16-byte
        # aligned; a graph takes its full batch.
        rows = self.graphs.max_bs if graphed else -(-num_rows // 4) * 4
        inputs = self.builder.build(seqs, is_prefill, rows, late_masks)
        dev = self.stager.upload(inputs.device_parts(), graph=graphed)  # the step's one copy
        st = lp = None
        if self.rank == 0:
            # Now, while self.sampled still holds the tokens that are pending on the host.
            pt = (None if inputs.penalties is None
                  else penalty_tensors(inputs.penalties, dev, self.sampled))
            st = SamplingTensors.from_rows(inputs.sampling, dev, pt)
            lp = None if inputs.logprobs is None else LogprobsStep(inputs.logprobs, dev)
        if inputs.spec_starts is not None and self.drafter is not None:
            self.drafter.propose(seqs, inputs, dev)  # the draft model fills the draft rows
        elif (graphed and st is not None and st.plain and lp is None and not late_masks
                and inputs.spec_starts is None and self.graphs.can_sample(num_rows)):
            self.graphs.run_sampled(num_rows)  # the whole step: forward, logits and sample
            self.builder.launched(seqs)
            return self._send(len(seqs), None)
        hidden = self.forward(inputs, dev, graphed)
        logits = self.model.compute_logits(hidden)
        if inputs.prompt_rows is not None:  # on every rank: the LM head gathers across ranks
            prompt_pass(self.model, hidden, dev["prompt_rows"], lp)
        reset_context()
        self.builder.launched(seqs)
        if self.rank != 0:
            return StepResult(None)
        if inputs.spec_starts is not None:
            if lp is not None:
                lp.take_raw(logits)
            out = verify_drafts(self.sampler, logits, st, dev["spec_drafts"][:num_rows])
            if lp is not None:  # of each row's token; the host keeps the accepted rows'
                lp.finish(out[:num_rows], self.pinned)
            rows_of = [s.num_scheduled_tokens for s in seqs]
            return self._verify_host.send(out, rows_of, lp, self.pinned)
        if late_masks:
            return LateSample(self, logits, st, lp, len(seqs), inputs.num_rows or len(seqs))
        return self._sample(logits, st, lp, len(seqs))

    def forward(self, inputs: StepInputs, dev: dict[str, torch.Tensor] | None = None,
                graphed: bool = False) -> torch.Tensor:
        """Publish the attention context of the staged inputs (staged here when `dev` is
        None) and run the model, or replay a decode graph whose inputs the stager put in
        place."""
        if dev is None:
            dev = self.stager.upload(inputs.device_parts())
        if inputs.is_prefill:
            if inputs.feed_rows is not None:  # a mixed step's decode rows with pending tokens
                feed_tokens(dev["input_ids"][:inputs.num_decode_rows], dev["feed_rows"],
                            self.sampled)
            fit = min(self._feedback_fit_left, len(inputs.input_ids))
            set_context(**prefill_context(inputs, dev, self._calibrate_kv, fit))
            # Calibration and the feedback fit run inside attention: eager steps only.
            eager = self._calibrate_kv or fit
            self._calibrate_kv = False
            self._feedback_fit_left -= fit
            ids, pos = dev["input_ids"], dev["positions"]
            if (not eager and self.prefill_graphs is not None
                    and self.prefill_graphs.can_run(len(ids))):
                return self.prefill_graphs.run(ids, pos)
            return self.model(ids, pos)
        n = inputs.num_rows
        if graphed:  # (the graph feeds the pending tokens in itself)
            return self.graphs.run(n)
        ids, pos, slots, lens, order, feed = dev["decode_meta"][:6, :n]
        if inputs.feed_rows is not None:
            feed_tokens(ids, feed, self.sampled)
        set_context(is_prefill=False, slot_mapping=slots, context_lens=lens,
                    block_tables=dev["block_tables"][:n], decode_order=order)
        return self.model(ids, pos)

    def _sample(self, logits: torch.Tensor, st: SamplingTensors, lp: LogprobsStep | None,
                n: int) -> StepResult:
        """Rank 0: sample into self.sampled, then start the ids' (and logprobs') copy back."""
        if lp is not None:  # logprobs of the raw logits (vLLM's default): before any change
            lp.take_raw(logits)
        self.sampled[:n].copy_(self.sampler(logits, st))
        if lp is not None:
            lp.finish(self.sampled[:n], self.pinned)
        return self._send(n, lp)

    def _send(self, n: int, lp: LogprobsStep | None) -> StepResult:
        """Rank 0: start the copy of sampled[:n] (and logprobs) back to the host."""
        if not self.pinned:
            return StepResult(self.sampled[:n].tolist(), logprobs=lp)
        # The step's device->host transfer (ids, and logprobs if any), waited for when asked.
        host = self._id_hosts[self._turn]
        self._turn ^= 1
        step_copy(host, self.sampled[:n])  # a kernel writes the pinned buffer
        done = torch.cuda.Event()
        done.record()
        return StepResult(host[:n], done, lp)
