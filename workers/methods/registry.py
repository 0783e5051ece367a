"""Methods by name, imported lazily so the driver never imports torch: the catalog's lookups
(`jobs.catalog`: names, targets, defaults, kinds) after the plugins, the import of a method's
class (inside the generation actor) and `register_method`, the call an `--include` module makes.
"""

from __future__ import annotations

from typing import Any

import jobs.catalog as catalog
from workers.plugins import after_plugins, import_target

# the catalog's lookups, after the plugins (a plugin method's name and parameters too)
check_method_name = after_plugins(catalog.check_method_name)
resolve_params = after_plugins(catalog.resolve_params)


def load_method(name: str) -> type[Any]:
    """Import the method class registered under `name` (inside actors only)."""
    check_method_name(name)
    return import_target(catalog.METHODS[name])


def register_method(
    name: str,
    target: str,
    params: dict[str, Any] | None = None,
    kinds: dict[str, str] | None = None,
) -> None:
    """Add a method from outside the tree (see workers/plugins.py).

    `target` is `"module:Class"` (a `DecodingMethod`, imported only inside actors), `params`
    its parameter defaults, `kinds` optional declared kinds (else those of the defaults).
    """
    catalog.add_method(name, target, params=params, kinds=kinds)
