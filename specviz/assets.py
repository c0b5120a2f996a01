"""Where specviz's shipped files are: the embedded pair, the prompt sets, the prepared recordings.

In a clone (or an editable install) they are the repository's ``assets/`` folder. An installed
package carries the same files as package data, ``specviz/data`` (pyproject maps ``assets/`` to
it), found with ``importlib.resources`` wherever pip put the package: a virtual environment,
``--user`` or ``--target``. ``SPECVIZ_ASSETS`` names another folder.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path


def locate() -> Path:
    """The assets folder: $SPECVIZ_ASSETS, else the installed package data, else the clone's ``assets/``.

    Returns the clone's path when none exists, so a missing file fails with a path that says
    where it was looked for.
    """
    if os.environ.get("SPECVIZ_ASSETS"):
        return Path(os.environ["SPECVIZ_ASSETS"])
    installed = resources.files("specviz").joinpath("data")
    if isinstance(installed, Path) and (installed / "models").is_dir():
        return installed
    return Path(__file__).resolve().parent.parent / "assets"


ASSETS = locate()
