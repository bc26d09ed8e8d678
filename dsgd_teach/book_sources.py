"""The book's sources: executed chapters and the course's pages, with citations, chapter links and run banners added.

Nothing here edits the course: `stage` writes transformed copies into the book's source folder. Chapter pages keep
the committed layout (`NN_name.ipynb` beside `NOTATION.md` and `solutions/`), so the chapters' own links resolve.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "course"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

#: (surname, year) as the prose writes them -> the .bib key; CHAPTER_CITATIONS settles a name-year shared by two
#: papers, by the page that cites it.
CITATIONS: dict[tuple[str, str], str] = {
    ("Abadi", "2016"): "abadi2016tensorflow", ("Agarwal", "2011"): "agarwal2011delayed",
    ("Chen", "2016"): "chen2016revisiting", ("Dean", "2012"): "dean2012large", ("Duchi", "2011"): "duchi2011adaptive",
    ("Fedus", "2022"): "fedus2022switch", ("Gadaleta", "2018"): "gadaleta2018parallelizing", ("Gibiansky", "2017"): "gibiansky2017bringing",
    ("Goyal", "2017"): "goyal2017accurate", ("Gupta", "2016"): "gupta2016model", ("Ho", "2013"): "ho2013more",
    ("Huang", "2019"): "huang2019gpipe", ("Huo", "2018"): "huo2018decoupled", ("Kairouz", "2021"): "kairouz2021advances",
    ("Kaplan", "2020"): "kaplan2020scaling", ("Karimireddy", "2020"): "karimireddy2020scaffold",
    ("Korthikanti", "2022"): "korthikanti2022reducing", ("Li", "2014"): "li2014scaling",
    ("Li", "2020"): "li2020pytorch", ("Lian", "2015"): "lian2015asynchronous", ("Lin", "2020"): "lin2020dont",
    ("McMahan", "2014"): "mcmahan2014delay", ("McMahan", "2017"): "mcmahan2017communication",
    ("Micikevicius", "2018"): "micikevicius2018mixed", ("Narayanan", "2019"): "narayanan2019pipedream",
    ("Narayanan", "2021"): "narayanan2021memory", ("Odena", "2016"): "odena2016faster",
    ("Patarasuk", "2009"): "patarasuk2009bandwidth", ("Rabenseifner", "2004"): "rabenseifner2004optimization",
    ("Rajbhandari", "2020"): "rajbhandari2020zero", ("Recht", "2011"): "recht2011hogwild",
    ("Seide", "2014"): "seide2014onebit", ("Sergeev", "2018"): "sergeev2018horovod",
    ("Shoeybi", "2019"): "shoeybi2019megatron", ("Stich", "2019"): "stich2019local",
    ("Thakur", "2005"): "thakur2005optimization", ("Zhang", "2015"): "zhang2015staleness", ("Hedetniemi", "1988"): "hedetniemi1988survey",
    ("Langford", "2009"): "langford2009slow", ("Neumann", "2014"): "neumann2014deepdist",
    ("Sanders", "2009"): "sanders2009twotree", ("Touvron", "2023a"): "touvron2023llama",
    ("Touvron", "2023b"): "touvron2023llama2", ("McMahan", "2021"): "kairouz2021advances", ("Zhao", "2023"): "zhao2023fsdp", ("Zheng", "2017"): "zheng2017asynchronous",
    ("Zinkevich", "2010"): "zinkevich2010parallelized", ("Austin", "2025"): "austin2025scaling",
    ("Dao", "2022"): "dao2022flashattention", ("Hoffmann", "2022"): "hoffmann2022training",
    ("Lepikhin", "2021"): "lepikhin2021gshard", ("Liu", "2023"): "liu2023ring", ("Milakov", "2018"): "milakov2018online",
    ("Radford", "2019"): "radford2019language", ("Shazeer", "2017"): "shazeer2017outrageously",
}
CHAPTER_CITATIONS: dict[tuple[str, str, str], str] = {
    ("09", "Chen", "2016"): "chen2016training", ("08", "Zhang", "2015"): "zhang2015elastic",
    ("08", "Li", "2020"): "li2020federated", ("10", "Narayanan", "2021"): "narayanan2021efficient",
}
#: "Recht et al. 2011", "Recht et al. (2011)", "McMahan & Streeter (2014)", "Zhang, Gupta, Lian & Liu (2015, section 2.1)",
#: "Sergeev & Del Balso 2018", "Touvron et al. 2023b": the year becomes a citation, the text stays as written.
_NAME = r"[A-Z][\w\-]+(?:\s(?:y\s|de\s|van\s|von\s)?[A-Z][\w\-]+)?"
_CITATION = re.compile(
    r"(?P<lead>(?P<first>[A-Z][\w\-]+)(?:\s+et\s+al\.|(?:,\s+[A-Z][\w\-]+(?:\s+et\s+al\.)?)*,?\s+(?:&|and)\s+" + _NAME + r")?,?\s+\(?)"
    r"(?P<year>\d{4})(?P<suffix>[ab]?)(?![\w])"
)
#: Stretches where a role or link must not go: code, math, links, HTML tags.
_PROTECTED = re.compile(r"(```.*?```|`[^`]*`|\$\$.*?\$\$|\$[^$\n]+\$|\[[^\]]*\]\([^)]*\)|<[^>]+>)", re.S)
_CHAPTER = re.compile(r"\b([Cc]hapter)\s(\d{2})\b")


def chapter_files(course: Path = COURSE) -> dict[str, str]:
    """Chapter number -> notebook file name, from the course folder (never a fixed list)."""
    return {p.name[:2]: p.name for p in sorted(course.glob("[0-9][0-9]_*.ipynb"))}


def _outside_protected(text: str, fn: Any) -> str:
    """Apply fn to the stretches of markdown text outside code, math, links and HTML tags."""
    parts = _PROTECTED.split(text)
    return "".join(part if i % 2 else fn(part) for i, part in enumerate(parts))


def link_prose(text: str, page_chapter: str, chapters: dict[str, str], prefix: str = "") -> str:
    """Author-year citations as bibliography citations; "chapter NN" as a link to that chapter's page."""

    def cite(match: re.Match[str]) -> str:
        year = match.group("year") + match.group("suffix")
        first = match.group("first")
        key = CHAPTER_CITATIONS.get((page_chapter, first, year)) or CITATIONS.get((first, year))
        if key is None:
            return match.group(0)
        return f"{match.group('lead')}{{cite:year}}`{key}`{match.group('suffix')}"

    def chapter(match: re.Match[str]) -> str:
        name = chapters.get(match.group(2))
        if name is None or match.group(2) == page_chapter:
            return match.group(0)
        return f"[{match.group(0)}]({prefix}{name})"

    return _outside_protected(text, lambda part: _CHAPTER.sub(chapter, _CITATION.sub(cite, part)))


