"""The floors' import rules, read from the sources: layers/ builds on kernels/, distributed/
and the torch-level utils only (no engine, no sampling parameters, no loader); distributed/
on utils/ only (the device side hands it what to run); and no module imports one that
imports it back."""
import pytest

from tests.support.imports import imports, module_name, sources

# What a layer may import from the package.
LAYERS_MAY_IMPORT = ("nanovllm.layers", "nanovllm.kernels", "nanovllm.distributed",
                     "nanovllm.utils.context", "nanovllm.utils.dist", "nanovllm.utils.compile")


@pytest.mark.parametrize("path", sources("layers"), ids=lambda p: module_name(p))
def test_layers_import_only_kernels_distributed_and_torch_utils(path):
    ours = [m for m in imports(path) if m == "nanovllm" or m.startswith("nanovllm.")]
    bad = sorted(m for m in ours
                 if not any(m == a or m.startswith(a + ".") for a in LAYERS_MAY_IMPORT))
    assert not bad, f"{module_name(path)} imports {bad}"


@pytest.mark.parametrize("path", sources("distributed"), ids=lambda p: module_name(p))
def test_distributed_imports_only_utils(path):
    ours = [m for m in imports(path) if m == "nanovllm" or m.startswith("nanovllm.")]
    bad = sorted(m for m in ours
                 if not m.startswith(("nanovllm.distributed", "nanovllm.utils")))
    assert not bad, f"{module_name(path)} imports {bad}"


def test_no_import_cycles():
    """No module imports, even lazily inside a function, one that imports it back."""
    modules = {module_name(p): p for p in sources()}
    # A module's own packages are being imported already when it runs: not an edge.
    graph = {name: {m for m in imports(path) if m in modules and m != name
                    and not name.startswith(m + ".")} for name, path in modules.items()}
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {[sorted(c) for c in cycles]}"


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components (iterative: no recursion limit)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = set()
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.add(m)
                        if m == node:
                            break
                    out.append(comp)
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return out
