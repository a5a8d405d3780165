"""The package's layering: lower layers never import higher ones; the core never imports Lightning."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "thundersync_lightning"

# layer of each top-level part of the package (see docs/design.md)
LAYERS = {
    "core": 0,
    "strategy": 1,
    "rollout": 2,
    "envs": 2,
    "modules": 3,
    "callbacks": 4,
    "summary": 4,
    "show": 5,
    "cli": 5,
}


def _part(module_path: Path) -> str:
    rel = module_path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    """Absolute names of the package's own modules and of third-party packages that ``path`` imports."""
    tree = ast.parse(path.read_text())
    package_parts = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                found.add(".".join([*base, *(node.module.split(".") if node.module else [])]))
            elif node.module:
                found.add(node.module)
    return found


def test_no_module_imports_a_higher_layer():
    violations = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent == PACKAGE and path.name == "__init__.py":
            continue  # the package root re-exports (and registers the strategy)
        own = LAYERS[_part(path)]
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] != "thundersync_lightning" or len(parts) < 2 or parts[1] not in LAYERS:
                continue
            if LAYERS[parts[1]] > own:
                violations.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert violations == []


def test_the_core_imports_no_lightning():
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in (PACKAGE / "core").rglob("*.py")
        if any(name.split(".")[0] in ("lightning", "pytorch_lightning") for name in _imports(path))
    ]
    assert offenders == []


def test_the_core_works_where_lightning_is_not_installed():
    code = (
        "import sys; sys.modules['lightning'] = None\n"
        "import torch\n"
        "from thundersync_lightning.core import StreamingGRPO\n"
        "w = torch.ones(2, requires_grad=True)\n"
        "acc = StreamingGRPO([w]); acc.open_group('g', ['a', 'b'])\n"
        "acc.add_reward('a', 1.0); acc.add_reward('b', 0.0)\n"
        "acc.add_logprob('a', (w * 2).sum()); acc.add_logprob('b', w.sum())\n"
        "acc.finish(); print(w.grad.tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # rewards (1, 0): mu = 0.5, sigma = 0.5, A = (+0.5, -0.5) / (0.5 + eps);
    # grad L = -(1/N) (A_a * 2 + A_b * 1) per element, N = 1
    advantage = 0.5 / (0.5 + 1e-6)
    expected = -(advantage * 2.0 - advantage * 1.0)
    assert [round(v, 6) for v in eval(out.stdout)] == [round(expected, 6)] * 2
