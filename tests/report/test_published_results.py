"""The published numbers are copies of runs, not hand-made: every table row on the results page
(``docs/results.md``) appears verbatim in a profile's or benchmark's committed output (``docs/results/*.md``,
each a ``results.md`` or a benchmark's printed table as a run from nothing wrote it), and every such file names
the command and commit that produced it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results.md"
RUNS = ROOT / "docs" / "results"


def _rows(text: str) -> list[str]:
    """Markdown table rows (not the header separators), stripped."""
    return [line.strip() for line in text.splitlines()
            if line.strip().startswith("|") and not set(line.strip()) <= set("|-: ")]


def test_every_table_row_on_the_results_page_comes_from_a_run():
    published = "\n".join(p.read_text() for p in sorted(RUNS.glob("*.md")))
    sources = set(_rows(published))
    missing = [row for row in _rows(PAGE.read_text()) if row not in sources]
    assert not missing, f"rows on docs/results.md that no run wrote (docs/results/*.md): {missing[:5]}"


def test_every_run_names_its_command_and_commit():
    files = sorted(RUNS.glob("*.md"))
    assert files, "no runs under docs/results/"
    for f in files:
        head = f.read_text().splitlines()[:3]
        assert any("commit" in line and "`" in line for line in head), f"{f.name}: no command / commit line on top"
