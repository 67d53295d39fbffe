"""Random JSON schemas for the structured-output tests: nested objects, arrays, enums,
bounded numbers and strings, required fields. Every value is bounded (string lengths, array
sizes, number ranges, depth), so a grammar-constrained output always ends, even from a
random-weight model (strings take a bounded pattern: see random_schema)."""
import random


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """One schema; objects nest at most two levels below the root."""
    kinds = ["integer", "number", "string", "boolean", "enum", "array"]
    if depth < 2:
        kinds += ["object"] * 2
    kind = "object" if depth == 0 else rng.choice(kinds)
    if kind == "object":
        names = rng.sample(["id", "name", "city", "age", "tags", "ok", "score", "meta"],
                           rng.randint(1, 3 if depth else 4))
        props = {n: random_schema(rng, depth + 1) for n in names}
        required = [n for n in names if rng.random() < 0.6]
        schema = {"type": "object", "properties": props}
        if required:
            schema["required"] = required
        return schema
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "number":
        lo = rng.choice([-10.5, 0, 1.25, 3])
        return {"type": "number", "minimum": lo, "maximum": lo + rng.choice([1, 10, 99.5])}
    if kind == "string":
        # A pattern bounds the length; minLength/maxLength are not used: xgrammar (0.2.8)
        # lets such strings hold raw control characters, which strict JSON rejects (a
        # random-weight model finds them at once).
        low, high = rng.randint(0, 2), rng.randint(2, 5)
        return {"type": "string", "pattern": f"^[a-z0-9 ]{{{low},{high}}}$"}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 7, None, True], rng.randint(1, 4))}
    item = random_schema(rng, 2)  # scalar items keep arrays short
    return {"type": "array", "items": item, "minItems": rng.randint(0, 1),
            "maxItems": rng.randint(1, 3)}


def random_schemas(count: int, seed: int = 0) -> list[dict]:
    """`count` schemas from a seeded generator (the same every run)."""
    rng = random.Random(seed)
    return [random_schema(rng) for _ in range(count)]
