"""Sphinx settings for the course book (`make book`): MyST-NB renders the executed chapters, the book theme lays them
out, sphinxcontrib-bibtex links citations to references.bib, MathJax is served from the book itself (offline)."""

from pathlib import Path

project = "Parallel and distributed SGD, a runnable course"
author = "dsgd-teach"
copyright = "dsgd-teach, MIT licence"

extensions = ["myst_nb", "sphinxcontrib.bibtex", "sphinx-mathjax-offline"]
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
suppress_warnings = ["myst.header"]  # solutions and assignments start below h1 where they continue a chapter

# The chapters arrive executed by `make course`: render their outputs, never run them again.
nb_execution_mode = "off"
nb_merge_streams = True
nb_output_stderr = "remove"  # dask and torch log start-up chatter to stderr; errors fail the build's own check
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist", "smartquotes"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

bibtex_bibfiles = ["references.bib"]  # copied beside the staged pages
bibtex_reference_style = "author_year"
bibtex_default_style = "plain"

html_theme = "sphinx_book_theme"
html_title = "Parallel and distributed SGD"
html_theme_options = {
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "use_download_button": True,
    "navigation_with_keys": False,
}
html_context = {"default_mode": "light"}  # the theme logs an error on a first visit without a stored mode
html_favicon = str(Path(__file__).with_name("static") / "favicon.svg")  # no request for a missing /favicon.ico
html_static_path = [str(Path(__file__).with_name("static"))]
html_css_files = ["book.css"]
