"""The documentation survives moves inside the package: every relative link resolves (links inside
code are not links), and every code example imports from a package, never from a module inside
one, so a module moved behind its package's ``__all__`` breaks no user (docs/*.md, README.md,
benchmarks/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the package's source is ROOT/src (no import needed)
DOCS = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def relative_links(text: str) -> list[str]:
    """The link targets of markdown ``text`` that name a file of the repository (no scheme, no
    bare anchor), without their ``#anchor``; code blocks and inline code skipped."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = [t.split("#")[0] for t in LINK.findall(prose)]
    return [t for t in targets if t and not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_link_finder_skips_code_urls_and_anchors():
    text = "see [a](docs/x.md#y) and [b](https://e.org) [c](#top) `[d](nope.md)`\n```\n[e](no.md)\n```\n"
    assert relative_links(text) == ["docs/x.md"]


def test_every_relative_link_in_the_docs_and_readmes_resolves():
    broken = [
        f"{doc.relative_to(ROOT)}: {target}"
        for doc in DOCS
        for target in relative_links(doc.read_text())
        if not (doc.parent / target).exists()
    ]
    assert broken == []


def test_every_code_example_imports_from_a_package_not_a_module_inside_one():
    imported = re.compile(r"^\s*from (thundersync_lightning[\w.]*) import", re.M)
    deep = [
        f"{doc.relative_to(ROOT)}: {name}"
        for doc in DOCS
        for name in imported.findall(doc.read_text())
        if not (ROOT / "src" / name.replace(".", "/") / "__init__.py").exists()
    ]
    assert deep == []
