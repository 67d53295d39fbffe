"""get_rope: one cos/sin table shared by a model's layers, gone with the last model using it."""
import gc
import weakref

from nanovllm.layers import rotary_embedding
from nanovllm.layers.rotary_embedding import get_rope


def test_layers_share_one_table_and_it_dies_with_them():
    a, b = get_rope(16, 64, 10000.0), get_rope(16, 64, 10000.0)
    assert a is b and get_rope(16, 64, 5000.0) is not a
    assert a.cos_sin_cache.shape == (64, 1, 16)
    # No process-wide copy outlives its model: a table kept after its engine (2 MiB) pinned
    # the allocator segment of a freed KV cache on a GPU, starving the next engine.
    table = weakref.ref(a.cos_sin_cache)
    del a, b
    gc.collect()
    assert table() is None
    assert not any(k[:3] == (16, 64, 10000.0) for k in rotary_embedding._ROPES.keys())
