"""Configs: bad ones are refused by `validate` and by `run` (before a run directory exists),
each naming its field; unusual valid ones validate and run to every job exactly once."""

from __future__ import annotations

from typing import Any

from campaign.core import DELETE, RUN_CONFIGS, Ctx, TrialFailed, base_config, trial

RUN_CONFIGS["base"] = base_config

NAN = float("nan")
# (name, changes to the base config or the whole file's text, what the message must name)
REFUSED: list[tuple[str, dict[str, Any] | str, str]] = [
    ("unknown top-level key", {"metods": ["vanilla"]}, "metods"),
    ("unknown method", {"methods": ["vanilla", "lidao-mn"]}, "lidao-min"),
    ("unknown scorer", {"scorers": ["gender", "vadr"]}, "vadr"),
    ("samples true", {"samples_per_prompt": True}, "samples_per_prompt"),
    ("samples as text", {"samples_per_prompt": "3"}, "samples_per_prompt"),
    ("samples 2.0", {"samples_per_prompt": 2.0}, "samples_per_prompt"),
    ("samples 0", {"samples_per_prompt": 0}, "samples_per_prompt"),
    ("top_p 0", {"generation.top_p": 0}, "generation.top_p"),
    ("top_p 1.5", {"generation.top_p": 1.5}, "generation.top_p"),
    ("temperature inf", {"generation.temperature": "<<.inf>>"}, "generation.temperature"),
    ("temperature nan", {"generation.temperature": "<<.nan>>"}, "generation.temperature"),
    ("max_new_tokens 600 > context", {"generation.max_new_tokens": 600}, "max_new_tokens"),
    ("max_new_tokens 0", {"generation.max_new_tokens": 0}, "max_new_tokens"),
    ("no models", {"models": []}, "models"),
    ("model without id", {"models": [{"name": "x"}]}, "models.0.id"),
    ("unknown tiny family", {"models": [{"id": "tiny-random/notafamily"}]}, "models.0.id"),
    ("model folder missing", {"models": [{"id": "./no-such-model"}]}, "models.0.id"),
    ("model dtype float64", {"models": [{"id": "tiny-random/gpt2", "dtype": "float64"}]}, "dtype"),
    ("one model twice", {"models": [{"id": "tiny-random/gpt2"}] * 2}, "models"),
    ("num_gpus 1.5", {"models": [{"id": "tiny-random/gpt2", "num_gpus": 1.5}]}, "num_gpus"),
    ("duplicate methods", {"methods": ["vanilla", "vanilla"]}, "methods.1"),
    (
        "duplicate method by default",
        {"methods": ["lidao-min", {"name": "lidao-min", "params": {"blocks": 18}}]},
        "methods.1",
    ),
    ("duplicate scorers", {"scorers": ["gender", "gender"]}, "scorers.1"),
    (
        "method param unknown",
        {"methods": [{"name": "lidao-min", "params": {"tua": 0.5}}]},
        "methods.0&&tua",
    ),
    (
        "method param range",
        {"methods": [{"name": "lidao-min", "params": {"tau": 2}}]},
        "methods.0&&tau = 2",
    ),
    (
        "method param choice",
        {"methods": [{"name": "lidao-min", "params": {"scope": "all"}}]},
        "methods.0&&scope",
    ),
    (
        "method param kind",
        {"methods": [{"name": "lidao-min", "params": {"blocks": "many"}}]},
        "methods.0&&blocks",
    ),
    (
        "method blocks 0",
        {"methods": [{"name": "lidao-min", "params": {"blocks": 0}}]},
        "methods.0&&blocks",
    ),
    (
        "vanilla with params",
        {"methods": [{"name": "vanilla", "params": {"x": 1}}]},
        "methods.0&&['x']",
    ),
    ("method params a list", {"methods": [{"name": "vanilla", "params": [1]}]}, "methods.0.params"),
    (
        "method head missing file",
        {"methods": [{"name": "lidao-min", "params": {"head": "no-head.pt"}}]},
        "methods.0.params.head",
    ),
    (
        "uddia prior missing",
        {"methods": [{"name": "uddia", "params": {"prior": "no-prior.json"}}]},
        "methods.0.params.prior",
    ),
    (
        "scorer param unknown",
        {"scorers": [{"name": "gender", "params": {"bogus": 1}}]},
        "scorers.0.params",
    ),
    (
        "scorer text_field choice",
        {"scorers": [{"name": "sentiment-vader", "params": {"text_field": "bogus"}}]},
        "scorers.0.params.text_field",
    ),
    (
        "scorer param misspelt",
        {"scorers": [{"name": "sentiment-vader", "params": {"text_fieldd": "x"}}]},
        "text_field",
    ),
    (
        "perplexity dtype",
        {
            "scorers": [
                {"name": "perplexity", "params": {"model": "tiny-random/gpt2", "dtype": "float64"}}
            ]
        },
        "scorers.0.params.dtype",
    ),
    (
        "perplexity batch_size 0",
        {
            "scorers": [
                {"name": "perplexity", "params": {"model": "tiny-random/gpt2", "batch_size": 0}}
            ]
        },
        "scorers.0.params.batch_size",
    ),
    (
        "perplexity model missing",
        {"scorers": [{"name": "perplexity", "params": {"model": "./no-such-lm"}}]},
        "scorers.0.params.model",
    ),
    (
        "perspective qps 0",
        {"scorers": [{"name": "perspective", "params": {"qps": 0, "cache_only": True}}]},
        "scorers.0.params.qps",
    ),
    ("perspective without a key", {"scorers": ["perspective"]}, "PERSPECTIVE_API_KEY"),
    ("unknown task", {"tasks": ["sentimentt"]}, "tasks"),
    ("no tasks", {"tasks": []}, "tasks"),
    ("unknown dataset kind", {"dataset.kind": "jsonl"}, "dataset.kind"),
    ("paired without files", {"dataset.files": DELETE}, "dataset"),
    (
        "prompt-list without path",
        {"dataset.kind": "prompt-list", "dataset.files": DELETE},
        "dataset",
    ),
    ("dataset limit 0", {"dataset.limit": 0}, "dataset.limit"),
    (
        "two groups one file",
        {"dataset.files.male": str(base_config()["dataset"]["files"]["female"])},
        "same file",
    ),
    ("rtp filter on paired", {"dataset.challenging": True}, "challenging"),
    ("gender_words missing", {"gender_words": "no-words.json"}, "gender_words"),
    ("batch_size 0", {"runtime.batch_size": 0}, "runtime.batch_size"),
    ("batch_size big", {"runtime.batch_size": "big"}, "runtime.batch_size"),
    ("device cuda on a CPU machine", {"runtime.device": "cuda"}, "runtime.device"),
    ("device tpu", {"runtime.device": "tpu"}, "runtime.device"),
    (
        "score_during_generation yes",
        {"runtime.score_during_generation": "yes"},
        "score_during_generation",
    ),
    ("ray address nothing answers", {"runtime.ray_address": "127.0.0.1:9"}, "runtime.ray_address"),
    ("max_jobs exceeded", {"runtime.max_jobs": 10}, "max_jobs"),
    ("aggregation level 1", {"aggregation.level": 1.0}, "aggregation.level"),
    ("aggregation n_boot -1", {"aggregation.n_boot": -1}, "aggregation.n_boot"),
    ("name missing", {"name": DELETE}, "name"),
    ("duplicate YAML key", "name: a\nname: b\n", "name"),
    ("YAML syntax error", "name: [a\nmodels: {", "line"),
    ("empty file", "", "c.yaml"),
    ("a list, not a mapping", "- a\n- b\n", "c.yaml"),
    ("tab indentation", "name: x\ndataset:\n\tkind: paired-jsonl\n", "line"),
]


