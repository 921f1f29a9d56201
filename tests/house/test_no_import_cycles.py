"""The product has no import cycles (issue 15): every module's imports, `TYPE_CHECKING` ones included,
form a graph without a strongly connected component of more than one module.  Where a module needs a
type of one that imports it, it declares the narrow interface it uses instead (`lab/apiserver/serving.py`,
`workers/writes.py`'s `_Job`, `producer/kubevirt.py`'s `Mirror`)."""

from __future__ import annotations

import grimp

PACKAGES = ("shared", "redisio", "kubeio", "producer", "workers", "ipamgc", "lab")


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_the_product_has_no_import_cycles() -> None:
    graph = grimp.build_graph(*PACKAGES)
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for m in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(m)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.y", imported="a.z")
    assert cycles(graph) == [["a.x", "a.y"]]
