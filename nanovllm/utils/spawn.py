"""Spawned processes (engine core, TP workers, DP replicas) and the `__main__` guard they need.

A spawned child re-imports the user's script before running anything of ours. Without an
`if __name__ == "__main__":` guard, that import creates the engine again, inside the child;
multiprocessing then refuses to start a grandchild with a long generic message, and the parent
only sees a child that exited while starting. Both sides here name the guard instead.
"""
import multiprocessing as mp

GUARD_HINT = ('if this runs from a script, put the code that creates the engine under '
              '`if __name__ == "__main__":` (nanovllm starts spawned processes, and each one '
              're-imports the script; see examples/tensor_parallel.py)')


def spawn_context(what: str):
    """multiprocessing's spawn context; RuntimeError naming the guard when called while a
    spawned child is still importing the main script (the engine created at top level)."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(f"{what} was created while a spawned nanovllm process was importing "
                           f"the main script; {GUARD_HINT}")
    return mp.get_context("spawn")  # CUDA cannot be forked into a child
