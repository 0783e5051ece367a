"""The decoding methods, each a `DecodingMethod` (`base`) built inside a generation actor.

What others may use: `registry` (`load_method`, `resolve_params`, `check_method_name`,
`register_method`: torch-free until a class is loaded) and `base` (`DecodingMethod`,
`MethodError`, for plugins). The rest are the methods and their parts: `lidao`, `elidao`,
`biastune` and the tuner split by concern (`tuner`, `precision`, `vocab_pass`, `replay`, `rerun`,
`estimators`), the baselines (`pplm`, `gedi`, `dexperts`, `experts`, `uddia_ref`) and the
attribute heads (`heads`, `head_meta`). Nothing is imported here: the modules import torch.
"""

__all__ = ["base", "registry"]
