"""The layout holds: import-linter's contracts (pyproject.toml), no import cycles, small files and functions."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
ROOT_PACKAGES = ("workers", "resources", "assets", "pipelines")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_LOOSE_WORKER_FILES = 12


def _python_files(*rooms: str) -> list[Path]:
    return sorted(path for room in rooms for path in (REPO / room).rglob("*.py"))


def _import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative: the graph is deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
            elif child in on_stack:
                low[module] = min(low[module], index[child])
    return cycles


def test_import_linter_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint_imports)], cwd=REPO, capture_output=True, text=True)
    report = done.stdout[done.stdout.find("Contracts") :]  # after the banner
    assert done.returncode == 0, f"lint-imports found broken contracts (pyproject.toml):\n{report}{done.stderr}"


def test_no_module_is_part_of_an_import_cycle() -> None:
    graph = grimp.build_graph(*ROOT_PACKAGES, cache_dir=None)
    described = []
    for cycle in _import_cycles(graph):
        members = set(cycle)
        edges = [f"{m} -> {i}" for m in cycle for i in sorted(graph.find_modules_directly_imported_by(m) & members)]
        described.append("\n    ".join(edges))
    assert not described, "import cycles:\n    " + "\n  and\n    ".join(described)


def test_no_source_file_is_over_400_lines() -> None:
    long_files = {}
    for path in _python_files(*ROOT_PACKAGES, "tests"):
        num_lines = len(path.read_text().splitlines())
        if num_lines > MAX_FILE_LINES:
            long_files[str(path.relative_to(REPO))] = num_lines
    assert not long_files, f"files over {MAX_FILE_LINES} lines (split them by topic): {long_files}"


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's length: its body from the first statement after the docstring to the end.

    The signature is left out: a CLI command declares one formatted line per option, which is
    configuration, not logic to split into steps.
    """
    body = node.body
    first = body[0]
    if len(body) > 1 and isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        first = body[1]
    return node.end_lineno - first.lineno + 1


def test_no_function_is_over_60_lines() -> None:
    long_functions = {}
    for path in _python_files(*ROOT_PACKAGES, "tests"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                num_lines = _body_lines(node)
                if num_lines > MAX_FUNCTION_LINES:
                    long_functions[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = num_lines
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines (split into named steps): {long_functions}"


def test_workers_holds_packages_not_loose_files() -> None:
    loose = sorted(p.name for p in (REPO / "workers").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE_WORKER_FILES, (
        f"{len(loose)} loose files in workers/ (put them in a package): {loose}"
    )


def test_the_cycle_finder_reports_a_cycle_and_ignores_a_chain() -> None:
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.d")
    assert _import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
