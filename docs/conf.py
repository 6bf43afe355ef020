"""Sphinx configuration for the celery_anarchon documentation."""
project = "celery_anarchon"
author = "celery_anarchon developers"
extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
html_theme = "alabaster"
myst_heading_anchors = 3
