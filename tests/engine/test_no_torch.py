"""The folder is the rule: nanovllm/engine/ is the control plane, importing no torch and
nothing device-side, and the layers above it import downward only, without cycles. Checked on
the source (every import statement, also those inside functions) and by importing."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "nanovllm"
# What engine/ may import from the rest of nanovllm: plain, torch-free modules.
SHARED = {"nanovllm.config", "nanovllm.model_config", "nanovllm.generation_config",
          "nanovllm.sampling_params", "nanovllm.outputs", "nanovllm.utils.process",
          "nanovllm.spec_config", "nanovllm.param_checks"}
DEVICE_LIBS = {"torch", "triton"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    """The modules a file imports (`from a import b` counts as a and a.b)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def engine_files() -> list[Path]:
    return sorted((ROOT / "engine").glob("*.py"))


def known_modules() -> set[str]:
    return {module_name(p) for p in ROOT.rglob("*.py")}


def test_engine_imports_only_the_control_plane():
    known = known_modules()
    bad = {}
    for path in engine_files():
        for name in imports(path):
            ours = name.split(".")[0] == "nanovllm"
            if ours and name not in known:
                continue  # `from package import function`
            allowed = name.startswith("nanovllm.engine") or name in SHARED
            if (ours and not allowed) or name.split(".")[0] in DEVICE_LIBS:
                bad.setdefault(path.name, []).append(name)
    assert not bad, bad


def test_engine_modules_and_the_front_ends_import_no_torch():
    names = [module_name(p) for p in engine_files()]
    names += ["nanovllm", "nanovllm.llm", "nanovllm.async_llm", "nanovllm.launch",
              "nanovllm.ray_client", "nanovllm.server.app", "nanovllm.cli"]
    code = ("import sys\n"
            f"for name in {names!r}:\n"
            "    __import__(name)\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            "assert not bad, bad[:5]\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_server_does_not_import_the_cli():
    # __main__.py is `python -m nanovllm.server`, the CLI's serve command by another name:
    # an entry point above both, not part of the server library.
    bad = {p.name: sorted(n for n in imports(p) if n.startswith("nanovllm.cli"))
           for p in (ROOT / "server").glob("*.py") if p.name != "__main__.py"}
    assert not any(bad.values()), bad


def test_the_spine_has_no_import_cycles():
    """Module-level imports of the control plane, the front ends and their process
    machinery form no cycle (lazy imports inside functions are one-way by construction)."""
    spine = [p for p in ROOT.rglob("*.py")
             if p.parent.name in ("engine", "server", "cli") or p.parent == ROOT
             or p.name == "process.py"]
    known = known_modules()
    graph = {module_name(p): {n for n in imports(p, top_level_only=True) if n in known}
             for p in spine}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if nxt not in graph or node.startswith(nxt + ".") or nxt == node:
                continue  # a package's own modules import it before it is done: no cycle
            assert state.get(nxt) != 1, " -> ".join(path + [nxt])
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])
