"""A script that creates an engine at top level, without the `__main__` guard, gets an error
that names the guard (from the spawned child and from the parent), not multiprocessing's
generic bootstrapping message alone."""
import multiprocessing as mp
import subprocess
import sys
import textwrap

import pytest

from nanovllm.utils.process import spawn_context

GUARD = 'if __name__ == "__main__":'


def test_spawn_context_refuses_inside_a_child_importing_the_script(monkeypatch):
    assert spawn_context("AsyncLLM").get_start_method() == "spawn"
    # What multiprocessing sets in a spawned child while it re-imports the main script.
    monkeypatch.setattr(mp.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match="AsyncLLM was created while") as info:
        spawn_context("AsyncLLM")
    assert GUARD in str(info.value)


def test_an_unguarded_async_llm_script_names_the_guard(toy_models, tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        from nanovllm import AsyncLLM
        engine = AsyncLLM({toy_models["tied_mha_d16"]!r}, device="cpu", dtype="float32",
                          max_model_len=64, num_kvcache_blocks=8, kvcache_block_size=16)
        engine.shutdown()
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert "EngineDeadError" in last and "exited while starting" in last and GUARD in last
    # The child's own error (printed above the parent's) names the guard too.
    assert "AsyncLLM was created while a spawned nanovllm process" in run.stderr
