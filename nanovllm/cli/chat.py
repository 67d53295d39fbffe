"""`nanovllm chat`: a terminal conversation, each reply streamed as it is generated.

Lines are read from stdin (a terminal or a pipe); the whole conversation is sent every turn
through the chat template. Replies go to stdout, everything else (the banner, notes) to
stderr, so a piped session's stdout holds only the replies, one per line.
"""
import argparse
import asyncio
import sys

from nanovllm.cli.common import CLIError, open_text, resolve_model
from nanovllm.cli.options import (add_engine_args, add_model_arg, add_sampling_args,
                                  engine_kwargs, sampling_kwargs)

HELP = "/reset clears the conversation, /exit (or Ctrl-D) quits"


def register(subparsers) -> argparse.ArgumentParser:
    """Add the chat subcommand."""
    p = subparsers.add_parser("chat", help="talk to the model in the terminal (streamed)",
                              description=__doc__ + f"\nCommands: {HELP}.",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arg(p)
    p.add_argument("--system", metavar="TEXT", help="a system message opening the conversation")
    p.add_argument("--chat-template", metavar="FILE",
                   help="a Jinja chat template file, instead of the tokenizer's")
    add_sampling_args(p, with_n=False)
    add_engine_args(p)
    p.set_defaults(func=run, log_level_default="WARNING")
    return p


def run(args: argparse.Namespace) -> int:
    """Build the engine and run the conversation until /exit or end of input."""
    from nanovllm.async_llm import AsyncLLM
    from nanovllm.sampling_params import SamplingParams

    given = sampling_kwargs(args)
    SamplingParams(**given)  # a bad option fails before the engine starts
    template = None
    if args.chat_template is not None:
        with open_text(args.chat_template, "r") as f:
            template = f.read()
    llm = AsyncLLM(resolve_model(args.model), **engine_kwargs(args))
    # Options not given take the model's generation_config.json values, as in vLLM.
    sp = SamplingParams(**{**llm.config.generation_defaults.sampling, **given})
    try:
        if template is None and not getattr(llm.tokenizer, "chat_template", None):
            raise CLIError(f"the tokenizer of {llm.config.model} has no chat template, so chat "
                           "cannot build prompts: give one with --chat-template FILE, or use "
                           "`nanovllm generate` for plain completions")
        _Session(llm, sp, template, args.system).loop()
    finally:
        llm.shutdown()
    return 0


class _Session:
    """The conversation so far and the read-reply loop."""

    def __init__(self, llm, sampling, template: str | None, system: str | None):
        self.llm, self.sampling, self.template = llm, sampling, template
        self.opening = [{"role": "system", "content": system}] if system else []
        self.history = list(self.opening)
        self.interactive = sys.stdin.isatty()

    def loop(self) -> None:
        """Read a line, answer it; stdin is read on this thread between replies (the engine
        steps on its own thread, so nothing waits on the event loop meanwhile)."""
        if self.interactive:
            print(f"Chatting with {self.llm.config.model}. {HELP}.", file=sys.stderr)
        event_loop = asyncio.new_event_loop()
        try:
            while (line := self._read()) is not None:
                text = line.strip()
                if text in ("/exit", "/quit"):
                    break
                if text == "/reset":
                    self.history = list(self.opening)
                    print("(conversation cleared)", file=sys.stderr)
                elif text.startswith("/"):
                    print(f"unknown command {text!r}: {HELP}", file=sys.stderr)
                elif text:
                    self._turn(event_loop, text)
        finally:
            event_loop.close()

    def _read(self) -> str | None:
        try:
            return input("> " if self.interactive else "")
        except EOFError:
            if self.interactive:
                print(file=sys.stderr)
            return None

    def _turn(self, event_loop: asyncio.AbstractEventLoop, text: str) -> None:
        """Send the conversation plus `text`; keep both sides only if the reply completed."""
        conversation = self.history + [{"role": "user", "content": text}]
        task = event_loop.create_task(self._stream(conversation))
        try:
            reply, finish = event_loop.run_until_complete(task)
        except KeyboardInterrupt:
            # Ctrl-C stops this reply (the request is aborted), not the session.
            task.cancel()
            try:
                event_loop.run_until_complete(task)
            except BaseException:  # noqa: BLE001 - the cancellation itself
                pass
            print("\n(reply interrupted)", file=sys.stderr)
            return
        except ValueError as e:  # e.g. the conversation outgrew --max-model-len
            print(f"error: {e} (/reset starts over)", file=sys.stderr)
            return
        if finish == "length":
            print(f"(reply cut: max_tokens={self.sampling.max_tokens} or the model length "
                  f"limit reached)", file=sys.stderr)
        self.history = conversation + [{"role": "assistant", "content": reply}]

    async def _stream(self, conversation: list[dict]) -> tuple[str, str | None]:
        pieces, finish = [], None
        async for out in self.llm.chat(conversation, self.sampling, chat_template=self.template):
            for completion in out.outputs:
                sys.stdout.write(completion.text)
                sys.stdout.flush()  # token by token, not when the buffer fills
                pieces.append(completion.text)
                finish = completion.finish_reason or finish
        sys.stdout.write("\n")
        sys.stdout.flush()
        return "".join(pieces), finish