def _refused(name: str, change: dict[str, Any] | str, needle: str) -> None:
    @trial("configs", f"refused: {name}")
    def check(ctx: Ctx) -> None:
        path = ctx.config(change if isinstance(change, str) else base_config(**change))
        needles = needle.split("&&")
        ctx.expect(ctx.cli("validate", path), 2, *needles)
        local = [] if "ray address" in name else ["--no-ray"]  # --no-ray ignores the address
        ctx.expect(ctx.cli("run", path, "--out", "run", *local), 2, *needles)
        if (ctx.dir / "run").exists():
            raise TrialFailed("`run` refused the config but made its run directory")


for _n, _c, _needle in REFUSED:
    _refused(_n, _c, _needle)

# (name, changes, jobs planned) of valid configs that must validate and run
VALID: list[tuple[str, dict[str, Any], int]] = [
    (
        "unicode name and bfloat16",
        {"name": "évaluation ✓ 评估", "models": [{"id": "tiny-random/gpt2", "dtype": "bfloat16"}]},
        16,
    ),
    (
        "batch_size 1, top_p 1, penalty 1.3",
        {"runtime.batch_size": 1, "generation.top_p": 1.0, "generation.repetition_penalty": 1.3},
        16,
    ),
    (
        "model's own generation",
        {
            "models": [
                {"id": "tiny-random/gpt2", "generation": {"max_new_tokens": 2, "temperature": 0.01}}
            ]
        },
        16,
    ),
    (
        "three tasks, one sample",
        {
            "tasks": ["sentiment", "regard", "toxicity"],
            "samples_per_prompt": 1,
            "methods": ["vanilla"],
        },
        12,
    ),
    (
        "perplexity following a tuned method",
        {"scorers": ["gender", {"name": "perplexity", "params": {"model": "tiny-random/gpt2"}}]},
        16,
    ),
    (
        "every family",
        {
            "models": [{"id": f"tiny-random/{f}"} for f in ("gpt2", "opt", "llama", "falcon")],
            "methods": ["vanilla"],
            "samples_per_prompt": 1,
            "dataset.limit": 1,
        },
        8,
    ),
    ("score_during_generation false", {"runtime.score_during_generation": False}, 16),
    ("score_during_generation true", {"runtime.score_during_generation": True}, 16),
    ("no scorers", {"scorers": []}, 16),
    (
        "a head for a missing task warns",
        {"models": [{"id": "tiny-random/gpt2", "heads": {"regard": "nowhere.pt"}}]},
        16,
    ),
    (
        "uddia, pplm and eLIDAO",
        {
            "methods": ["uddia", {"name": "pplm", "params": {"steps": 1}}, "elidao-prod"],
            "samples_per_prompt": 1,
        },
        12,
    ),
]


