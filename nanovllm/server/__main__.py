"""Command line: `python -m nanovllm.server MODEL [options]` serves MODEL until Ctrl-C."""
import argparse
import logging
import os

# Engine options the command line passes on to AsyncLLM (Config's names), when given.
ENGINE_OPTIONS = (("max_model_len", int), ("max_num_seqs", int),
                  ("max_num_batched_tokens", int), ("gpu_memory_utilization", float),
                  ("tensor_parallel_size", int), ("kvcache_block_size", int),
                  ("num_kvcache_blocks", int), ("device", str), ("dtype", str),
                  ("attention_backend", str), ("seed", int))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The server's options; engine options left out keep the engine's defaults."""
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
    for name, kind in ENGINE_OPTIONS:
        ap.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    ap.add_argument("--enforce-eager", action="store_true", default=None)
    ap.add_argument("--log-level", default="info")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Parse the options and run the server."""
    args = parse_args(argv)
    template = args.chat_template
    if template is not None and os.path.isfile(template):
        with open(template) as f:
            template = f.read()
    names = [name for name, _ in ENGINE_OPTIONS] + ["enforce_eager"]
    engine_kwargs = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    logging.basicConfig(level=args.log_level.upper())
    from nanovllm.server import run_server

    try:
        run_server(args.model, host=args.host, port=args.port, api_key=args.api_key,
                   served_model_name=args.served_model_name, chat_template=template,
                   log_level=args.log_level, **engine_kwargs)
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has stopped cleanly
        pass


if __name__ == "__main__":
    main()
