"""Sphinx configuration: MyST Markdown pages, the furo theme, and the
reference pages generated from the code at every build (_ext/reference_pages.py). Everything is
built offline: no intersphinx, no maths from a CDN."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "_ext"))

from robusttune import __version__  # noqa: E402

project = "robusttune"
author = "the robusttune authors"
copyright = "2026, the robusttune authors"
version = release = __version__

extensions = ["myst_parser", "reference_pages"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "README.md"]

html_theme = "furo"
html_title = f"robusttune {release}"
html_static_path: list[str] = []
