"""The structured-output waiting room: requests whose grammar is still compiling (on the
grammar service's thread) wait here, outside the scheduler, and are queued once it is ready,
or ended once it has failed. No torch here."""
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence, SequenceStatus

# With nothing to run but requests whose grammar compiles, a step waits this long for one.
COMPILE_POLL_S = 0.01


class CompilingRequests:
    """Requests (first samples) waiting for their grammar, in arrival order."""

    def __init__(self):
        self._seqs: list[Sequence] = []

    def __bool__(self) -> bool:
        return bool(self._seqs)

    def add(self, seq: Sequence) -> None:
        """Wait for seq's grammar (seq.grammar, already requested from the service)."""
        self._seqs.append(seq)

    def abort(self, request_ids: set[int]) -> list[Sequence]:
        """End the waiting requests with these ids (finish_reason "abort"); returns them."""
        aborted = [s for s in self._seqs if s.request_id in request_ids]
        self._seqs = [s for s in self._seqs if s.request_id not in request_ids]
        for seq in aborted:
            _end_unscheduled(seq, "abort")
        return aborted

    def clear(self) -> None:
        """Forget every waiting request (the front end gave them up)."""
        self._seqs = []

    def admit(self, scheduler: Scheduler, in_flight: bool) -> list[Sequence]:
        """Queue the requests whose grammar is ready; end those whose grammar failed to
        compile (finish_reason "error") and return them. With nothing else to do (scheduler
        idle, no step in flight), wait a little for one."""
        waiting, failed = [], []
        for seq in self._seqs:
            if not seq.grammar.ready:
                waiting.append(seq)
            elif (error := seq.grammar.error()) is None:
                scheduler.add(seq)
            else:
                _end_unscheduled(seq, "error", f"compiling the grammar failed: {error}")
                failed.append(seq)
        self._seqs = waiting
        if waiting and scheduler.is_finished() and not in_flight:
            waiting[0].grammar.wait(COMPILE_POLL_S)  # rather than spinning through step()
        return failed


def _end_unscheduled(seq: Sequence, reason: str, stop_reason: str | None = None) -> None:
    """End a request that never reached the scheduler (it holds no blocks)."""
    seq.status = SequenceStatus.FINISHED
    seq.finish_reason, seq.stop_reason = reason, stop_reason
