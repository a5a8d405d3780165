"""Where one edit of a function's syntax tree makes a bug: its *sites*, each an operator or an
integer constant (a comparison operator, an arithmetic operator also in ``+=``, a boolean
``and``/``or``, an integer literal), each with the other values of its kind. The mutation tasks
build their bugs from these; SWE-bench's synthesized instances (``envs/swebench/synth.py``) find
them in a real library's source.
"""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["sites", "mutate"]

_CMP = (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)
_BIN = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)
_BOOL = (ast.And, ast.Or)


def sites(tree: ast.AST) -> list[tuple[ast.AST, str, int | None, list[Any]]]:
    """Mutable sites in a fixed walk order: (node, field, index in a list field or None, alternatives)."""
    out: list[tuple[ast.AST, str, int | None, list[Any]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                out.append((node, "ops", i, [c for c in _CMP if not isinstance(op, c)]))
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, _BIN):
            out.append((node, "op", None, [c for c in _BIN if not isinstance(node.op, c)]))
        elif isinstance(node, ast.BoolOp):
            out.append((node, "op", None, [c for c in _BOOL if not isinstance(node.op, c)]))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            v = node.value
            out.append((node, "value", None, [v + 1, v - 1] if v != 0 else [1, -1]))
    return out


def mutate(source: str, site: int, alt: int) -> str:
    """``source`` with site ``site`` set to its ``alt``-th alternative (normalised by ``ast.unparse``)."""
    tree = ast.parse(source)
    node, field, index, alternatives = sites(tree)[site]
    new = alternatives[alt]
    value = new() if isinstance(new, type) else new
    if index is None:
        setattr(node, field, value)
    else:
        getattr(node, field)[index] = value
    return ast.unparse(tree) + "\n"
