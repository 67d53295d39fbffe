"""Engine steps made to fail on purpose (the engine must fail only their requests)."""
from nanovllm.engine import step_inputs


def fail_steps_of_seed(monkeypatch, seed: int, from_step: int, message: str) -> None:
    """Make every step that samples token `from_step` or later of a request with this seed
    raise OverflowError(message) while the host builds its inputs."""
    original = step_inputs.sampling_rows

    def sampling_rows(params, steps, *args, **kwargs):
        if any(p.seed == seed and step >= from_step for p, step in zip(params, steps)):
            raise OverflowError(message)
        return original(params, steps, *args, **kwargs)

    monkeypatch.setattr(step_inputs, "sampling_rows", sampling_rows)
