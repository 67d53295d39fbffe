"""Block tables as the kernels take them: [rows, width] physical block ids, the width fixed
(max_model_len's blocks) so that every batch runs one kernel specialisation."""
import numpy as np

from nanovllm.engine.sequence import Sequence


def block_table_array(seqs: list[Sequence], width: int, rows: int | None = None) -> np.ndarray:
    """[rows, width] block ids; the width is fixed (max_model_len's blocks) so that kernels
    see one shape, and rows beyond len(seqs) are zero padding."""
    table = np.zeros((rows or len(seqs), width), dtype=np.int32)
    for i, s in enumerate(seqs):
        table[i, : len(s.block_table)] = s.block_table
    return table


class BlockTables:
    """Block-table rows kept from step to step, one per sequence: a decode step copies only
    the blocks a sequence gained since its last step (a block every block_size tokens), then
    takes the batch's rows in one numpy gather. Per step that is O(batch), not
    O(batch x context) as rebuilding every row was.

    A sequence's blocks change only by appending, except when it is preempted or prefilled
    again; prefill steps therefore rewrite their rows in full (refresh=True).
    """

    def __init__(self, capacity: int, width: int):
        self.table = np.zeros((capacity + 1, width), dtype=np.int32)
        self.pad_row = capacity  # stays all zeros: the rows of padding
        self.row_of: dict[int, int] = {}
        self.filled = [0] * capacity  # valid entries of each row
        self.free = list(range(capacity - 1, -1, -1))

    def gather(self, seqs: list[Sequence], rows: int | None = None,
               refresh: bool = False) -> np.ndarray:
        """[rows, width] block ids of seqs (zero rows after them), updating stored rows."""
        idx = np.full(rows or len(seqs), self.pad_row, dtype=np.intp)
        taken = []  # the rows, set into idx at once (a numpy item set per row costs more)
        for s in seqs:
            r = self.row_of.get(s.seq_id)
            if r is None:
                r = self._new_row(s.seq_id, seqs)
            bt, have = s.block_table, self.filled[r]
            n = len(bt)
            if n != have or refresh:
                if refresh or n < have:
                    self.table[r, :n] = bt
                    self.table[r, n:have] = 0
                else:
                    self.table[r, have:n] = bt[have:]
                self.filled[r] = n
            taken.append(r)
        idx[:len(taken)] = taken
        return self.table[idx]

    def _new_row(self, seq_id: int, batch: list[Sequence]) -> int:
        if not self.free:
            # Rows of sequences outside this batch (finished, or waiting) are taken back;
            # one that returns later is simply written afresh.
            live = {s.seq_id for s in batch}
            for sid in [sid for sid in self.row_of if sid not in live]:
                r = self.row_of.pop(sid)
                self.table[r, : self.filled[r]] = 0
                self.filled[r] = 0
                self.free.append(r)
        r = self.free.pop()
        self.row_of[seq_id] = r
        return r
