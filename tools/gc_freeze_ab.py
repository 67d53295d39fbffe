"""bench.py with the engine core's gc.freeze() on or off, and the collector's full passes timed.

    GC_FREEZE=0 python tools/gc_freeze_ab.py --model-shape qwen2.5-0.5b   # freeze a no-op
    GC_FREEZE=1 python tools/gc_freeze_ab.py --model-shape qwen2.5-0.5b   # as shipped

Prints bench.py's figures, then every generation-2 pass's ms, and those inside the timed
generate (bench.py's second LLM.generate call).
"""
import gc
import os
import runpy
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanovllm import LLM  # noqa: E402

PASSES: list[float] = []  # ms of each generation-2 pass
_started = [0.0]


def _on_gc(phase: str, info: dict) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        PASSES.append(round((time.perf_counter() - _started[0]) * 1e3, 1))


def main():
    """Patch gc.freeze (GC_FREEZE=0), time the full passes, run bench.py with the arguments."""
    if os.environ.get("GC_FREEZE", "1") == "0":
        gc.freeze = lambda: None
    gc.callbacks.append(_on_gc)
    generate, calls, timed = LLM.generate, [0], []

    def counted(self, *args, **kwargs):
        calls[0] += 1
        before = len(PASSES)
        try:
            return generate(self, *args, **kwargs)
        finally:
            if calls[0] == 2:
                timed.extend(PASSES[before:])

    LLM.generate = counted
    sys.argv = ["bench.py", *sys.argv[1:]]
    try:
        runpy.run_path(os.path.join(ROOT, "bench.py"), run_name="__main__")
    finally:
        print(f"full GC passes (ms): {PASSES}; in the timed generate: {timed}")


if __name__ == "__main__":
    main()