#: Where `make lab` serves the chapters: JupyterLab's default port, with course/ as the server's root.
LOCAL_LAB = "http://localhost:8888/lab/tree/"


def launch_links(name: str, binder_repo: str | None) -> str:
    """How to run chapter `name` live: on Binder (when the repository is known) and always in a local `make lab`."""
    local = (f"run `make lab` in a clone of the repository and open [{name} in that JupyterLab]({LOCAL_LAB}{name}) "
             f"(port 8888 unless it was taken: `make lab` prints its address; a first visit asks for the token it "
             f"prints)")
    if not binder_repo:
        return local
    url = f"https://mybinder.org/v2/gh/{binder_repo}/HEAD?urlpath=lab/tree/course/{name}"
    return f"[launch it on Binder]({url}) ({binder_repo}), or {local}"


def _banner(nb: nbformat.NotebookNode, name: str, binder_repo: str | None) -> str:
    """Where this page's results come from, and where to run it live."""
    meta = nb.metadata.get("dsgd_teach", {})
    ran = (f"executed by `make course` in {meta.get('mode', 'full')} mode on {meta.get('executed_at', '?')}, on "
           f"{meta.get('machine', 'an unrecorded machine')}") if meta else "executed by `make course`"
    return (f":::{{admonition}} Results from a real run\n:class: note dsgd-run-banner\n\nThis page is the chapter "
            f"{ran}: every figure, table and number below is what that run produced. Widget panels show a static figure "
            f"of their run; to use them live, {launch_links(name, binder_repo)}. Symbols follow the [notation page](NOTATION.md)."
            f"\n:::")


