"""Speculative decoding's control plane: n-gram drafts, the configuration, and the rules a
scheduler follows (drafts never overshoot max_tokens nor take blocks others need). No torch."""
import pytest

from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.ngram import propose_ngram
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.speculation import SpecStats, Speculator, take_verified
from nanovllm.sampling_params import SamplingParams
from nanovllm.spec_config import SpeculativeConfig

NGRAM = {"method": "ngram", "num_speculative_tokens": 4}


def seq_of(tokens, **sp) -> Sequence:
    return Sequence(tokens, SamplingParams(**sp), block_size=16)


def test_ngram_takes_what_followed_the_latest_longest_match():
    # "1 2 3" recurs twice; the latest occurrence is followed by 7 8, the earlier by 4 5.
    s = seq_of([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3])
    assert propose_ngram(s, 2, 4, 3) == [7, 8, 6]
    assert propose_ngram(s, 2, 4, 1) == [7]
    # A longer match wins over a later shorter one: "0 2 3" occurs once, earlier.
    s = seq_of([0, 2, 3, 5, 1, 2, 3, 6, 0, 2, 3])
    assert propose_ngram(s, 2, 3, 2) == [5, 1]


def test_ngram_respects_the_minimum_and_proposes_nothing_without_a_match():
    s = seq_of([5, 6, 7, 1, 9, 7])  # only the last token (7) recurs: a 1-gram
    assert propose_ngram(s, 2, 4, 3) == []
    assert propose_ngram(s, 1, 4, 3) == [1, 9, 7]
    assert propose_ngram(seq_of([1, 2, 3, 4]), 1, 4, 3) == []


def test_ngram_index_follows_appended_tokens():
    """The incremental index proposes what a fresh search over the same tokens would."""
    s = seq_of([3, 1, 4, 1, 5, 9, 2, 6])
    for t in [5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]:
        s.append_token(t)
        fresh = seq_of(s.token_ids)
        assert propose_ngram(s, 1, 3, 4) == propose_ngram(fresh, 1, 3, 4)


def test_config_validation_names_the_key():
    cfg = SpeculativeConfig.from_dict(NGRAM)
    assert (cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (4, 2, 4)
    cases = [({"num_speculative_tokens": 4}, "method"),
             ({"method": "ngram"}, "num_speculative_tokens"),
             ({**NGRAM, "num_speculative_tokens": 0}, "num_speculative_tokens"),
             ({**NGRAM, "prompt_lookup_min": 5, "prompt_lookup_max": 3}, "prompt_lookup_min"),
             ({**NGRAM, "lookahead": 3}, "lookahead"),
             ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
             ({**NGRAM, "disable_by_batch_size": 0}, "disable_by_batch_size"),
             ("ngram", "speculative_config")]
    for d, key in cases:
        with pytest.raises(ValueError, match=key):
            SpeculativeConfig.from_dict(d)


def test_drafts_never_overshoot_max_tokens_or_max_model_len():
    bm = BlockManager(8, 16)
    spec = Speculator(SpeculativeConfig.from_dict(NGRAM), bm, max_model_len=40)
    s = seq_of([1, 2, 3] * 5, max_tokens=3)  # 15 tokens, a perfect repeat
    bm.allocate(s)
    s.num_cached_tokens = s.num_tokens - 1
    s.append_token(1)
    s.append_token(2)  # 2 of 3 generated: only the last token may come, so no drafts
    assert spec.draft(s, spare=10, keep=0) == 0 and s.spec_token_ids == []
    s = seq_of([1, 2, 3] * 12, max_tokens=100)  # 36 tokens, max_model_len 40
    bm.allocate(s)
    assert spec.draft(s, spare=10, keep=0) == 3  # 36 + 3 drafts + 1 token = 40
    assert s.spec_token_ids == [1, 2, 3] and s.num_scheduled_tokens == 4


def test_drafts_leave_free_blocks_to_others():
    bm = BlockManager(3, 16)
    spec = Speculator(SpeculativeConfig.from_dict(NGRAM), bm, max_model_len=100)
    s = seq_of([1, 2, 3, 4] * 4)  # 16 tokens: one full block, the drafts need a second
    bm.allocate(s)
    assert spec.draft(s, spare=10, keep=2) == 0  # the two free blocks are kept
    assert spec.draft(s, spare=10, keep=1) == 4 and len(s.block_table) == 2


def test_take_verified_stops_at_the_first_ending_token():
    s = seq_of([1, 2, 3], max_tokens=10, stop_token_ids=[7])
    s.num_cached_tokens = 2
    s.spec_token_ids = [4, 7, 5]
    s.append_pending()
    stats = SpecStats()
    reason, stop = take_verified(s, [4, 7, 5, 6], {0}, 100, stats)
    assert (reason, stop) == ("stop", 7)
    assert s.completion_token_ids == [4, 7]  # 5 and 6 come after the stop token
    assert (stats.proposed, stats.accepted, stats.steps) == (3, 3, 1)
    assert (s.num_spec_proposed, s.num_spec_accepted) == (3, 3)
