"""Entry-point targets: plain dicts, imported on the driver (so this module imports no torch).

`target` names the class, imported only inside the actors that run it; `params` are the
defaults (their types are the declared parameter types, checked when a config is validated).
"""

BOOST_WORD = {
    "target": "lidao_plugin_example.method:BoostWord",
    "params": {"word": "the", "strength": 2.0},
}

SENTIMENT_WORDLIST = {
    "target": "lidao_plugin_example.scorer:WordListSentiment",
    "metric": "sentiment",
    "params": {"text_field": "continuation"},
}
