"""Methods by name, imported lazily so the driver never imports torch (`workers.plugins`)."""

from workers.plugins import check_method_name, load_method, register_method, resolve_params

__all__ = ["check_method_name", "load_method", "register_method", "resolve_params"]