def stage_chapter(executed: Path, out_dir: Path, chapters: dict[str, str], binder_repo: str | None) -> Path:
    """An executed chapter with its banner, linked prose, and each live widget output replaced by a pointer to the
    static copy that follows it (book_check.widgets_without_static checks that one does)."""
    nb = nbformat.read(executed, as_version=4)
    nb.metadata.pop("widgets", None)  # saved widget state makes MyST-NB load the widget manager from a CDN
    number = executed.name[:2]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = link_prose(cell.source, number, chapters)
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW not in data:
                continue
            images = {k: v for k, v in data.items() if k.startswith("image/")}
            if images:  # an ipympl figure carries a PNG of itself: show that
                output["data"] = {**images, "text/plain": data.get("text/plain", "")}
            else:
                output["data"] = {"text/markdown": "*(A live widget: it runs in the notebook. Its static copy "
                                                   "follows.)*"}
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(_banner(nb, executed.name, binder_repo)))
    target = out_dir / executed.name
    nbformat.write(nb, target)
    return target


def _page(text: str, page_chapter: str, chapters: dict[str, str], prefix: str) -> str:
    """A markdown page with linked citations and chapters (code blocks untouched)."""
    return link_prose(text, page_chapter, chapters, prefix)


def assignment_text(notebook: Path) -> str:
    """An assignment's public text: its markdown cells, without solution cells or solution regions."""
    nb = nbformat.read(notebook, as_version=4)
    keep = []
    for cell in nb.cells:
        grading = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "markdown" or grading.get("solution"):
            continue
        keep.append(re.sub(r"### BEGIN SOLUTION.*?### END SOLUTION", "", cell.source, flags=re.S))
    return "\n\n".join(keep) + "\n"


def _unlink_missing(text: str, page: Path, src: Path) -> str:
    """Links to files outside the book (the repository's code and notes) become code text; the rest stay."""

    def fix(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        path = target.split("#")[0]
        if re.match(r"[a-z]+:", target) or not path or (page.parent / path).resolve().is_relative_to(src.resolve()) \
                and (page.parent / path).exists():
            return match.group(0)
        return label if label.startswith("`") else f"`{label}`"

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", fix, text)


def _unlink_missing_everywhere(src: Path) -> None:
    """Run _unlink_missing over every page and every chapter's markdown cells."""
    for page in src.rglob("*.md"):
        page.write_text(_unlink_missing(page.read_text(), page, src))
    for page in src.glob("*.ipynb"):
        nb = nbformat.read(page, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = _unlink_missing(cell.source, page, src)
        nbformat.write(nb, page)


def stage(executed_dir: Path, src: Path, binder_repo: str | None = None, course: Path = COURSE) -> list[Path]:
    """Write the book's sources into src: chapters, notation, solutions, assignments, guide and its pages; return the
    chapters."""
    if src.exists():
        shutil.rmtree(src)
    (src / "solutions").mkdir(parents=True)
    (src / "assignments").mkdir()
    chapters = chapter_files(course)
    staged = [stage_chapter(executed_dir / name, src, chapters, binder_repo) for name in chapters.values()]
    (src / "NOTATION.md").write_text(_page((course / "NOTATION.md").read_text(), "", chapters, ""))
    for path in sorted((course / "solutions").glob("*.md")):
        text = _page(path.read_text(), path.name[:2], chapters, "../")
        (src / "solutions" / path.name).write_text(text)
    guide = (course / "assignments" / "README.md").read_text()
    (src / "assignments" / "index.md").write_text(_page(guide, "", chapters, "../"))
    for notebook in sorted((course / "assignments" / "source").glob("*/*.ipynb")):
        (src / "assignments" / f"{notebook.stem}.md").write_text(_page(assignment_text(notebook), "", chapters, "../"))
    readme = (ROOT / "README.md").read_text().replace("](course/", "](")
    (src / "guide.md").write_text(re.sub(r"\A# .*", "# Guide: set-up, teaching and grading", readme, count=1))
    (src / "docs").mkdir()
    for path in sorted((ROOT / "docs").glob("*.md")):  # the pages the README links to, the README being the guide
        text = path.read_text().replace("[README](../README.md", "[guide](../guide.md").replace("](../README.md", "](../guide.md")
        text = text.replace("](../course/", "](../")
        (src / "docs" / path.name).write_text(_page(text, "", chapters, "../"))
    _unlink_missing_everywhere(src)
    return staged
