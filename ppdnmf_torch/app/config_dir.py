"""Where the app's configs are: ``ppdnmf_torch/conf`` in an installed package, ``conf/`` beside the
package in a source checkout (:data:`CONFIG_DIR`)."""
from __future__ import annotations

import os

__all__ = ["CONFIG_DIR", "find_config_dir"]


def find_config_dir() -> str:
    """The config folder: ``ppdnmf_torch/conf`` in an installed package (the wheel ships the
    repository's ``conf/`` there), else ``conf/`` beside the package (a source checkout or an
    editable install). An absolute path, so that the app works from any directory."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package, above app/
    for folder in (os.path.join(here, "conf"), os.path.join(here, os.pardir, "conf")):
        if os.path.isfile(os.path.join(folder, "config.yaml")):
            return os.path.normpath(folder)
    return os.path.normpath(os.path.join(here, "conf"))  # Hydra then says it is missing


#: the folder Hydra composes the configs from (:func:`find_config_dir`)
CONFIG_DIR = find_config_dir()
