"""The package's import rules, read from the source (issue 40): lm-eval is imported by ``eglr_harness/harness/``
alone (the boundary with lm-eval), and the lower layers do not import the higher ones.

Every ``import`` statement counts, also one inside a function (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "eglr_harness"

# what each folder may import from the project besides itself (None: no rule yet)
ALLOWED: dict[str, set[str]] = {
    # the EGLR maths and both engines: core types only, never the harness, the commands or the analysis
    "decoding": {"config", "generation_options", "errors", "signals"},
    # the vLLM plugin runs inside vLLM's workers: the maths and core types, never lm-eval's side
    "vllm": {"decoding", "config", "errors", "signals"},
}
# folders that must not import these (they run without a model, or below the harness)
FORBIDDEN: dict[str, set[str]] = {
    "analysis": {"harness", "decoding", "leaderboard", "rl", "grpo_run", "verify", "vllm"},
    "scoring": {"harness", "decoding", "analysis", "leaderboard", "rl", "grpo_run", "verify", "vllm"},
    "data": {"harness", "decoding", "analysis", "leaderboard", "rl", "grpo_run", "verify", "vllm"},
    "verify": {"harness", "leaderboard", "rl", "grpo_run", "vllm"},
}


def project_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module path relative to the package ('decoding/kv_slots.py') -> the top-level names it imports
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


def violations(imports: Mapping[str, set[str]]) -> list[str]:
    bad = []
    for module, names in sorted(imports.items()):
        folder = module.split("/")[0] if "/" in module else module.removesuffix(".py")
        if "lm_eval" in names and folder != "harness":
            bad.append(f"{module} imports lm_eval (only eglr_harness/harness/ may)")
        ours = {n[1:] for n in names if n.startswith(".")} - {folder}
        if folder in ALLOWED and ours - ALLOWED[folder]:
            bad.append(f"{module} imports eglr_harness.{sorted(ours - ALLOWED[folder])} (allowed: {sorted(ALLOWED[folder])})")
        if folder in FORBIDDEN and ours & FORBIDDEN[folder]:
            bad.append(f"{module} imports eglr_harness.{sorted(ours & FORBIDDEN[folder])}, a higher layer")
    return bad


def test_the_import_rules_hold():
    imports = project_imports()
    assert len(imports) > 50 and any("lm_eval" in names for m, names in imports.items() if m.startswith("harness/"))
    assert violations(imports) == []


def test_the_rules_catch_a_violation():
    """Broken on purpose: lm-eval imported from the decoding package, the analysis importing an engine."""
    imports = {"decoding/x.py": {"torch", "lm_eval", ".config"}, "analysis/y.py": {".decoding", ".cell"},
               "harness/z.py": {"lm_eval", ".decoding"}, "grpo_run.py": {"lm_eval"}}
    assert violations(imports) == [
        "analysis/y.py imports eglr_harness.['decoding'], a higher layer",
        "decoding/x.py imports lm_eval (only eglr_harness/harness/ may)",
        "grpo_run.py imports lm_eval (only eglr_harness/harness/ may)",
    ]
