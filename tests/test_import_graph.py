"""xmatch's modules import each other without cycles, and its packages in layers.

A cycle through an import inside a function is still a cycle: such an import usually exists
only to dodge the circular import, and it hides which module owns the shared piece. Imports
under ``if TYPE_CHECKING:`` never run and are left out.

The layers (docs/components.md, "Architecture"): the library packages ``core``, ``io``,
``model``, ``components``, ``regions``, ``data``, then the applications ``extract``, ``eval``,
``scenes``, ``train``, ``index``, ``demo``, ``cli``. A package imports only packages before it in
that order, in functions too; none imports the public modules at the top (``xmatch``,
``xmatch.plugin``, ``xmatch.testing``), which are made of them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "xmatch"
LAYERS = ("core", "io", "model", "components", "regions", "data",  # the library
          "extract", "eval", "scenes", "tabletop", "signs", "train", "index", "demo", "serve", "cli")  # the applications
#: what ``import xmatch`` may load: build's needs, none of the applications or regions
IMPORT_BUDGET = 25


def module_files(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """``{module name: (file, is a package)}`` for every module of xmatch (the zoo data folder,
    a link to the repository's ``zoo/``, holds no modules)."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The xmatch modules an import statement loads (a name imported from a package counts as
    its submodule when there is one)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    targets = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            targets.append(name)
    return targets


def import_graph(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """``{module: {imported module: "module-level" or "deferred"}}`` over xmatch's modules."""
    modules = module_files(root)
    known = set(modules)
    graph: dict[str, dict[str, str]] = {name: {} for name in modules}

    for name, (path, is_package) in modules.items():

        class Imports(ast.NodeVisitor):
            depth = 0

            def visit_FunctionDef(self, node: ast.AST) -> None:
                self.depth += 1
                self.generic_visit(node)
                self.depth -= 1

            visit_AsyncFunctionDef = visit_FunctionDef

            def visit_If(self, node: ast.If) -> None:
                test = node.test
                if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
                    for child in node.orelse:
                        self.visit(child)
                    return
                self.generic_visit(node)

            def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
                for target in _targets(node, name, is_package, known):
                    kind = "deferred" if self.depth else "module-level"
                    if graph[name].get(target) != "module-level":
                        graph[name][target] = kind

            visit_ImportFrom = visit_Import

        Imports().visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def describe(cycle: list[str], graph: dict[str, dict[str, str]]) -> str:
    return " -> ".join(
        f"{a} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:])
    ) + f" -> {cycle[-1]}"


def test_xmatch_imports_have_no_cycles():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, (
        "import cycle among xmatch's modules: " + describe(cycle, graph)
        + ". Move the piece both modules need into the module it belongs to (or a new small one)."
    )


def test_the_graph_sees_module_level_and_deferred_imports():
    graph = import_graph()
    assert graph["xmatch.io.hub"]["xmatch.core.sources"] == "module-level"
    assert graph["xmatch.model.factory"]["xmatch.io.hub"] == "deferred"  # fetched only for pretrained weights
    assert graph["xmatch"]["xmatch.core.registry"] == "module-level"  # from xmatch.core.registry import register_model


def layer_of(module: str) -> str | None:
    """The layer package of an xmatch module (``xmatch.io.hub`` -> ``io``), None for the public
    modules at the top (``xmatch``, ``xmatch.plugin``, ``xmatch.testing``, ``xmatch.__main__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def upward_imports(graph: dict[str, dict[str, str]]) -> list[str]:
    """Every import of a layer package that reaches a later layer or a public top module."""
    bad = []
    for module, targets in sorted(graph.items()):
        layer = layer_of(module)
        if layer is None:
            continue
        for target, kind in sorted(targets.items()):
            other = layer_of(target)
            if other == layer:
                continue
            if other is None or LAYERS.index(other) > LAYERS.index(layer):
                bad.append(f"{module} -> {target} ({kind})")
    return bad


def test_packages_import_only_the_layers_below_them():
    bad = upward_imports(import_graph())
    assert not bad, (
        "imports against the layers (" + " < ".join(LAYERS) + "; the top modules xmatch, xmatch.plugin, "
        "xmatch.testing are made of the layers, never imported by them):\n" + "\n".join(bad)
        + "\nMove the shared piece down into the layer that owns it."
    )


def test_every_package_has_a_layer():
    packages = {name.split(".")[1] for name, (_, is_package) in module_files().items() if is_package and name.count(".") == 1}
    assert packages == set(LAYERS), f"give {sorted(packages ^ set(LAYERS))} a place in LAYERS (or remove it from there)"


def test_the_layer_check_reports_upward_and_top_imports():
    graph = {
        "xmatch.core.spec": {"xmatch.model.model": "deferred"},
        "xmatch.eval.suite": {"xmatch.data.base": "module-level", "xmatch.train.run": "deferred"},
        "xmatch.index.search": {"xmatch": "deferred", "xmatch.index.store": "module-level"},
        "xmatch.plugin": {"xmatch.components.poolers": "module-level"},
    }
    assert upward_imports(graph) == [
        "xmatch.core.spec -> xmatch.model.model (deferred)",
        "xmatch.eval.suite -> xmatch.train.run (deferred)",
        "xmatch.index.search -> xmatch (deferred)",
    ]


def test_import_xmatch_loads_only_what_build_needs():
    code = (
        "import sys, xmatch\n"
        "print(' '.join(sorted(m for m in sys.modules if m == 'xmatch' or m.startswith('xmatch.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded = out.stdout.split()
    assert len(loaded) <= IMPORT_BUDGET, f"import xmatch loads {len(loaded)} xmatch modules: {loaded}"
    applications = [m for m in loaded if layer_of(m) in ("regions", "scenes", "tabletop", "signs", "index", "train", "eval", "extract", "demo", "cli")]
    assert applications == [], f"import xmatch loads {applications}: register them lazily (xmatch.core.builtins)"
    assert not any(m.startswith("xmatch.components.") for m in loaded), "components are imported on first use"


def test_a_checkout_imports_without_an_install(tmp_path):
    # the source tree alone (another copy may be installed: the checkout's own files must win)
    code = "import xmatch, pathlib; print(pathlib.Path(xmatch.__file__).parent); print(len(xmatch.list_models()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PATH": "", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    folder, count = out.stdout.split()
    assert Path(folder) == ROOT / PACKAGE and int(count) >= 10


def test_find_cycle_reports_the_cycle():
    graph = {"a": {"b": "module-level"}, "b": {"c": "deferred"}, "c": {"a": "module-level"}, "d": {"a": "deferred"}}
    cycle = find_cycle(graph)
    assert cycle == ["a", "b", "c", "a"]
    assert describe(cycle, graph) == "a (module-level) -> b (deferred) -> c (module-level) -> a"
    assert find_cycle({"a": {"b": "deferred"}, "b": {}}) is None


def test_relative_and_package_imports_resolve(tmp_path):
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from xmatch.sub import helper\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "helper.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from xmatch import other\n"
        "def f():\n    from .. import other\n"
    )
    (package / "other.py").write_text("from . import sub\n")
    graph = import_graph(tmp_path)
    assert graph["xmatch"] == {"xmatch.sub.helper": "module-level"}
    assert graph["xmatch.sub.helper"] == {"xmatch.other": "deferred"}
    assert graph["xmatch.other"] == {"xmatch.sub": "module-level"}
