"""Generate with engine replicas: data parallelism (each replica on its own GPUs; on CPU, one
process each), on this host or, with --ray, as Ray actors anywhere in a Ray cluster.

    python examples/data_parallel.py [MODEL] [--dp 2] [--tp 1] [--ray]

Replicas are spawned processes, so the entry point must sit under `if __name__ == "__main__":`.
On a Ray cluster (`ray start --head` here, `ray start --address=HEAD:6379` on the others)
the same command with --ray spreads the replicas over the machines; MODEL_DIR must exist at
the same path on every machine.
"""
import argparse

from nanovllm import LLM, SamplingParams
from nanovllm.utils.toy import model_or_demo


def main():
    """Parse the command line, then generate across the data-parallel replicas."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?",
                    help="model directory, .gguf file or hub id (default: the demo model)")
    ap.add_argument("--dp", type=int, default=2, help="replicas (data_parallel_size)")
    ap.add_argument("--tp", type=int, default=1, help="GPUs per replica (tensor_parallel_size)")
    ap.add_argument("--ray", action="store_true", help="replicas as Ray actors")
    args = ap.parse_args()
    prompts = [f"Question {i}: what is {i} + {i}?" for i in range(16)]
    with LLM(model_or_demo(args.model), data_parallel_size=args.dp,
             tensor_parallel_size=args.tp,
             distributed_executor_backend="ray" if args.ray else "mp") as llm:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16))
    for out in outputs[:4]:  # in input order, whichever replica served them
        print(repr(out.prompt), "->", repr(out["text"]), out["finish_reason"])


if __name__ == "__main__":
    main()
