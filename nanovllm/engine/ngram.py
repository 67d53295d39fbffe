"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of the
sequence's last n tokens (n from prompt_lookup_max down to prompt_lookup_min). No model, no
torch; an index of each token's positions, extended as tokens arrive, keeps a step's search
O(candidates) rather than O(context)."""
from nanovllm.engine.sequence import Sequence

# Earlier occurrences of the last token examined per proposal (latest first): a bound on
# host time for very repetitive text, where any of them would do.
MAX_CANDIDATES = 64


class TokenIndex:
    """Where each token id occurs in one sequence (ascending), for its first `size` tokens."""

    __slots__ = ("positions", "size")

    def __init__(self):
        self.positions: dict[int, list[int]] = {}
        self.size = 0

    def extend(self, token_ids: list[int], upto: int) -> None:
        """Index tokens [size, upto)."""
        positions = self.positions
        for i in range(self.size, upto):
            t = token_ids[i]
            at = positions.get(t)
            if at is None:
                positions[t] = [i]
            else:
                at.append(i)
        self.size = upto


def propose_ngram(seq: Sequence, lo: int, hi: int, k: int) -> list[int]:
    """Up to k drafts for seq's next tokens ([] when no n-gram of >= lo tokens recurs)."""
    tokens, n = seq.token_ids, seq.num_tokens
    if k <= 0 or n < 2:
        return []
    index = seq.proposer_state
    if index is None:
        index = seq.proposer_state = TokenIndex()
    index.extend(tokens, n - 1)  # a match must end before the last token
    candidates = index.positions.get(tokens[n - 1])
    if not candidates:
        return []
    best_len, best_end = 0, -1
    for j in reversed(candidates[-MAX_CANDIDATES:]):
        length = 1
        while length < hi and length <= j and tokens[j - length] == tokens[n - 1 - length]:
            length += 1
        if length > best_len:
            best_len, best_end = length, j
            if length == hi:
                break
    if best_len < lo:
        return []
    return tokens[best_end + 1: best_end + 1 + k]
