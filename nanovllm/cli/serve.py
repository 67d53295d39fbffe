"""`nanovllm serve`: the OpenAI-compatible HTTP server (nanovllm.server.app.run_server)."""
import argparse
import os

from nanovllm.cli.common import CLIError, resolve_model
from nanovllm.cli.options import add_engine_args, add_model_arg, engine_kwargs


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535)")
    return port


def register(subparsers) -> argparse.ArgumentParser:
    """Add the serve subcommand."""
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server",
                              description=__doc__)
    add_model_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: "
                   "%(default)s; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=_port, default=8000, help="default: %(default)s")
    p.add_argument("--api-key", metavar="KEY", default=os.environ.get("NANOVLLM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every request (default: "
                        "$NANOVLLM_API_KEY)")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="the model name clients use (default: the model directory)")
    p.add_argument("--chat-template", metavar="TEMPLATE",
                   help="a Jinja chat template, or a file holding one (default: the "
                        "tokenizer's)")
    p.add_argument("--max-request-bytes", type=int, metavar="BYTES",
                   help="answer 413 to a request body larger than this (default: 1 MiB + 64 "
                        "bytes per token of max_model_len)")
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine in a process of its own, so serving HTTP never "
                        "slows its step loop down (default: on; --no-engine-process runs it "
                        "on a thread of the server's process)")
    add_engine_args(p)
    p.set_defaults(func=run, log_level_default="INFO")
    return p


def run(args: argparse.Namespace) -> int:
    """Import the server lazily (its web dependencies are optional) and run it."""
    try:
        from nanovllm.server.app import run_server
    except ImportError as e:
        if (e.name or "").startswith("nanovllm"):
            raise CLIError("this nanovllm has no HTTP server (nanovllm.server.app is "
                           "missing): update nanovllm to use `serve`") from None
        raise CLIError(f"`serve` needs the package {e.name!r}, which is not installed "
                       f"({e})") from None
    from nanovllm.engine.client import EngineDeadError

    template = args.chat_template
    if template is not None and os.path.isfile(template):
        with open(template) as f:
            template = f.read()
    try:
        run_server(resolve_model(args.model), host=args.host, port=args.port,
                   api_key=args.api_key, served_model_name=args.served_model_name,
                   chat_template=template, log_level=(args.log_level or "info").lower(),
                   max_request_bytes=args.max_request_bytes,
                   engine_process=args.engine_process, **engine_kwargs(args))
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has stopped cleanly
        pass
    except EngineDeadError as e:  # exit non-zero: a supervisor restarts the server
        raise CLIError(str(e)) from None
    return 0
