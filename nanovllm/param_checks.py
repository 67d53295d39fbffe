"""Value checks the request parameter classes share (SamplingParams,
StructuredOutputsParams): numbers that may be numpy scalars, text that must be valid UTF-8,
and values cut short for error messages. No torch here."""
import math
from numbers import Integral, Real


def is_int(x) -> bool:
    """An integer (numpy's too), but not a bool."""
    return isinstance(x, Integral) and not isinstance(x, bool)


def is_real(x) -> bool:
    """A real number (numpy's too) that is not NaN, and not a bool."""
    return isinstance(x, Real) and not isinstance(x, bool) and not math.isnan(x)


def check_text(field: str, text: str) -> None:
    """ValueError naming `field` unless `text` is valid Unicode that UTF-8 can encode (a lone
    surrogate such as "\\ud800", which JSON escapes can carry, cannot be tokenized)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{field} is not valid UTF-8 text: {e.reason} at character {e.start} "
                         f"({text[e.start:e.end]!r}); send well-formed Unicode") from None


def short(value, limit: int = 120) -> str:
    """repr(value), cut to `limit` characters (a 1,000-item list makes an unreadable error)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
