"""Sphinx configuration of attnlab's documentation (built by ``bash scripts/docs.sh``).

Why Sphinx: attnlab's docstrings are written for it (Google-style sections that
``napoleon`` reads, reST roles such as :func:`attnlab.attention`), and PyTorch's own
documentation uses the same stack: ``autodoc`` for the API reference and
``sphinx-gallery`` for tutorials that are Python scripts, executed at build time with
their plots captured. Pages are Markdown (``myst-parser``), so the pages other branches
write in ``docs/*.md`` need no conversion. The theme is ``furo``: its assets ship inside
the package, so the site loads nothing from the network.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent / "src"))  # the worktree's attnlab, whatever is installed

import attnlab  # noqa: E402

project = "attnlab"
author = "the attnlab authors"
copyright = "the attnlab authors"
version = release = attnlab.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
    "apigen",  # docs/_ext/apigen.py: writes docs/api/, fails on a public name without a docstring
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "tour_source", "**/.ipynb_checkpoints"]
templates_path: list[str] = []

# warnings are errors (scripts/docs.sh passes -W); unresolved cross-references inside
# docstrings are not warned about (nitpicky off): they name types of other libraries
nitpicky = False
# docstrings name modules by short names (":mod:`.tasks`") that can match two modules; the
# link then goes to one of them, and tests/docs checks that every link resolves
suppress_warnings = ["ref.python"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"exclude-members": "__init__, forward_pre_hooks"}
autodoc_inherit_docstrings = False  # torch.nn.Module's own docstrings would fill every forward()
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # an Attributes: entry must not clash with the property of the same name

html_theme = "furo"
html_title = f"attnlab {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False

# -- the tour: sphinx-gallery runs every script of docs/tour_source/ at build time -------------
# A script that raises fails the build; its figures are the real outputs of that run.
# Slow steps (training) use a small fixed budget and cache their checkpoint under
# ATTNLAB_TOUR_CACHE (default docs/_build/tour-cache), saying so on the page.
os.environ.setdefault("ATTNLAB_TOUR_CACHE", str(DOCS / "_build" / "tour-cache"))
sphinx_gallery_conf = {
    "examples_dirs": "tour_source",
    "gallery_dirs": "tour",
    "filename_pattern": r"/\d\d_",  # execute every numbered page
    "ignore_pattern": r"/_",
    "within_subsection_order": "FileNameSortKey",
    "abort_on_example_error": True,
    "download_all_examples": False,
    "remove_config_comments": True,
    "image_scrapers": ("matplotlib",),
    "reset_modules": ("matplotlib",),
    "capture_repr": ("__repr__",),
    "show_memory": False,
    "show_signature": False,
    "min_reported_time": 0,
    "write_computation_times": False,  # its page loads jQuery and DataTables from a CDN
    "default_thumb_file": None,
    "line_numbers": False,
}
