import subprocess
import sys


def test_control_plane_imports_no_torch():
    code = ("import sys\n"
            "import nanovllm.engine.sequence, nanovllm.engine.block_manager, "
            "nanovllm.engine.scheduler, nanovllm.sampling_params\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
