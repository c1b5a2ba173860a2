"""Sphinx configuration for the synkhronos documentation.

Build (warnings are errors)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

from synk_docs import intersphinx_mapping as _inventories  # noqa: E402

import synkhronos  # noqa: E402

project = "synkhronos"
author = "synkhronos developers"
copyright = "synkhronos developers"
release = synkhronos.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
    "numpydoc",
    "synk_docs",  # docs/_ext/synk_docs.py: benchmark figures, API coverage check
]

exclude_patterns = ["_build"]

# Links to Python, numpy and PyTensor, from inventories written locally (no network).
intersphinx_mapping = _inventories(HERE / "_build" / "intersphinx")
templates_path: list[str] = []
html_static_path: list[str] = []
nitpicky = True

# autodoc: document what a name is, in the order the source gives it.
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the numpydoc sections carry the types
autodoc_default_options = {"undoc-members": False}

# numpydoc: no autosummary tables of class members (members are documented explicitly).
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = False

html_theme = "alabaster"
html_title = f"synkhronos {release}"
html_theme_options = {
    "description": "Data-parallel PyTensor functions on every core of one machine",
    "fixed_sidebar": True,
    "show_relbars": True,
    "page_width": "1100px",
    "sidebar_width": "230px",
}
html_sidebars = {"**": ["about.html", "navigation.html", "relations.html", "searchbox.html"]}
pygments_style = "sphinx"
