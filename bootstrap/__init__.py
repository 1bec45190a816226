"""bootstrap: rented GPU VMs to a validated GPU k3s cluster, over SSH."""

import os as _os
import sys as _sys
from importlib.util import spec_from_file_location as _spec_from_file_location

__version__ = "0.1.0"

# deploys/ and manifests/ live at the top of the repository but are imported as
# bootstrap.deploys and bootstrap.manifests: pyproject's package-dir maps them into the
# package at install time. In a plain checkout (pytest or `python -m bootstrap` from the
# source tree, nothing installed) that mapping is absent, so map exactly those two here.
# An installed wheel has them inside the package and an editable install maps them itself;
# neither is touched.
_SUBPACKAGES = ("deploys", "manifests")


class _CheckoutFolders:
    """A meta path finder for bootstrap.deploys / bootstrap.manifests in a source checkout."""

    def __init__(self, folders: dict[str, str]):
        self.folders = folders

    def find_spec(self, fullname, path=None, target=None):
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return _spec_from_file_location(fullname, _os.path.join(folder, "__init__.py"),
                                        submodule_search_locations=[folder])


def _map_checkout_folders() -> None:
    here = _os.path.dirname(_os.path.abspath(__file__))
    root = _os.path.dirname(here)
    if not _os.path.isfile(_os.path.join(root, "pyproject.toml")):
        return  # not a source checkout
    folders = {f"{__name__}.{name}": _os.path.join(root, name) for name in _SUBPACKAGES
               if not _os.path.isdir(_os.path.join(here, name))
               and _os.path.isfile(_os.path.join(root, name, "__init__.py"))}
    if folders and not any(isinstance(f, _CheckoutFolders) for f in _sys.meta_path):
        _sys.meta_path.append(_CheckoutFolders(folders))  # last: an editable install's finder wins


_map_checkout_folders()
