"""The README's scripts run on a machine without any downloaded model (CPU)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script", ["example.py", "examples/streaming_steps.py",
                                    "examples/tensor_parallel.py", "examples/data_parallel.py"])
def test_script_falls_back_to_the_demo_model(script, tmp_path):
    env = dict(os.environ, HOME=str(tmp_path), TMPDIR=str(tmp_path), CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.pop("NANOVLLM_MODEL", None)
    out = subprocess.run([sys.executable, os.path.join(ROOT, script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RANDOM-WEIGHT demo model" in out.stdout
    assert os.path.isfile(tmp_path / "nanovllm-demo-qwen3" / "config.json")
