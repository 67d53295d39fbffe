import pickle

from nanovllm import SamplingParams
from nanovllm.engine.sequence import Sequence, SequenceStatus


def test_blocks_and_completion():
    seq = Sequence(list(range(40)), SamplingParams(max_tokens=5), block_size=16)
    assert seq.num_blocks == 3 and seq.last_block_num_tokens == 8
    assert seq.block(2) == list(range(32, 40))
    seq.append_token(7)
    assert seq.completion_token_ids == [7] and seq.num_prompt_tokens == 40 and len(seq) == 41
    assert seq.status == SequenceStatus.WAITING


def test_pickle_ships_only_scheduled_tokens():
    seq = Sequence(list(range(1000)), block_size=16)
    seq.block_table = list(range(63))
    seq.num_cached_tokens, seq.num_scheduled_tokens = 512, 256
    small = pickle.loads(pickle.dumps(seq))
    assert small.scheduled_token_ids() == list(range(512, 768))
    assert small.block_table == seq.block_table and small.num_tokens == 1000
    # A decode step carries just the last token.
    seq.append_token(5)
    seq.num_cached_tokens, seq.num_scheduled_tokens = 1000, 1
    blob = pickle.dumps(seq)
    assert len(blob) < 600
    assert pickle.loads(blob).scheduled_token_ids() == [5]
