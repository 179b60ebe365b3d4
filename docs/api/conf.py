"""Sphinx configuration of convgrad's API reference (built from the docstrings).

Build: ``make docs`` (HTML in docs/_build/html).  ``make test`` builds it with
warnings as errors, so a docstring that does not render fails the tests.
"""

import os
import sys

sys.path.insert(0, os.path.abspath("_ext"))        # cli_page: the `convgrad` command pages

import convgrad  # noqa: E402

project = "convgrad"
release = version = convgrad.__version__
author = "the convgrad developers"
copyright = "the convgrad developers"  # noqa: A001

extensions = [
    "sphinx.ext.autodoc",      # the reference is the docstrings
    "numpydoc",                # they are numpydoc (Parameters, Returns, Raises, Examples)
    "cli_page",                # the `convgrad` command's pages, from its typer objects
]

nitpicky = True                     # a cross-reference that leads nowhere is an error too
smartquotes = False                 # keep --options and 'quotes' as written
autodoc_member_order = "bysource"
autodoc_typehints = "none"          # signatures as written; types are in the docstrings
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False    # no intersphinx (the build needs no network)

html_theme = "alabaster"
html_title = f"convgrad {release} API reference"
html_theme_options = {"description": "Convolution gradients exactly as the op specs define "
                                     "them, on NumPy arrays", "page_width": "1100px"}
html_static_path = []
exclude_patterns = ["_ext"]
