"""The package's import rules, read from the source: lm-eval is imported by ``eglr_harness/harness/`` alone (the
boundary with lm-eval), each folder imports only its own layer's modules and lower layers (``LAYERS``), no module
reaches what its folder may not import through another module (``ALLOWED``, ``FORBIDDEN``, followed
transitively), and no module imports itself through others (a cycle).

Every ``import`` statement counts, also one inside a function (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

PACKAGE = Path(__file__).resolve().parent.parent / "eglr_harness"

# The layers, lowest first: a folder imports its own modules and those of lower layers only
# (docs/architecture.md draws them). Folders in one layer do not import each other.
LAYERS: list[set[str]] = [
    {"core"},                            # types and files every layer shares
    {"decoding"},                        # the EGLR maths and both engines (hook/, continuous/)
    {"run"},                             # pools, settings, calibration, accounting, stores, presets
    {"scoring"},                         # answers: extraction, equivalence, per-problem scores
    {"data"},                            # benchmark loading (answers from scoring)
    {"analysis"},                        # saved runs -> numbers, tables, figures
    {"verify", "leaderboard", "vllm"},   # eglr-verify; the leaderboard runs lm-eval as a subprocess; the vLLM plugin
    {"harness"},                         # the lm-eval adapter: the only importer of lm_eval
    {"rl"},                              # GRPO with TRL over EGLR pools
    {"commands"},                        # one module per console script
    {"__main__"},                        # python -m eglr_harness = eglr-eval
]
LAYER_OF = {folder: rank for rank, layer in enumerate(LAYERS) for folder in layer}
# narrower rules on top of the layers
ALLOWED: dict[str, set[str]] = {
    # the decoding maths runs on bare tensors and configs: core types only, not even the run layer
    "decoding": {"core"},
    # the vLLM plugin runs inside vLLM's workers: the maths and core types, never lm-eval's side
    "vllm": {"decoding", "core"},
    # a module's own rule (keyed by its path; the names are import prefixes, the standard library aside): the
    # naive reference the engines are proven against imports nothing of them, or a shared bug would cancel out
    "decoding/naive_reference.py": {"torch", "eglr_harness.core"},
}
# reading answers and saved runs needs no model: these never import the engines
FORBIDDEN: dict[str, set[str]] = {folder: {"decoding"} for folder in ("scoring", "data", "analysis")}


def project_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module path relative to the package ('decoding/continuous/kv_slots.py') -> the top-level names it imports
    (``lm_eval``, ``torch``, and ``eglr_harness.<x>`` as ``.<x>``)."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if isinstance(node, ast.ImportFrom) and node.level:  # relative: within the module's own folder
                modules = ["eglr_harness." + ".".join(path.relative_to(package).parts[:-1])]
            for module in modules:
                parts = module.split(".")
                names.add("." + parts[1] if parts[0] == "eglr_harness" and len(parts) > 1 else parts[0])
        found[path.relative_to(package).as_posix()] = names
    return found


def module_imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """The dotted names ``path`` imports (a relative import resolved against its package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = ("eglr_harness", *path.relative_to(package).parts[:-1])
                base = ".".join(here[:len(here) - node.level + 1])
                names.add(f"{base}.{node.module}" if node.module else base)
            else:
                names.add(node.module or "")
    return names


def module_violations(imports: Mapping[str, set[str]]) -> list[str]:
    """The modules with an ALLOWED rule of their own that import past it: ``imports`` is module path -> dotted
    names (:func:`module_imports`); ``__future__`` and the standard library are always allowed."""
    bad = []
    for module, names in sorted(imports.items()):
        allowed = ALLOWED.get(module)
        if allowed is None:
            continue
        for name in sorted(names):
            top = name.split(".")[0]
            if top == "__future__" or top in sys.stdlib_module_names:
                continue
            if not any(name == prefix or name.startswith(prefix + ".") for prefix in allowed):
                bad.append(f"{module} imports {name} (allowed: the standard library and {sorted(allowed)})")
    return bad


def violations(imports: Mapping[str, set[str]]) -> list[str]:
    bad = []
    for module, names in sorted(imports.items()):
        folder = module.split("/")[0] if "/" in module else module.removesuffix(".py")
        if folder == "__init__":  # the package's lazy public names point anywhere, on purpose
            continue
        if folder not in LAYER_OF:
            bad.append(f"{module}: folder {folder!r} is in no layer (add it to LAYERS)")
            continue
        if "lm_eval" in names and folder != "harness":
            bad.append(f"{module} imports lm_eval (only eglr_harness/harness/ may)")
        ours = {n[1:] for n in names if n.startswith(".")} - {folder}
        higher = {n for n in ours if LAYER_OF.get(n, len(LAYERS)) >= LAYER_OF[folder]}
        if higher:
            bad.append(f"{module} imports eglr_harness.{sorted(higher)}, a layer not below its own")
        if folder in ALLOWED and ours - ALLOWED[folder]:
            bad.append(f"{module} imports eglr_harness.{sorted(ours - ALLOWED[folder])} (allowed: "
                       f"{sorted(ALLOWED[folder])})")
        if ours & FORBIDDEN.get(folder, set()):
            bad.append(f"{module} imports eglr_harness.{sorted(ours & FORBIDDEN[folder])}, which needs a model")
    return bad


def module_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Dotted module name -> the modules of the package it imports (``from a.b import c`` is ``a.b.c`` where
    ``c`` is a module, else ``a.b``; a package is its ``__init__``)."""
    paths = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(here[:len(here) - node.level + 1])
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                targets.update(f"{module}.{a.name}" if f"{module}.{a.name}" in paths else module for a in node.names)
        resolved = set()
        for target in targets:
            while "." in target and target not in paths:
                target = target.rsplit(".", 1)[0]
            if target in paths and target != name:
                resolved.add(target)
        graph[name] = resolved
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each group of modules that reach each other (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def folder_of(module: str) -> str:
    """``eglr_harness.decoding.hook.engine`` -> ``decoding``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def transitive_violations(graph: Mapping[str, set[str]]) -> list[str]:
    """The modules that reach, through other modules, a folder their own folder may not import (``ALLOWED``,
    ``FORBIDDEN``): the direct rules pass module by module, and a chain of allowed steps can still end there."""
    bad = []
    for module in sorted(graph):
        folder = folder_of(module)
        reached, pending = set(), list(graph[module])
        while pending:
            other = pending.pop()
            if other not in reached:
                reached.add(other)
                pending += graph.get(other, ())
        folders = {folder_of(m) for m in reached} - {folder}
        allowed = ALLOWED.get(folder)
        beyond = sorted(folders - allowed) if allowed is not None else []
        forbidden = sorted(folders & FORBIDDEN.get(folder, set()))
        for other in sorted(set(beyond) | set(forbidden)):
            chain = sorted(m for m in reached if folder_of(m) == other)[0]
            bad.append(f"{module} reaches eglr_harness.{other} ({chain}) through the modules it imports")
    return bad


def test_no_import_cycle():
    graph = module_graph()
    assert "eglr_harness.harness.lm_eval_patches" in graph["eglr_harness.harness.autoload"]
    assert cycles(graph) == []


def test_no_module_reaches_a_forbidden_folder_through_others():
    assert transitive_violations(module_graph()) == []


def test_the_graph_checks_catch_a_cycle_and_a_transitive_import():
    """Broken on purpose: the autoload and the patches importing each other (what issue 48 removed), and the
    analysis reaching an engine through the run layer, each step of which the direct rules allow."""
    graph = {"eglr_harness.harness.autoload": {"eglr_harness.harness.lm_eval_patches"},
             "eglr_harness.harness.lm_eval_patches": {"eglr_harness.harness.autoload"},
             "eglr_harness.analysis.x": {"eglr_harness.run.y"}, "eglr_harness.run.y": {"eglr_harness.decoding.z"},
             "eglr_harness.decoding.z": set()}
    assert cycles(graph) == [["eglr_harness.harness.autoload", "eglr_harness.harness.lm_eval_patches"]]
    assert transitive_violations(graph) == [
        "eglr_harness.analysis.x reaches eglr_harness.decoding (eglr_harness.decoding.z) through the modules it "
        "imports"]
    assert violations({"analysis/x.py": {".run"}, "run/y.py": {".decoding"}}) == []  # each step alone is allowed


def test_the_import_rules_hold():
    imports = project_imports()
    assert len(imports) > 50 and any("lm_eval" in names for m, names in imports.items() if m.startswith("harness/"))
    assert violations(imports) == []


def test_the_rules_catch_a_violation():
    """Broken on purpose: lm-eval imported from the decoding package, the analysis importing an engine, the core
    reaching up to the run layer, a command importing lm-eval itself, a new folder put in no layer."""
    imports = {"decoding/x.py": {"torch", "lm_eval", ".core"}, "analysis/y.py": {".decoding", ".core"},
               "harness/z.py": {"lm_eval", ".decoding"}, "core/w.py": {".run"}, "commands/v.py": {"lm_eval",
                                                                                                  ".harness"},
               "run/u.py": {".decoding", ".core"}, "newfolder/t.py": {".core"}, "__init__.py": {".harness"}}
    assert violations(imports) == [
        "analysis/y.py imports eglr_harness.['decoding'], which needs a model",
        "commands/v.py imports lm_eval (only eglr_harness/harness/ may)",
        "core/w.py imports eglr_harness.['run'], a layer not below its own",
        "decoding/x.py imports lm_eval (only eglr_harness/harness/ may)",
        "newfolder/t.py: folder 'newfolder' is in no layer (add it to LAYERS)",
]


def test_the_modules_with_a_rule_of_their_own_keep_it():
    ruled = {module: module_imports(PACKAGE / module) for module in ALLOWED if module.endswith(".py")}
    assert "torch" in ruled["decoding/naive_reference.py"]  # the rule reads the module it names
    assert module_violations(ruled) == []


def test_the_module_rule_catches_the_reference_importing_an_engine():
    """Broken on purpose: the naive reference borrowing the engines' maths, and a package it does not need."""
    imports = {"decoding/naive_reference.py": {"__future__", "math", "torch", "torch.nn.functional",
                                               "eglr_harness.core.config", "eglr_harness.decoding.functional",
                                               "eglr_harness.decoding.continuous.engine", "numpy"}}
    assert module_violations(imports) == [
        "decoding/naive_reference.py imports eglr_harness.decoding.continuous.engine "
        "(allowed: the standard library and ['eglr_harness.core', 'torch'])",
        "decoding/naive_reference.py imports eglr_harness.decoding.functional "
        "(allowed: the standard library and ['eglr_harness.core', 'torch'])",
        "decoding/naive_reference.py imports numpy (allowed: the standard library and ['eglr_harness.core', 'torch'])",
    ]
