"""Every Markdown table of a text, checked the way a reader's renderer would take it.

Two readings that must agree: each table block split on its unescaped `|` (header, delimiter
and every row the same number of cells), and markdown-it (already installed: rich's renderer)
with GFM tables on, which renders a block whose delimiter row does not match its header as a
paragraph, not a table, and drops a row's surplus cells without a word.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from markdown_it import MarkdownIt

DELIMITER = re.compile(r":?-{3,}:?")


def cells(line: str) -> list[str]:
    """A table line's cells, `\\|` kept as a `|` of the cell (what GFM reads)."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    parts = re.split(r"(?<!\\)\|", inner)
    return [p.strip().replace("\\|", "|") for p in parts]


def blocks(text: str) -> list[list[str]]:
    """The runs of lines that start with `|`."""
    found: list[list[str]] = []
    run: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            run.append(line)
        elif run:
            found.append(run)
            run = []
    return found


class _Rows(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("th", "td"):
            self._cell = []

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None


def check(text: str) -> list[list[list[str]]]:
    """The tables of `text`, each as its rows of cells (header first, no delimiter row), or an
    AssertionError saying which line breaks which table."""
    found = []
    for block in blocks(text):
        assert len(block) >= 2, f"a table without a delimiter row: {block[0]!r}"
        header, delimiter, *rows = (cells(line) for line in block)
        assert all(DELIMITER.fullmatch(c) for c in delimiter), f"not a delimiter: {block[1]!r}"
        for line, row in zip(block[1:], [delimiter, *rows], strict=True):
            assert len(row) == len(header), (
                f"{len(row)} cells where the header has {len(header)}: {line!r}"
            )
        found.append([header, *rows])
    parser = _Rows()
    parser.feed(MarkdownIt("commonmark").enable("table").render(text))
    rendered = [[[c.strip() for c in row] for row in t] for t in parser.tables]
    assert rendered == found, "markdown-it reads the tables otherwise"
    return found
