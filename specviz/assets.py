"""Where specviz's shipped files are: the embedded pair, the held-out prompts, the prepared recordings.

In a clone (or an editable install) they are the repository's ``assets/`` folder. A regular
``pip install`` copies that folder to ``<prefix>/share/specviz/assets`` (pyproject's data-files),
since a wheel has no place for files beside the package. ``SPECVIZ_ASSETS`` names another folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def locate() -> Path:
    """The assets folder: $SPECVIZ_ASSETS, else the clone's ``assets/``, else the installed copy.

    Returns the clone's path when none exists, so a missing file fails with a path that says
    where it was looked for.
    """
    if os.environ.get("SPECVIZ_ASSETS"):
        return Path(os.environ["SPECVIZ_ASSETS"])
    clone = Path(__file__).resolve().parent.parent / "assets"
    if (clone / "models").is_dir():
        return clone
    for prefix in (sys.prefix, sys.base_prefix):
        installed = Path(prefix) / "share" / "specviz" / "assets"
        if (installed / "models").is_dir():
            return installed
    return clone


ASSETS = locate()
