"""Lists the import cycles between the modules of a package (standard library only).

    python tools/import_cycles.py [PACKAGE_DIR]        exit 1 when there is a cycle
    python tools/import_cycles.py --folders [PACKAGE_DIR]  the same between folders
    python tools/import_cycles.py --graph [PACKAGE_DIR] the whole graph

Every import counts, also one inside a function or under TYPE_CHECKING: a cycle
hidden in a function is still two modules that cannot be understood apart.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys


def module_name(root: str, path: str) -> str:
    relative = os.path.relpath(path, os.path.dirname(root))[:-len(".py")]
    parts = relative.split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: str, name: str, modules: set[str]) -> set[str]:
    """The package's modules that the module at `path` imports."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from a.b import c`: c is a module or a name defined in a.b.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            # `import a.b.c` of a name that is no module: the longest module prefix.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(root: str) -> dict[str, set[str]]:
    paths = {}
    for directory, _, files in os.walk(root):
        for file in files:
            if file.endswith(".py") and not file.endswith(("_pb2.py", "_pb2_grpc.py")):
                path = os.path.join(directory, file)
                paths[module_name(root, path)] = path
    modules = set(paths)
    return {name: imports_of(path, name, modules) for name, path in paths.items()}


def folders(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between the package's folders (and its top-level modules)."""
    def folder(name: str) -> str:
        return ".".join(name.split(".")[:2])

    collapsed: dict[str, set[str]] = {}
    for name, targets in edges.items():
        collapsed.setdefault(folder(name), set()).update(
            folder(t) for t in targets if folder(t) != folder(name))
    return collapsed


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?",
                        default=os.path.join(os.path.dirname(os.path.dirname(
                            os.path.abspath(__file__))), "tensorflow_elastic"))
    parser.add_argument("--graph", action="store_true", help="print every module's imports")
    parser.add_argument("--folders", action="store_true",
                        help="between folders (tensorflow_elastic.strategy, ...), not modules")
    args = parser.parse_args(argv)
    edges = graph(os.path.abspath(args.package))
    if args.folders:
        edges = folders(edges)
    if args.graph:
        for name in sorted(edges):
            print(f"{name}: {', '.join(sorted(edges[name])) or '-'}")
        return 0
    found = cycles(edges)
    for component in found:
        print("cycle: " + " <-> ".join(component))
    print(f"{len(edges)} {'folders' if args.folders else 'modules'}, {len(found)} import cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
