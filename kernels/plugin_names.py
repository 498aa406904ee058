"""The grammar of ``KERNELGATE_KERNELS``: kernels added from outside ``kernels/``.

``KERNELGATE_KERNELS="name=module:attribute,..."`` (see :mod:`kernels.registry`): entries
separated by commas, blanks around an entry and empty entries ignored. The registry parses
the variable with it when it is imported (``kernels.registry.plugins_from_env``), and the
command line's first check (``flows.cli_args``) imports the registry to refuse a bad
``--implementation`` before JAX is imported, so this module imports only the standard
library.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping

PLUGINS_ENV = "KERNELGATE_KERNELS"
"""The environment variable of the kernels added from outside ``kernels/``."""
SELECTION_MODES = ("auto", "native")
"""``--implementation`` values that choose a kernel rather than name one."""
_ENTRY = re.compile(r"^(?P<name>[A-Za-z_][\w]*)=(?P<path>[A-Za-z_][\w.]*:[A-Za-z_]\w*)$")


def plugins_from_env(builtin: Collection[str],
                     environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The entries of ``KERNELGATE_KERNELS`` in ``environ`` (default ``os.environ``):
    a comma-separated list of ``name=module:attribute``; name -> ``module:attribute``,
    in the variable's order. ``builtin``: the built-in kernel names, which no entry may
    take. Nothing is imported (the registry loads an entry when it is first looked up).

    Raises:
        ValueError: an entry not of that form, a name given twice, a built-in name or a
            selection mode (``auto``, ``native``); the message names the variable.
    """
    value = (os.environ if environ is None else environ).get(PLUGINS_ENV, "")
    out: dict[str, str] = {}
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        match = _ENTRY.match(entry)
        if match is None:
            raise ValueError(f"{PLUGINS_ENV}: {entry!r} is not name=module:attribute")
        name, path = match["name"], match["path"]
        if name in SELECTION_MODES:
            raise ValueError(f"{PLUGINS_ENV}: {name!r} is a selection mode, not a kernel name")
        if name in builtin:
            raise ValueError(f"{PLUGINS_ENV}: {name!r} is a built-in kernel's name")
        if name in out:
            raise ValueError(f"{PLUGINS_ENV}: {name!r} is given twice")
        out[name] = path
    return out
