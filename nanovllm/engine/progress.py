"""generate()'s progress bar: requests done, and the last prefill and decode speeds."""
from tqdm.auto import tqdm


class Progress:
    """A tqdm bar over a batch's requests (disabled unless use_tqdm)."""

    def __init__(self, total: int, use_tqdm: bool):
        self.bar = tqdm(total=total, desc="Generating", dynamic_ncols=True, disable=not use_tqdm)
        self.prefill_tps = self.decode_tps = 0.0

    def step(self, num_tokens: int, seconds: float) -> None:
        """A step of num_tokens tokens (> 0 prefill, < 0 decode, 0 unknown) took seconds."""
        if num_tokens > 0:
            self.prefill_tps = num_tokens / seconds
        elif num_tokens < 0:
            self.decode_tps = -num_tokens / seconds
        else:
            return
        # refresh=False: redraw at tqdm's own pace, not on every step.
        self.bar.set_postfix(prefill=f"{self.prefill_tps:.0f}tok/s",
                             decode=f"{self.decode_tps:.0f}tok/s", refresh=False)

    def done(self, n: int) -> None:
        """Count n requests as finished."""
        self.bar.update(n)

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()
