"""The engine core's grammar service: compiles each request's grammar on a worker thread
(cached by spec, so a schema seen before is ready at once and a new one never stalls the
step loop) and gives each sequence its own xgrammar matcher, advanced with every accepted
token and asked for the next token's bitmask when the step inputs are built."""
import logging
import os
from collections import OrderedDict
from concurrent import futures

import numpy as np

from nanovllm.structured.params import StructuredOutputsParams
from nanovllm.structured.spec import to_grammar, xgrammar
from nanovllm.utils.tokenizer import unwrap_tokenizer

logger = logging.getLogger(__name__)

# Compiled grammars kept (each holds a token-mask cache: up to a few MB for a large vocab).
CACHE_SIZE = 128
# A step's mask fill goes to xgrammar's threads only from this many words (rows x words a
# row) on: handing a fill to its threads costs ~60-100 us a call (2-core CPU), while a row
# costs ~0.6 us on the calling thread at 13 words (bench.py's 400-token tokenizer) and ~5.5
# us at 1,536 (SmolLM2's 49k): 64k words is ~250 us on one thread. NANOVLLM_PARALLEL_FILL_WORDS
# overrides it (0: always threads), to measure the two on one machine.
PARALLEL_FILL_WORDS = int(os.environ.get("NANOVLLM_PARALLEL_FILL_WORDS", 1 << 16))


def _threads() -> int:
    """Threads for xgrammar's compiler and batched fills: half the cores (the other half
    runs the step loop and the tokenizer), at most 8."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class Grammars:
    """Compiled grammars by spec, and a matcher for each sequence that asks."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: set[int]):
        """vocab_size: the width of the model's logits (it may exceed the tokenizer's
        vocabulary: padding), so that bitmask rows cover every logit; eos_ids: the tokens
        that end an output, the only ones a complete grammar allows."""
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        # The grammar's own vocabulary is the tokenizer's: ids past it (the logits' padding,
        # ~100k of them for a small tokenizer on a Qwen-width head) are never allowed, and
        # giving them to xgrammar cost ~0.2 ms a row in every mask fill (30x a real row's).
        self.grammar_vocab = min(len(tokenizer), vocab_size)
        self.words = -(-self.grammar_vocab // 32)  # a bitmask row's int32 words
        # xgrammar leaves the bits past its vocabulary in the last word as they were.
        rem = self.grammar_vocab % 32
        self._tail = np.int32((1 << rem) - 1 if rem else -1)
        # xgrammar's BatchGrammarMatcher: one filling on the calling thread, one in C++
        # threads (large fills, see PARALLEL_FILL_WORDS).
        self._serial = self._parallel = None
        self.eos_ids = sorted(t for t in eos_ids if t < self.grammar_vocab)
        self._pool: futures.ThreadPoolExecutor | None = None  # started by the first request
        self._compiler = None  # xgrammar's, made on the pool's thread (it reads the vocab)
        self._cache: OrderedDict[tuple, futures.Future] = OrderedDict()

    def request(self, params: StructuredOutputsParams) -> "SequenceGrammar":
        """A sequence's grammar state for params; compiling (if this spec is new) goes on
        in the background: the sequence runs once `ready`."""
        key = params.key
        future = self._cache.get(key)
        # A failed compilation is not kept: the next request with this spec tries again.
        if future is None or (future.done() and future.exception() is not None):
            if self._pool is None:
                self._pool = futures.ThreadPoolExecutor(1, thread_name_prefix="nanovllm-grammar")
            future = self._cache[key] = self._pool.submit(self._compile, key)
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return SequenceGrammar(future, self)

    def fill(self, bitmask: np.ndarray, rows: list[int], grammars: list["SequenceGrammar"]):
        """Write into bitmask[rows[i]] (int32 words over the grammar's vocabulary, bit i of
        word w: token 32 w + i) the tokens grammars[i] allows next, in one batched call:
        ~4x cheaper than a matcher at a time, which matters on every step of a large batch."""
        if len(rows) * self.words < PARALLEL_FILL_WORDS or _threads() == 1:
            if self._serial is None:
                self._serial = xgrammar().BatchGrammarMatcher(1)
            batch = self._serial
        else:
            if self._parallel is None:
                self._parallel = xgrammar().BatchGrammarMatcher(_threads())
            batch = self._parallel
        batch.batch_fill_next_token_bitmask([g.matcher for g in grammars], bitmask, rows)
        bitmask[rows, -1] &= self._tail

    def _compile(self, key: tuple):
        """Worker thread: the compiled grammar of a spec key (the compiler made first)."""
        xgr = xgrammar()
        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(unwrap_tokenizer(self.tokenizer),
                                                      vocab_size=self.grammar_vocab,
                                                      stop_token_ids=self.eos_ids or None)
            self._compiler = xgr.GrammarCompiler(info, max_threads=_threads())
        return self._compiler.compile_grammar(to_grammar(key))

    def shutdown(self) -> None:
        """Stop the worker thread (compilations not started are dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class SequenceGrammar:
    """One sequence's grammar: its compiled grammar (maybe still compiling) and its matcher,
    which has accepted exactly the sequence's known output tokens."""

    __slots__ = ("_future", "_matcher", "service")

    def __init__(self, future: futures.Future, service: Grammars):
        """service: the Grammars it came from (which fills bitmasks for a step's rows)."""
        self._future, self._matcher, self.service = future, None, service

    @property
    def ready(self) -> bool:
        """Whether compiling is over (successfully or not: see error)."""
        return self._future.done()

    def wait(self, timeout: float) -> None:
        """Block until compiling is over or timeout seconds pass."""
        futures.wait([self._future], timeout)

    def error(self) -> str | None:
        """Why compiling failed (once ready), or None."""
        e = self._future.exception()
        return None if e is None else f"{type(e).__name__}: {e}"

    @property
    def matcher(self):
        """The xgrammar GrammarMatcher (made on first use, once ready)."""
        if self._matcher is None:
            self._matcher = xgrammar().GrammarMatcher(self._future.result())
        return self._matcher

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False if the grammar does not allow it."""
        return self.matcher.accept_token(token_id)

    @property
    def terminated(self) -> bool:
        """Whether the grammar is complete and its end token accepted."""
        return self.matcher.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        """Forget the last num_tokens accepted tokens."""
        self.matcher.rollback(num_tokens)

    def new_sample(self) -> "SequenceGrammar":
        """A fresh state of the same grammar, for another sample of the request (n > 1)."""
        return SequenceGrammar(self._future, self.service)
