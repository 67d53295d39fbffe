"""The environment of a script a test runs as a user would."""
import os

from nanovllm.utils.process import START_METHOD_VAR


def user_env(**extra: str) -> dict:
    """This process's environment plus extra, without the start method tests/conftest.py
    chose for the suite's own children: scripts start theirs as users' scripts do (spawn,
    the default), which keeps that path under test."""
    env = {**os.environ, **extra}
    env.pop(START_METHOD_VAR, None)
    return env


def tp_workers() -> list:
    """This process's live tensor-parallel worker children. Not all of its children: other
    test files' engines (a shared server's engine process) may still run beside the test."""
    import multiprocessing

    return [p for p in multiprocessing.active_children() if p.name.startswith("nanovllm-tp")]
