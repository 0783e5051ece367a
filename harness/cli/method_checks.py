"""`validate`'s method × model × task checks: each method's own `method_problems`
(`workers.methods.checks`, what its constructor runs in the actor) on the facts of the models
read from files on this machine (configs, tokenizers; no weights, no torch), and eLIDAO's
instruction in front of the longest prompt against the model's context."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.cli.preflight import METHOD_MODEL_PARAMS, Item
from harness.config import RunConfig
from workers import hub
from workers.methods.checks import ModelFacts, read_facts

ELIDAO = ("elidao-min", "elidao-prod")


class Facts:
    """`read_facts` of each (model, revision, tokenizer), read once."""

    def __init__(self) -> None:
        self._read: dict[tuple[str, str | None, str | None], ModelFacts] = {}

    def __call__(
        self, spec: str, revision: str | None = None, tokenizer: str | None = None
    ) -> ModelFacts:
        key = (spec, revision, tokenizer)
        if key not in self._read:
            self._read[key] = read_facts(spec, revision, tokenizer)
        return self._read[key]


def check_methods(cfg: RunConfig, facts: Facts | None = None) -> list[Item]:
    """One item per problem of a method on a model for a task, naming the method's field
    (`methods.J.params.KEY`, or `methods.J`), and per model whose tokenizer does not fit it."""
    from workers.methods.checks import method_problems, tokenizer_problem
    from workers.methods.registry import resolve_params

    facts = facts or Facts()
    items: dict[tuple[str, str], Item] = {}
    for i, model in enumerate(cfg.models):
        lm = facts(model.id, model.revision, model.tokenizer)
        mismatch = tokenizer_problem(lm)
        if mismatch:
            field = f"models.{i}.tokenizer" if model.tokenizer else f"models.{i}.id"
            items[(field, mismatch)] = Item(
                field, model.tokenizer or model.id, "tokenizer", mismatch
            )
        for j, method in enumerate(cfg.methods):
            params = resolve_params(method.name, dict(method.params), model.id)
            extras = {
                key: facts(value)
                for key in METHOD_MODEL_PARAMS.get(method.name, ())
                if isinstance(value := params.get(key), str) and value.strip()
            }
            for task in cfg.tasks:
                for key, why in method_problems(method.name, params, task, lm, extras):
                    field = f"methods.{j}.{key}" if key else f"methods.{j}"
                    items.setdefault((field, why), Item(field, method.name, "method", why))
    return list(items.values())


def check_instruction_context(
    cfg: RunConfig, prompts: Sequence[Any], facts: Facts | None = None
) -> list[Item]:
    """eLIDAO writes its instruction (the prompt's group in #GENDER#) before each prompt with
    a group: instruction + prompt (BOS added) + max_new_tokens must fit the model's context,
    as `workers.methods.elidao.ReferenceStream` requires of every row."""
    from harness.stages.generation.planning import generation_for, load_words
    from jobs.words import label_text
    from workers.methods.cache_layout import text_config
    from workers.methods.checks import instruction_problem, template_text
    from workers.methods.registry import resolve_params

    methods = [(j, m) for j, m in enumerate(cfg.methods) if m.name in ELIDAO]
    if not methods or not prompts:
        return []
    facts = facts or Facts()
    words = load_words(cfg)
    groups = [label_text(p.text, words) for p in prompts]
    items = []
    for i, model in enumerate(cfg.models):
        context = hub.model_context(model.id, model.revision)
        lm = facts(model.id, model.revision, model.tokenizer)
        if context is None or lm.encode is None:
            continue
        family = "falcon" if text_config(lm.config).get("model_type") == "falcon" else "other"
        new = generation_for(cfg, model).max_new_tokens
        prompt_tokens = [1 + len(lm.encode(p.text)) for p in prompts]
        for j, method in methods:
            choice = resolve_params(method.name, dict(method.params), model.id)["instruction"]
            if instruction_problem(choice):
                continue  # `check_methods` names it
            template = template_text(family, choice)
            lengths = {g: len(lm.encode(template.replace("#GENDER#", g))) for g in set(groups)}
            need = max(
                (n + lengths[g] for n, g in zip(prompt_tokens, groups) if g != "none"), default=0
            )
            if need + new > context:
                items.append(
                    Item(
                        f"methods.{j}.params.instruction",
                        str(choice),
                        "too long",
                        f"{method.name}'s instruction + the longest prompt with a group ({need} "
                        f"tokens) + max_new_tokens {new} exceed the {context} tokens of model "
                        f"{model.id} (models.{i}.id); shorten the instruction or the prompts, "
                        f"or lower max_new_tokens to at most {max(0, context - need)}",
                    )
                )
    return items
