import subprocess
import sys


def test_control_plane_and_engine_loop_import_no_torch():
    # The engine loop reaches the device only through its executor, which brings torch in
    # when it is created; the scheduler, the step inputs and the engine itself never do.
    code = ("import sys\n"
            "import nanovllm.engine.sequence, nanovllm.engine.block_manager, "
            "nanovllm.engine.scheduler, nanovllm.engine.stop_rules, nanovllm.sampling_params, "
            "nanovllm.config, nanovllm.model_config, "
            "nanovllm.engine.step_inputs, nanovllm.engine.executor, nanovllm.engine.tokenizer, "
            "nanovllm.engine.llm_engine, nanovllm.engine.prompts, nanovllm.engine.logprobs, "
            "nanovllm.engine.request_outputs, "
            "nanovllm.outputs, nanovllm.engine.async_llm, nanovllm.engine.text_stream, "
            "nanovllm.engine.request_stream, nanovllm.engine.core_reader, "
            "nanovllm.engine.engine_core, nanovllm, nanovllm.engine.data_parallel\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
