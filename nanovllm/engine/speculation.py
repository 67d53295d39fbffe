"""Speculative decoding on the control plane: when to speculate, the drafts of each sequence
(n-gram prompt lookup), and taking a verify step's tokens in. No torch here; the device side
verifies (worker/verify.py)."""
from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.ngram import propose_ngram
from nanovllm.engine.sequence import PLACEHOLDER, Sequence
from nanovllm.engine.stop_rules import finish_reason
from nanovllm.spec_config import SpeculativeConfig


class Speculator:
    """Decides which decode steps verify drafts and proposes them."""

    def __init__(self, spec: SpeculativeConfig, block_manager: BlockManager,
                 max_model_len: int):
        self.spec, self.block_manager, self.max_model_len = spec, block_manager, max_model_len

    def wanted(self, running) -> bool:
        """Few enough sequences run for speculation to pay (the step reads the weights
        once for several tokens only while it is bound by reading them)."""
        return 0 < len(running) <= self.spec.disable_by_batch_size

    def allowed(self, running, pending_ok: bool = False) -> bool:
        """False when some running sequence has a token in flight (unless pending_ok: the
        caller will take it first), or (draft_model: the host never sees the drafts, which
        the penalty rows would need) uses penalties or is short of min_tokens: such a step
        decodes one token per sequence."""
        for seq in running:
            sp = seq.sampling_params
            if seq.num_pending and not pending_ok:
                return False
            if self.spec.method != "ngram" and (
                    sp.penalized or seq.num_completion_tokens < sp.min_tokens):
                return False
        return True

    def draft(self, seq: Sequence, spare: int, keep: int) -> int:
        """Give seq up to k drafts to verify this step (never past max_tokens or
        max_model_len, nor into blocks others need: `keep` stay free); returns how many."""
        spec = self.spec
        # A grammar sequence is not speculated: drafts would need the grammar's mask for
        # each of their positions (a matcher walked ahead and rolled back).
        if seq.grammar is not None:
            return 0
        room = min(spec.num_speculative_tokens, spare,
                   seq.sampling_params.max_tokens - seq.num_completion_tokens - 1,
                   self.max_model_len - seq.num_tokens - 1)
        if room <= 0:
            return 0
        if spec.method == "ngram":
            drafts = propose_ngram(seq, spec.prompt_lookup_min, spec.prompt_lookup_max, room)
        else:  # a draft model makes them on the device, within the verify step
            drafts = [PLACEHOLDER] * room
        if drafts:
            held = self.block_manager.reserve(seq, seq.num_tokens + len(drafts), keep)
            drafts = drafts[: held - seq.num_tokens]
        seq.spec_token_ids = drafts
        seq.num_scheduled_tokens = 1 + len(drafts)
        return len(drafts)


def take_verified(seq: Sequence, tokens: list[int], eos_ids: set[int], max_model_len: int,
                  stats: "SpecStats") -> tuple:
    """Append a verify step's tokens (accepted drafts, then one more) one by one, as single
    steps would have, stopping at the first that ends seq; returns (finish reason, stop
    reason)."""
    drafts, seq.spec_token_ids = seq.spec_token_ids, []
    if drafts:
        stats.record(seq, len(drafts), len(tokens) - 1)
        # A draft model's cache now holds the last token and the accepted drafts it was fed
        # (drafts 1..k-1: the k-th was never its input).
        # (num_tokens counts the step's pending token: the last token sits at num_tokens - 2.)
        seq.num_draft_cached = seq.num_tokens - 1 + min(len(tokens) - 1, len(drafts) - 1)
    seq.fill_pending(tokens[0])
    reason, stop_reason = finish_reason(seq, tokens[0], eos_ids, max_model_len)
    for token_id in tokens[1:]:
        if reason is not None:
            break
        # The token before this one was an accepted draft: its K/V are in the cache.
        seq.num_cached_tokens += 1
        seq.append_token(token_id)
        reason, stop_reason = finish_reason(seq, token_id, eos_ids, max_model_len)
    return reason, stop_reason


class SpecStats:
    """Speculative decoding's engine-wide counts: drafts proposed and accepted, and the
    verify steps that carried drafts."""

    def __init__(self):
        self.proposed = self.accepted = self.steps = 0

    def record(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """One sequence's drafts were verified (its own counts too)."""
        seq.num_spec_proposed += proposed
        seq.num_spec_accepted += accepted
        seq.num_spec_steps += 1
        self.proposed += proposed
        self.accepted += accepted
        self.steps += 1

    def as_dict(self) -> dict:
        """Counts, the acceptance rate and the mean tokens a verify step gains."""
        return dict(spec_proposed=self.proposed, spec_accepted=self.accepted,
                    spec_verify_steps=self.steps,
                    spec_acceptance_rate=self.accepted / self.proposed if self.proposed else 0.0,
                    spec_mean_accepted_length=(1 + self.accepted / self.steps
                                               if self.steps else 0.0))
