"""A command-line option whose value is a JSON object (--speculative-config)."""
import argparse
import json


def json_object(text: str) -> dict:
    """An option's value parsed as a JSON object (argparse reports the error)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"want a JSON object {{...}}, got {text!r}")
    return value
