"""Checks of the book: every internal link, anchor, image, script and stylesheet of the built pages resolves, and no
page loads anything from another host (the book is read offline); every widget an executed chapter shows has a
static copy beside it (a reader of the book has no kernel to draw the widget)."""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

#: (tag, attribute) pairs that point at something the page links to or loads.
LINKS = {("a", "href"), ("img", "src"), ("script", "src"), ("link", "href"), ("iframe", "src"), ("source", "src")}
LOADED = {"img", "script", "link", "iframe", "source"}  # fetched as the page loads, unlike a followed <a>
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
STATIC_CLASS = "dsgd-panel-snapshot"  # the caption of a widget's static copy (dsgd_teach.static_copy.SNAPSHOT_CLASS)


class _Page(HTMLParser):
    """The ids a page defines and the (tag, url) references it makes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.refs: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for key in ("id", "name"):
            if values.get(key) and (key == "id" or tag == "a"):
                self.ids.add(str(values[key]))
        for name, value in attrs:
            if (tag, name) in LINKS and value:
                if tag == "link" and values.get("rel") in ("canonical", "alternate"):
                    continue
                self.refs.append((tag, value))


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def broken_links(html_dir: Path) -> list[str]:
    """Every broken internal reference in the book as 'page: tag -> url (why)'; empty when all resolve."""
    root = html_dir.resolve()
    pages = {p.resolve(): _parse(p) for p in root.rglob("*.html") if not {"_sources", "_static"} & set(p.parts)}
    problems = []
    for path, page in sorted(pages.items()):
        where = path.relative_to(root)
        for tag, url in page.refs:
            parts = urlsplit(url)
            if parts.scheme in ("mailto", "javascript", "data"):
                continue
            if parts.scheme or parts.netloc:
                if tag in LOADED:
                    problems.append(f"{where}: {tag} -> {url} (loads from another host: the book must work offline)")
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.is_relative_to(root) or not target.exists():
                problems.append(f"{where}: {tag} -> {url} (no such file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{where}: {tag} -> {url} (no anchor #{parts.fragment})")
    return problems


def is_static_copy(output: Any) -> bool:
    """An output that is a widget's static copy: the HTML caption panel.py writes beneath the copy's figures."""
    return STATIC_CLASS in str(output.get("data", {}).get("text/html", ""))


def widgets_without_static(nb: Any) -> list[str]:
    """Each widget output of an executed notebook with no static copy after it in its cell (before the cell's next
    widget output), as 'cell N (In [c]): output M'. A widget output that carries its own image (an ipympl figure)
    is its own static copy."""
    missing = []
    for n, cell in enumerate(nb.cells):
        waiting: int | None = None  # the output index of a widget still without its static copy
        for m, output in enumerate(cell.get("outputs", [])):
            data = output.get("data", {})
            if WIDGET_VIEW in data and not any(k.startswith("image/") for k in data):
                if waiting is not None:
                    missing.append((n, cell.get("execution_count"), waiting))
                waiting = m
            elif waiting is not None and is_static_copy(output):
                waiting = None
        if waiting is not None:
            missing.append((n, cell.get("execution_count"), waiting))
    return [f"cell {n} (In [{count}]): output {m} is a widget with no static copy after it" for n, count, m in missing]


def main(argv: list[str] | None = None) -> int:
    """python -m dsgd_teach.book_check HTML_DIR: print broken links, exit 1 if there are any."""
    html_dir = Path((argv if argv is not None else sys.argv[1:])[0])
    problems = broken_links(html_dir)
    for line in problems:
        print(line)
    print(f"{len(problems)} broken internal link(s) in {html_dir}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
