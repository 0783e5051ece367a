"""The built-in methods' own checks, without torch: their parameters for a task, and the
models they run on, read from config and tokenizer files (`ModelFacts`), never from weights.

A method's constructor (inside the actor, with `facts_of(lm)`) and `validate` (on the driver,
with `read_facts`) call the same `method_problems`, so that what `run` finds out before its
first batch, `validate` finds out first (docs/design.md, "Checks").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.redact import has_controls
from workers.methods.cache_layout import engine_layout_problem, text_config
from workers.tiny import TINY_PREFIX

TASK_ALPHA = {"toxicity": 2.0, "sentiment": 3.2}  # DExperts' published α per task
TASK_CODES = {"toxicity": ("clean", "dirty"), "sentiment": ("positive", "negative")}  # GeDi
GENDER_SLOT = "#GENDER#"
Problem = tuple[str, str]  # (field under the method's entry: "params.alpha", or ""; why)


@dataclass(frozen=True)
class ModelFacts:
    """What the checks read of a model: its config (config.json's keys; empty when not here)
    and its tokenizer (`encode`: text → ids without special tokens; `vocab`: token → id),
    None when this machine has no tokenizer file of it."""

    id: str
    config: Mapping[str, Any]
    encode: Callable[[str], list[int]] | None = None
    vocab: Callable[[], Mapping[str, int]] | None = None


def facts_of(lm: Any) -> ModelFacts:
    """The facts of a loaded `workers.models.LoadedLM` (inside an actor)."""
    tok = lm.tokenizer

    def encode(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    return ModelFacts(lm.ref.id, lm.model.config.to_dict(), encode, tok.get_vocab)


def read_config(spec: str, revision: str | None = None) -> dict[str, Any]:
    """`spec`'s config, read without weights ({} when not here): a tiny model's from
    `workers.tiny`, else `workers.hub.model_config` (its folder, the Hugging Face cache, or a
    GGUF file's header)."""
    from workers import hub
    from workers.tiny import tiny_config_facts

    if spec.startswith(TINY_PREFIX):
        return tiny_config_facts(spec[len(TINY_PREFIX) :])
    return hub.model_config(spec, revision) or {}


def read_facts(spec: str, revision: str | None = None, tokenizer: str | None = None) -> ModelFacts:
    """The facts of `spec` from files on this machine (`read_config`, the tokenizer's
    tokenizer.json): nothing downloaded, no torch, no transformers."""
    from workers import hub
    from workers.tiny import report_tokenizer

    tok_id = tokenizer or spec
    try:
        local = str(Path(tok_id).expanduser()) if hub.is_local(tok_id) else tok_id
        raw = report_tokenizer(local, revision if tokenizer is None else None)
    except Exception:  # noqa: BLE001 - an unreadable tokenizer file: `check_models` says so
        raw = None
    if raw is None:
        return ModelFacts(spec, read_config(spec, revision))

    def encode(text: str) -> list[int]:
        return list(raw.encode(text, add_special_tokens=False).ids)

    return ModelFacts(spec, read_config(spec, revision), encode, raw.get_vocab)


def tokenizer_problem(model: ModelFacts) -> str | None:
    """Why `model`'s tokenizer gives ids its embeddings do not have (a `tokenizer:` of another
    model), or None (also when the tokenizer or the config is not here)."""
    size = text_config(model.config).get("vocab_size")
    if model.vocab is None or not isinstance(size, int):
        return None
    top = max(model.vocab().values(), default=-1)
    if top < size:
        return None
    return (
        f"the tokenizer gives ids up to {top}, but model {model.id} has {size} embeddings; "
        "use the model's own tokenizer (or one of the same vocabulary)"
    )


# The paper's templates (its Appendix, Table 5); the Falcon one keeps the published typo.
TEMPLATES = {
    "plain": (
        "Please help me complete the sentence in #Input#. You should focus on the mentioned "
        "#GENDER# in #Input# as frequently as possible.\n\n#Input#:\n"
    ),
    "instruct": (
        "#Instruction#:\nYour objecive is to continue a given text in #Input#. If a #GENDER# "
        "presents in #Input#, you SHOULD mention this #GENDER# as frequently and explicitly as "
        "possible.\n\n#Input#:\n"
    ),
}


def template_text(family: str, choice: str | None) -> str:
    """eLIDAO's instruction: by family (Falcon → instruct), a named one, or a custom text."""
    if choice is None:
        return TEMPLATES["instruct" if family == "falcon" else "plain"]
    return TEMPLATES.get(choice, choice)


def instruction_problem(instruction: Any) -> str | None:
    """Why eLIDAO's `instruction` parameter cannot be used, or None: a template name, or a
    custom template holding #GENDER# (the prompt's group is written there: without it the
    reference stream would not depend on the group), with no control character but newline
    and tab, nor a bidirectional mark (`jobs.redact.has_controls`: they would reach the
    model's input unseen)."""
    if instruction is None or instruction in TEMPLATES:
        return None
    if not isinstance(instruction, str):
        return f"{instruction!r} must be text"
    bad = sorted({c for c in instruction if has_controls(c)})  # what a terminal acts on
    if bad:
        shown = ", ".join(f"U+{ord(c):04X}" for c in bad)
        return f"holds control character(s) {shown}; of those only newline and tab are allowed"
    if GENDER_SLOT not in instruction:
        return (
            f"{instruction!r} is neither a template name ({', '.join(TEMPLATES)}) nor a "
            f"custom template holding {GENDER_SLOT} (where the prompt's group is written)"
        )
    return None


# Parameters that must be above the catalog's closed range's low end (`PARAM_RANGES`).
ABOVE_ZERO = {"dexperts": ("filter_p",), "gedi": ("target_p",)}


def _task_problems(name: str, params: Mapping[str, Any], task: str) -> list[Problem]:
    """Parameters a method needs for `task` that have no published value; bounds that are
    open (the catalog's ranges are closed)."""
    out = [
        (f"params.{key}", f"must be above 0, got {params[key]}")
        for key in ABOVE_ZERO.get(name, ())
        if isinstance(params.get(key), int | float) and params[key] <= 0
    ]
    if name == "dexperts" and params.get("alpha") is None and task not in TASK_ALPHA:
        out.append(("params.alpha", f"no published alpha for task {task!r}; set alpha"))
    if name == "gedi" and task not in TASK_CODES:
        missing = [k for k in ("code_desired", "code_undesired") if params.get(k) is None]
        out += [
            (f"params.{k}", f"no published class code for task {task!r}; set {k}") for k in missing
        ]
    return out


def same_tokenizer(model: ModelFacts, extra: ModelFacts, what: str) -> str | None:
    """Why `extra` (an expert, a GeDi model) cannot score `model`'s token ids, or None (also
    when a tokenizer or config is not here to compare)."""
    if model.vocab is not None and extra.vocab is not None:
        a, b = model.vocab(), extra.vocab()
        if a != b:
            only_a, only_b = sorted(set(a) - set(b))[:5], sorted(set(b) - set(a))[:5]
            moved = sorted(t for t in set(a) & set(b) if a[t] != b[t])[:5]
            return (
                f"{what} {extra.id!r} has a different tokenizer than model {model.id!r} "
                f"({len(b)} vs {len(a)} entries; only in the model: {only_a}; only in {what}: "
                f"{only_b}; different ids: {moved}); it must share the model's tokenizer "
                "(GPT-2 family for the published GeDi and DExperts models)"
            )
    va, vb = (
        text_config(model.config).get("vocab_size"),
        text_config(extra.config).get("vocab_size"),
    )
    if isinstance(va, int) and isinstance(vb, int) and va != vb:
        return f"{what} {extra.id!r} scores {vb} token ids, model {model.id!r} scores {va}"
    return None


def _extra_problems(
    name: str,
    params: Mapping[str, Any],
    task: str,
    model: ModelFacts | None,
    extras: Mapping[str, ModelFacts | None],
) -> list[Problem]:
    """The extra models (DExperts' experts, GeDi's class-conditional LM) against the model."""
    out: list[Problem] = []
    for key in {"dexperts": ("expert", "anti_expert"), "gedi": ("gedi_model",)}.get(name, ()):
        spec = params.get(key)
        if not isinstance(spec, str) or not spec.strip():
            out.append(
                (f"params.{key}", f"required: a hub id or local path of the model; got {spec!r}")
            )
            continue
        facts = extras.get(key)
        what = f"{name} {key}"
        problem = None if model is None or facts is None else same_tokenizer(model, facts, what)
        if problem:
            out.append((f"params.{key}", problem))
        elif key == "gedi_model" and facts is not None and facts.encode is not None:
            for code_key, code in zip(("code_desired", "code_undesired"), gedi_codes(params, task)):
                ids = facts.encode(code) if code else []
                if code and len(ids) != 1:
                    out.append(
                        (
                            f"params.{code_key}",
                            f"class code {code!r} is {len(ids)} tokens {ids[:8]} for {spec}; "
                            "it must be one",
                        )
                    )
    return out


def gedi_codes(params: Mapping[str, Any], task: str) -> list[str]:
    """GeDi's (desired, undesired) class codes: the given ones, else the task's published."""
    given = (params.get("code_desired"), params.get("code_undesired"))
    defaults = TASK_CODES.get(task, ("", ""))
    return [str(d if g is None else g) for g, d in zip(given, defaults)]


def method_problems(
    name: str,
    params: Mapping[str, Any],
    task: str,
    model: ModelFacts | None = None,
    extras: Mapping[str, ModelFacts | None] | None = None,
) -> list[Problem]:
    """Everything wrong with method `name` (resolved `params`) for `task` on `model` that
    is known without weights: parameters with no published value for the task, eLIDAO's
    instruction, the extra models' presence and tokenizers (`extras`, by parameter), GeDi's
    codes, and the model's layout for the methods that touch θ's KV cache
    (`cache_layout.engine_layout_problem`). [] when all is well (a plugin method: its own)."""
    out = _task_problems(name, params, task)
    if name in ("elidao-min", "elidao-prod"):
        problem = instruction_problem(params.get("instruction"))
        out += [("params.instruction", problem)] if problem else []
    out += _extra_problems(name, params, task, model, extras or {})
    layout = None if model is None else engine_layout_problem(name, model.config)
    return out + ([("", f"{layout} (model {model.id})" if model else layout)] if layout else [])


def raise_problems(name: str, problems: list[Problem], error: type[Exception]) -> None:
    """Raise `error` naming each problem of method `name` (inside the actor)."""
    if problems:
        listed = "; ".join(
            f"{key.removeprefix('params.')}: {why}" if key else why for key, why in problems
        )
        raise error(f"method {name}: {listed}")
