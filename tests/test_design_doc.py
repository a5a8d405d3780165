"""The docs match the tree: every path docs/design.md names exists, its map of rooms names every
package of the source (a room added or moved without the map fails here), and every relative link
of docs/*.md, README.md and benchmarks/README.md resolves (links inside code are not links)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "thundersync_lightning"
DESIGN = (ROOT / "docs" / "design.md").read_text()
DOCS = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
FAMILIES = sorted(p.name for p in (PACKAGE / "envs").iterdir() if (p / "source.py").exists())
NAMED = re.compile(r"`([\w./<>*-]+?\.(?:py|md|json|yaml|sh)|[\w./<>-]+/)`")


def _rooms(line: str) -> list[str]:
    """The rooms of a map row (its first cell), ``<family>`` standing for every family."""
    if not line.startswith("| `"):
        return []
    rooms = re.findall(r"`([\w/<>]+/)`", line.split("|")[1])
    return [r.replace("<family>", f) for r in rooms for f in (FAMILIES if "<family>" in r else [""])]


def _exists(name: str, rooms: list[str]) -> bool:
    if "*" in name:  # a pattern such as server_*.py: some file in a room matches it
        return any(list((PACKAGE / r).glob(name)) for r in rooms)
    names = [name.replace("<family>", f) for f in FAMILIES] if "<family>" in name else [name]
    bases = [ROOT, PACKAGE, ROOT / "docs", *(PACKAGE / r for r in rooms)]
    return any((base / n).exists() for n in names for base in bases)


def test_every_path_design_md_names_exists():
    missing = []
    for line in DESIGN.splitlines():
        rooms = _rooms(line)
        for name in NAMED.findall(line):
            if "/" not in name and not rooms:
                continue  # a bare file name in prose: its room is said in words around it
            if not _exists(name, rooms):
                missing.append(name)
    assert missing == []


def test_the_map_of_rooms_names_every_package():
    rooms = DESIGN[DESIGN.index("## Map of rooms") : DESIGN.index("## Objective options")]
    packages = sorted(
        p.parent.relative_to(PACKAGE).as_posix() + "/"
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE
    )
    unnamed = [
        p for p in packages
        if f"`{p}`" not in rooms
        and not (p.startswith("envs/") and p.count("/") == 2)  # families: `envs/<family>/`
        and f"`{p.rstrip('/').rsplit('/', 1)[-1]}/`" not in rooms  # named inside its parent's row
    ]  # fmt: skip
    assert unnamed == []


def relative_links(text: str) -> list[str]:
    """The link targets of markdown ``text`` that name a file of the repository (no scheme, no
    bare anchor), without their ``#anchor``; fenced code blocks and inline code skipped."""
    prose = re.sub(r"`[^`\n]*`", "", re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M))
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", prose)]
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
