"""Render the templates shipped in manifests/ (inside the installed package)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import jinja2


@lru_cache(maxsize=None)
def _environment():
    return jinja2.Environment(loader=jinja2.PackageLoader("bootstrap.manifests", "."),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False)


def render(name: str, **values) -> str:
    if not name.endswith(".j2"):
        return resources.files("bootstrap.manifests").joinpath(name).read_text()
    return _environment().get_template(name).render(**values)
