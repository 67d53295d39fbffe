"""`nanovllm generate`: complete prompts offline, one JSON line per prompt, in input order."""
import argparse
import json
import sys

from nanovllm.cli import requests as reqs
from nanovllm.cli.common import CLIError, open_text, resolve_model
from nanovllm.cli.options import (add_engine_args, add_model_arg, add_sampling_args,
                                  engine_kwargs, sampling_kwargs)


DESCRIPTION = """\
Complete prompts with LLM.generate and write one JSON object per prompt, in input order, to
stdout or --output: {"prompt", "text", "token_ids", "finish_reason", "stop_reason"}, or with
n > 1 {"prompt", "outputs": [{"text", ...}, ...]}.

An --input line is {"prompt": "..."}, {"prompt_token_ids": [...]} or, for the chat template,
{"messages": [{"role": "user", "content": "..."}, ...]} (a bare JSON string is a prompt too).
It may add an "id" (echoed back) and SamplingParams fields ("max_tokens", "temperature", "n",
"stop", ...), which override the command line's for that line."""


def register(subparsers) -> argparse.ArgumentParser:
    """Add the generate subcommand."""
    p = subparsers.add_parser("generate", help="complete prompts offline (JSONL out)",
                              description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arg(p)
    p.add_argument("--prompt", "-p", action="append", default=[], metavar="TEXT",
                   help="a prompt (repeatable)")
    p.add_argument("--input", "-i", metavar="FILE.jsonl", help='requests, one JSON object per '
                   'line (see above); "-" reads stdin')
    p.add_argument("--output", "-o", metavar="FILE.jsonl", help="write here instead of stdout")
    p.add_argument("--chat", action="store_true",
                   help="send each text prompt as one user message through the chat template")
    add_sampling_args(p)
    add_engine_args(p)
    p.set_defaults(func=run, log_level_default="WARNING")
    return p


def run(args: argparse.Namespace) -> int:
    """Read and check every request, build the engine, generate, write the JSONL."""
    from nanovllm.config import Config

    model = resolve_model(args.model)
    # Options a request leaves out take the model's generation_config.json values (vLLM's
    # rule); Config is cheap to build here and checks the engine options before any input.
    sampling = {**Config.from_kwargs(model, **engine_kwargs(args)).generation_defaults.sampling,
                **sampling_kwargs(args)}
    requests = reqs.from_texts(args.prompt, sampling, args.chat)
    if args.input is not None:
        with open_text(args.input, "r") as f:
            requests += reqs.from_jsonl(f, "stdin" if args.input == "-" else args.input,
                                        sampling, args.chat)
    if not requests:
        raise CLIError("no prompts: give --prompt TEXT (repeatable) or --input FILE.jsonl")
    from nanovllm import LLM
    from nanovllm.engine.tokenizer import chat_prompt

    # Opened before the engine starts, so a bad --output path fails in a second.
    with open_text(args.output or "-", "w") as sink:
        llm = LLM(model, **engine_kwargs(args))
        try:
            prompts = [r.prompt if r.messages is None else chat_prompt(llm.tokenizer, r.messages)
                       for r in requests]
            outputs = llm.generate(prompts, [r.sampling for r in requests],
                                   use_tqdm=sys.stderr.isatty())
        finally:
            llm.shutdown()
        for request, out in zip(requests, outputs):
            sink.write(json.dumps(_record(request, out)) + "\n")
    return 0


def _record(request: reqs.Request, out) -> dict:
    """One output line: the echoed input, the prompt text, then the completion(s)."""
    record = {**request.echo, "prompt": out.prompt}
    completions = [{"text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason} for c in out.outputs]
    if request.sampling.n == 1:
        record.update(completions[0])
    else:
        record["outputs"] = completions
    return record

