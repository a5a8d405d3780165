"""Every figure the READMEs quote is read from a committed results file that a committed script wrote.

The result tables of README.md and benchmarks/README.md sit between ``<!-- table: NAME -->``
markers and must equal what ``benchmarks/readme_tables.py`` renders from benchmarks/results/*.json.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = (ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md")))
# Files written before the script recorded its own command line.
WRITTEN_BY = {"code_learn": "benchmarks/code_learn_curve.py"}


def _tables():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "benchmarks" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tables = _tables()


def linked_results(text: str) -> set[str]:
    """Names of the results files a Markdown text links or names (``benchmarks/results/X.json``)."""
    return set(re.findall(r"results/([A-Za-z0-9_]+)\.json", text))


@pytest.mark.parametrize("path", tables.FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_marked_table_equals_its_rendering_from_the_results_json(path: Path) -> None:
    text = path.read_text()
    assert list(tables.marked(text)), f"{path.name} has no marked table"
    assert len(list(tables.marked(text))) == text.count("<!-- table: ") == text.count("<!-- /table -->")
    for name, body in tables.marked(text):
        assert body == tables.render(name, path), (
            f"{path.name}: table {name!r} is stale; run benchmarks/readme_tables.py"
        )


def test_the_readme_headline_table_links_one_results_file_per_row_and_its_numbers_come_from_it() -> None:
    readme = ROOT / "README.md"
    body = dict(tables.marked(readme.read_text()))["headline"]
    rows = [line for line in body.splitlines()[2:] if line.startswith("|")]
    assert len(rows) >= 4
    for row in rows:
        (name,) = linked_results(row)
        data = json.loads((RESULTS / f"{name}.json").read_text())
        # a number in the row that the JSON does not hold would survive only if rendering ignored it:
        # render the table from a copy where this file's numbers are perturbed, and the row must change
        perturbed = tables.TABLES["headline"](
            lambda n, _name=name: _scaled(
                json.loads((RESULTS / f"{n}.json").read_text()), 1.37 if n == _name else 1.0
            ),
            "benchmarks/results/",
        )
        assert row not in perturbed.splitlines(), f"row does not depend on {name}.json: {row}"
        assert data  # the file exists and parses


def _scaled(value, factor: float):
    """A copy of a JSON value with every non-integer float multiplied by ``factor``."""
    if isinstance(value, dict):
        return {k: _scaled(v, factor) for k, v in value.items()}
    if isinstance(value, list):
        return [_scaled(v, factor) for v in value]
    if isinstance(value, float) and not value.is_integer():
        return value * factor
    return value


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_results_file_the_docs_name_exists_and_names_the_committed_script_that_wrote_it(
    path: Path,
) -> None:
    for name in linked_results(path.read_text()):
        file = RESULTS / f"{name}.json"
        assert file.is_file(), f"{path.name} names {file.name}, which is not committed"
        data = json.loads(file.read_text())
        found = re.search(r"(benchmarks/[a-z0-9_]+\.py)", data.get("command", ""))
        script = WRITTEN_BY.get(name) or (found and found[1])
        assert script, f"{file.name} records no benchmarks/ script in its command: {data.get('command')!r}"
        assert (ROOT / script).is_file(), f"{file.name} was written by {script}, which is not committed"
