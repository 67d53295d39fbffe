"""Structured output (JSON schema, regex, choice, EBNF) through xgrammar: a request's
StructuredOutputsParams (params.py, plain data), turning it into a grammar (spec.py),
compiling grammars off the step loop and keeping one matcher per sequence (grammars.py). The
engine reaches the grammars only through the objects it is handed (engine/core.py's
`grammars`, a Sequence's `grammar`), never by import: xgrammar imports torch. Importing this
package imports neither; the first structured request does (`pip install
'nanovllm[structured]'`)."""
from nanovllm.structured.spec import validate

__all__ = ["validate"]
