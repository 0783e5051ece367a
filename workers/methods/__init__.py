"""The decoding methods, each a `DecodingMethod` (`base`) built inside a generation actor.

What others may use: `registry` (`load_method`, `resolve_params`, `check_method_name`,
`register_method`: torch-free until a class is loaded) and `base` (`DecodingMethod`,
`MethodError`, for plugins). The rest (docs/design.md, Layout) import torch: nothing is
imported here.
"""

__all__ = ["base", "registry"]
