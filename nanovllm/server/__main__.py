"""Command line: `python -m nanovllm.server MODEL [options]` serves MODEL until Ctrl-C."""
import argparse
import logging
import os


def main(argv: list[str] | None = None) -> None:
    """Parse the options and run the server."""
    ap = argparse.ArgumentParser(prog="python -m nanovllm.server", description=__doc__)
    ap.add_argument("model", help="model directory (Hugging Face layout)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--api-key", default=os.environ.get("NANOVLLM_API_KEY"),
                    help="require 'Authorization: Bearer KEY' (default: $NANOVLLM_API_KEY)")
    ap.add_argument("--served-model-name", default=None,
                    help="the model name clients send (default: the model path)")
    ap.add_argument("--chat-template", default=None,
                    help="a Jinja chat template, or a file holding one (default: the "
                         "tokenizer's)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--enforce-eager", action="store_true")
    args = ap.parse_args(argv)
    template = args.chat_template
    if template is not None and os.path.isfile(template):
        with open(template) as f:
            template = f.read()
    engine_kwargs = {"tensor_parallel_size": args.tensor_parallel_size,
                     "enforce_eager": args.enforce_eager}
    for name in ("max_model_len", "max_num_seqs"):
        if getattr(args, name) is not None:
            engine_kwargs[name] = getattr(args, name)
    logging.basicConfig(level=logging.INFO)
    from nanovllm.server import run_server

    try:
        run_server(args.model, host=args.host, port=args.port, api_key=args.api_key,
                   served_model_name=args.served_model_name, chat_template=template,
                   **engine_kwargs)
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has stopped cleanly
        pass


if __name__ == "__main__":
    main()
