"""The downloader's former import path: :mod:`dg_plugins.download` is the downloader (it left this
package so that the download command never imports torch, which importing
``dg_plugins.datasets`` does). ``dg_plugins.datasets.download`` and its submodules ``sources``,
``fetch`` and ``prepare`` are the same module objects."""

import sys

from dg_plugins import download as _download
from dg_plugins.download import *  # noqa: F401,F403

for _name in ("fetch", "prepare", "sources"):
    sys.modules[f"{__name__}.{_name}"] = getattr(_download, _name)
