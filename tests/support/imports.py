"""Static import walks over the package's sources (ast, nothing imported)."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "nanovllm")


def module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel.removesuffix(".__init__")


def sources(folder: str = "") -> list[str]:
    """Every .py file under nanovllm/<folder>."""
    out = []
    for dirpath, _, files in os.walk(os.path.join(PACKAGE, folder)):
        out += [os.path.join(dirpath, f) for f in files if f.endswith(".py")]
    return sorted(out)


def imports(path: str, top_level_only: bool = False) -> set[str]:
    """The modules a file imports (absolute names); top_level_only skips imports inside
    functions (the lazy ones, which cannot form an import-time cycle)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from nanovllm.worker import logprobs` imports a module too.
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found
