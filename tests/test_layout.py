"""The rooms' import rules and the CLI's start-up promises."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_workers_never_import_dagster():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "workers").rglob("*.py") if "dagster" in _imported_modules(p)]
    assert offenders == [], f"workers/ must not import dagster: {offenders}"


def test_importing_every_worker_module_loads_no_dagster():
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "workers").rglob("*.py"))
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "assert not any(m.split('.')[0] == 'dagster' for m in sys.modules), 'dagster was imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_sky_folder_has_no_init_that_would_shadow_skypilot():
    assert not (ROOT / "sky" / "__init__.py").exists()


def test_cli_module_imports_no_torch_so_help_is_instant():
    code = "import sys; import pipelines.cli; assert 'torch' not in sys.modules and 'dagster' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_dagster_definitions_load():
    from pipelines.definitions import defs

    assert defs is not None
