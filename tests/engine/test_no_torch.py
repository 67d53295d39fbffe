"""The folder is the rule: engine/ is the control plane, which imports no torch and nothing
of the device side (worker/, models/, layers/, kernels/); it reaches the device only through
an executor that nanovllm.worker creates."""
import subprocess
import sys

import pytest

from tests.support.imports import imports, module_name, sources

DEVICE_SIDE = ("torch", "nanovllm.worker", "nanovllm.models", "nanovllm.layers",
               "nanovllm.kernels", "triton")
# Modules of issue 28's other half (engine-core building, data parallelism, replicas), which
# move out of engine/ there; until then they name the device side lazily.
PENDING = {"nanovllm.engine.llm_engine", "nanovllm.engine.data_parallel",
           "nanovllm.engine.replica"}


@pytest.mark.parametrize("path", sources("engine"), ids=lambda p: module_name(p))
def test_engine_imports_nothing_of_the_device_side(path):
    if module_name(path) in PENDING:
        pytest.skip("moves out of engine/ with the other half of issue 28")
    bad = sorted(m for m in imports(path)
                 if any(m == d or m.startswith(d + ".") for d in DEVICE_SIDE))
    assert not bad, f"{module_name(path)} imports {bad}"


def test_control_plane_and_engine_loop_import_no_torch():
    # The engine loop reaches the device only through its executor, which brings torch in
    # when it is created; the scheduler, the step inputs and the engine itself never do.
    code = ("import sys\n"
            "import nanovllm.engine.sequence, nanovllm.engine.block_manager, "
            "nanovllm.engine.scheduler, nanovllm.engine.stop_rules, nanovllm.sampling_params, "
            "nanovllm.config, nanovllm.model_config, nanovllm.models, "
            "nanovllm.engine.step_inputs, nanovllm.engine.sampling_rows, "
            "nanovllm.engine.block_tables, nanovllm.engine.executor, nanovllm.worker, "
            "nanovllm.utils.gguf_file, nanovllm.engine.tokenizer, "
            "nanovllm.engine.llm_engine, nanovllm.engine.prompts, nanovllm.engine.logprobs, "
            "nanovllm.engine.request_outputs, "
            "nanovllm.outputs, nanovllm.engine.async_llm, nanovllm.engine.text_stream, "
            "nanovllm.engine.request_stream, nanovllm.engine.core_reader, "
            "nanovllm.engine.engine_core, nanovllm, nanovllm.engine.data_parallel\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
