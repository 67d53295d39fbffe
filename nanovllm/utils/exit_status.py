"""How a child process ended, in the words error messages use (no torch here)."""
import signal


def exit_description(code: int | None) -> str:
    """How a process ended, from its exit code (None: unknown, e.g. reaped elsewhere)."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"
