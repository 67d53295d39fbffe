"""tools/profile_bench.critical_path: what each kernel adds to a stream's busy time, with and
without overlapping launches (PDL)."""
from tools.profile_bench import critical_path


def test_serial_kernels_add_their_own_time_and_gaps_count_apart():
    added, gaps = critical_path([("a", 0.0, 2.0), ("b", 3.0, 7.0), ("a", 7.0, 8.0)])
    assert added == {"a": 3.0, "b": 4.0} and gaps == 1.0


def test_a_kernel_launched_early_adds_only_what_follows_the_previous_end():
    # b launches at 1 (PDL) but waits for a, which ends at 5: b adds 5 -> 6, not 1 -> 6.
    added, gaps = critical_path([("b", 1.0, 6.0), ("a", 0.0, 5.0)])
    assert added == {"a": 5.0, "b": 1.0} and gaps == 0.0
    assert sum(added.values()) + gaps == 6.0  # the span from the first start to the last end