def _valid(name: str, change: dict[str, Any], jobs: int) -> None:
    @trial("configs", f"valid: {name}")
    def check(ctx: Ctx) -> None:
        path = ctx.config(base_config(**change))
        ctx.expect(ctx.cli("validate", path), 0, "0 problem(s)")
        ctx.expect(ctx.cli("run", path, "--out", "run", "--no-ray", "--no-progress"), 0)
        scorers = [s if isinstance(s, str) else s["name"] for s in base_config(**change)["scorers"]]
        ctx.check_run(ctx.dir / "run", jobs, scorers)


for _n, _c, _j in VALID:
    _valid(_n, _c, _j)


@trial("configs", "--set and override options refused naming the option")
def set_options(ctx: Ctx) -> None:
    path = ctx.config(base_config())
    bad = [
        (["--set", "generation"], "generation"),
        (["--set", "methods.7.name=vanilla"], "methods.7"),
        (["--set", "generation.top_p=abc"], "generation.top_p"),
        (["--set", "scorers.0.params.x=1"], "scorers.0.params"),
        (["--set", "name.x=1"], "name"),
        (["--limit", "0"], "limit"),
        (["--samples", "-1"], "samples"),
        (["--batch-size", "0"], "batch"),
        (["--device", "cuda:3"], "device"),
        (["--methods", "bogus"], "bogus"),
        (["--models", "tiny-random/nofamily"], "nofamily"),
    ]
    for args, needle in bad:
        ctx.expect(ctx.cli("validate", path, *args), 2, needle)


@trial("configs", "YAML alias bomb is refused or bounded")
def alias_bomb(ctx: Ctx) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    import yaml

    body = yaml.safe_dump(base_config(), sort_keys=False)
    text = (
        "\n".join(lines)
        + "\n"
        + body.replace("- lidao-min", "- {name: lidao-min, params: {head: *a8}}")
    )
    path = ctx.config(text)
    ctx.expect(ctx.cli("validate", path, timeout=120), 2, "aliases", "more than 100,000 values")
