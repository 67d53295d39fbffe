"""A stopwatch for the start-up log."""
from time import perf_counter


class Clock:
    """Seconds spent in each start-up phase, for the log."""

    def __init__(self):
        self.t, self.laps = perf_counter(), []

    def lap(self, name: str) -> None:
        """End the phase `name` now and start the next."""
        now = perf_counter()
        self.laps.append(f"{name} {now - self.t:.1f}s")
        self.t = now

    def __str__(self) -> str:
        return ", ".join(self.laps)
