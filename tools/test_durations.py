"""The slowest test files of a pytest run: per-file totals of `--durations=0` output.

    python -m pytest -q -m "not gpu" --durations=0 > run.txt; python tools/test_durations.py run.txt
"""
import collections
import re
import sys


def file_totals(lines) -> collections.Counter:
    """Seconds per test file: setup + call + teardown of its tests."""
    totals: collections.Counter = collections.Counter()
    for line in lines:
        m = re.match(r"\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+?)::", line)
        if m:
            totals[m.group(2)] += float(m.group(1))
    return totals


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        totals = file_totals(f)
    for path, seconds in totals.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 10):
        print(f"{seconds:7.1f} s  {path}")
    print(f"{sum(totals.values()):7.1f} s  in all")
