"""`python -m nanovllm.server [MODEL] [options]`: the same as `nanovllm serve`."""
import sys

from nanovllm.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    """Run `nanovllm serve` with these arguments; returns the exit code."""
    return cli_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
