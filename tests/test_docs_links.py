"""README.md and docs/*.md: every relative link names a file or folder that exists, and an anchor a heading there.

Anchors are GitHub's: a heading's text in lower case, punctuation dropped, spaces as hyphens, a repeated heading
suffixed -1, -2, ...; an explicit `<a id="...">` counts too. Links inside code blocks are text, not links.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_LIMIT = 12_000  # characters: the rest lives in docs/
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def pages(root: Path = ROOT) -> list[Path]:
    """The pages checked: README.md and every docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """text without its fenced code blocks and inline code spans."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors a markdown file defines: its headings' slugs (repeats numbered) and explicit ids."""
    text = path.read_text()
    found: set[str] = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S),
                              flags=re.M):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def broken_links(page: Path) -> list[str]:
    """["page: target (why)", ...] for the relative links of page that do not resolve."""
    wrong = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: ... checked by no one offline
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            wrong.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            wrong.append(f"{page.name}: {target} (no heading #{anchor} in {dest.name})")
        elif anchor and dest.suffix != ".md":
            wrong.append(f"{page.name}: {target} (an anchor into a file that is not markdown)")
    return wrong


def test_the_checker_sees_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Page A\n\n## How `start_client` picks, and GPUs\n\n## Same\n\n## Same\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [ok](docs/a.md#how-start_client-picks-and-gpus) [ok](docs/a.md#same-1) [web](https://x.org)\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#nothing) [self](#page-a)\n"
        "```\n[in code](docs/c.md)\n```\n")
    wrong = [w for page in pages(tmp_path) for w in broken_links(page)]
    assert wrong == ["README.md: docs/b.md (no such file)", "README.md: docs/a.md#nothing (no heading #nothing in a.md)",
                     "README.md: #page-a (no heading #page-a in README.md)"]


def test_every_link_of_the_readme_and_docs_resolves():
    assert len(pages()) > 3, "docs/ holds the pages the README links to"
    wrong = [w for page in pages() for w in broken_links(page)]
    assert not wrong, "broken links: " + "; ".join(wrong)


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall(prose((ROOT / "README.md").read_text()))}
    missing = [p.name for p in pages()[1:] if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link to: {missing}"


def test_the_readme_stays_short():
    size = len((ROOT / "README.md").read_text())
    assert size <= README_LIMIT, f"README.md has {size} characters (at most {README_LIMIT}): move detail into docs/"


def benchmark_figures(text: str) -> dict[str, str]:
    """'bench.figure' -> value as written, for every row of docs/benchmarks.md's tables (last occurrence wins)."""
    rows = re.findall(r"^\|\s*(\w+)\s*\|\s*(\w+)\s*\|\s*([^|]+?)\s*\|\s*$", text, re.M)
    return {f"{bench}.{figure}": value for bench, figure, value in rows}


def headline_ratios(text: str) -> list[tuple[str, str]]:
    """('bench.figure', value) quoted by the README's Benchmarks section; `x_{3,4}y` and 'a, b' expand in order."""
    section = text.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    out = []
    for name, values in re.findall(r"^\|[^|]*\|\s*`([\w.{},]+)`\s*\|\s*([^|]+?)\s*\|\s*$", section, re.M):
        brace = re.search(r"\{([\d,]+)\}", name)
        names = [name.replace(brace.group(0), n) for n in brace.group(1).split(",")] if brace else [name]
        out += list(zip(names, [v.strip() for v in values.split(",")], strict=True))
    return out


def test_the_readme_quotes_its_headline_ratios_from_the_benchmark_page():
    quoted = headline_ratios((ROOT / "README.md").read_text())
    table = benchmark_figures((ROOT / "docs" / "benchmarks.md").read_text())
    assert len(quoted) >= 5, "the README quotes a few headline ratios"
    wrong = [f"{name}: README {value}, docs/benchmarks.md {table.get(name, 'nothing')}" for name, value in quoted
             if table.get(name) != value]
    assert not wrong, "headline ratios that differ from the benchmark table: " + "; ".join(wrong)
