"""Method × model checks (issues 39, 41): what a method's constructor finds out before the
first batch, `validate` finds out first, from the model's config and tokenizer files and no
weights, through the same function (`workers.methods.checks.method_problems`): the cache
layout, the model's tokenizer, the experts' and GeDi's tokenizers and codes, parameters a
task has no published value for, eLIDAO's instruction and its length, a head's width."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.cli.validate import validate
from harness.config import parse_config
from jobs.spec import ModelRef
from tests.validate_helpers import problems_of, write_config
from workers.methods.base import MethodError
from workers.methods.checks import facts_of, method_problems, read_facts
from workers.methods.registry import load_method, resolve_params
from workers.models import load_lm


def checked(tmp_path: Path, **changes: Any) -> list[str]:
    """The problem lines `validate` lists for the tiny config with `changes`."""
    cfg = parse_config(json.loads(write_config(tmp_path, **changes).read_text()))
    lines, _ = validate(cfg, "c.yaml")
    return problems_of(lines) if any(ln.startswith("problems (") for ln in lines) else []


def build(lm: Any, name: str, params: dict[str, Any], task: str = "sentiment") -> Any:
    return load_method(name)(lm, resolve_params(name, params, lm.ref.id), task)


def save_tiny(folder: Path, extra_tokens: int = 0) -> str:
    """A tiny GPT-2 and its tokenizer (with `extra_tokens` more) saved as a local folder."""
    from workers.tiny import build_tiny_lm

    model, tok = build_tiny_lm("tiny-random/gpt2")
    tok.add_tokens([f"extra{i}" for i in range(extra_tokens)])
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def config_only(folder: Path, **config: Any) -> str:
    """A model folder with a config.json and the tiny tokenizer, no weights: what `validate`
    reads of a model."""
    from workers.tiny import tiny_tokenizer

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    tiny_tokenizer().save_pretrained(folder)
    return str(folder)


def test_a_cache_layout_is_checked_by_validate_as_the_method_checks_it(tmp_path: Path) -> None:
    """Chunked attention (Llama 4's layout): refused for the methods that touch θ's cache by
    `validate`, from config.json alone, and by the method in the actor, in the same words;
    sliding windows (Gemma 3's) are accepted by both; vanilla runs on any layout."""
    kinds = ["chunked_attention", "full_attention"]
    chunked = config_only(
        tmp_path / "chunked", model_type="llama4_text", layer_types=kinds, vocab_size=867
    )
    sliding = config_only(
        tmp_path / "sliding", model_type="gemma3_text", vocab_size=867, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    methods = ["vanilla", "lidao-min", "pplm"]
    lines = checked(tmp_path, models=[{"id": chunked}, {"id": sliding}], methods=methods)
    layout = [ln for ln in lines if ln.startswith("methods.")]
    why = (
        "cannot run on this model (model type {}): 1 of 2 cache layers are "
        "chunked_attention; it handles full_attention, sliding_attention layers only"
    )
    assert layout == [
        f"methods.1: lidao-min {why.format('llama4_text')} (model {chunked})",
        f"methods.2: pplm {why.format('llama4_text')} (model {chunked})",
    ]
    lm = load_lm(ModelRef("tiny-random/llama"), device="cpu")
    lm.model.config.layer_types = kinds  # what the loaded model's config then says
    for name in ("lidao-min", "pplm"):
        with pytest.raises(MethodError) as exc:
            build(lm, name, {})
        assert (
            str(exc.value)
            == f"method {name}: {name} {why.format('llama')} (model tiny-random/llama)"
        )
    build(lm, "vanilla", {})


def test_a_tokenizer_with_ids_beyond_the_models_embeddings_is_refused(tmp_path: Path) -> None:
    model = save_tiny(tmp_path / "model")
    bigger = save_tiny(tmp_path / "bigger", extra_tokens=3)
    lines = checked(tmp_path, models=[{"id": model, "tokenizer": bigger}])
    size = read_facts(model).config["vocab_size"]
    why = (
        f"the tokenizer gives ids up to {size + 2}, but model {model} has {size} embeddings; "
        "use the model's own tokenizer (or one of the same vocabulary)"
    )
    assert lines == [f"models.0.tokenizer: {why}"]
    lm = load_lm(ModelRef(model, tokenizer=bigger), device="cpu")
    with pytest.raises(MethodError) as exc:
        build(lm, "vanilla", {})
    assert str(exc.value) == f"method vanilla: {why}"
    assert checked(tmp_path, models=[{"id": model, "tokenizer": model}]) == []


def test_experts_and_gedi_tokenizers_and_codes_are_checked_against_the_model(
    tmp_path: Path, models: dict[str, str]
) -> None:
    other = models["other"]  # a tiny GPT-2 whose tokenizer has one more token
    lines = checked(
        tmp_path,
        methods=[
            {"name": "dexperts", "params": {"expert": other, "anti_expert": "tiny-random/gpt2"}},
            {"name": "gedi", "params": {"gedi_model": "tiny-random/gpt2", "code_desired": "a b"}},
        ],
    )
    assert lines[0].startswith(
        f"methods.0.params.expert: dexperts expert '{other}' has a different tokenizer than "
        "model 'tiny-random/gpt2' (868 vs 867 entries; only in the model: []; only in "
        "dexperts expert: ['zebra']"
    )
    assert lines[1] == (  # 'b' is not a word of the tiny vocabulary: <unk> (id 1)
        "methods.1.params.code_desired: class code 'a b' is 2 tokens [130, 1] for "
        "tiny-random/gpt2; it must be one"
    )
    assert len(lines) == 2
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    with pytest.raises(MethodError, match="only in dexperts expert: \\['zebra'\\]"):
        build(lm, "dexperts", {"expert": other, "anti_expert": "tiny-random/gpt2"})
    with pytest.raises(MethodError, match="class code 'a b' is 2 tokens"):
        build(lm, "gedi", {"gedi_model": "tiny-random/gpt2", "code_desired": "a b"})


@pytest.mark.parametrize(
    ("method", "field", "why"),
    [
        ("dexperts", "alpha", "no published alpha for task 'regard'; set alpha"),
        ("gedi", "code_desired", "no published class code for task 'regard'; set code_desired"),
    ],
)
def test_a_parameter_the_task_has_no_published_value_for_is_refused(
    tmp_path: Path, method: str, field: str, why: str
) -> None:
    """Issue 41: dexperts on regard without alpha passed validate and failed every job."""
    models = {"expert": "tiny-random/gpt2", "anti_expert": "tiny-random/gpt2"}
    params = models if method == "dexperts" else {"gedi_model": "tiny-random/gpt2"}
    lines = checked(tmp_path, methods=[{"name": method, "params": params}], tasks=["regard"])
    assert f"methods.0.params.{field}: {why}" in lines
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    with pytest.raises(MethodError, match=why):
        build(lm, method, params, task="regard")
    for task in ("sentiment", "toxicity"):  # published values: accepted
        assert checked(tmp_path, methods=[{"name": method, "params": params}], tasks=[task]) == []


@pytest.mark.parametrize(
    ("instruction", "why"),
    [
        (
            "Be fair.",
            "'Be fair.' is neither a template name (plain, instruct) nor a custom template "
            "holding #GENDER# (where the prompt's group is written)",
        ),
        (
            "Talk about #GENDER#\x00.",
            "holds control character(s) U+0000; of those only newline and tab",
        ),
        ("\x1b[1m#GENDER#\x07", "holds control character(s) U+0007, U+001B; of those only newline"),
        ("#GENDER# \u202esaid", "holds control character(s) U+202E; of those only newline"),
    ],
)
def test_an_elidao_instruction_run_cannot_use_is_refused_by_validate(
    tmp_path: Path, instruction: str, why: str
) -> None:
    """Issue 41: a custom instruction without #GENDER#, or with NUL / ESC / BEL, passed
    validate and failed every job at start. Both now say why, in the same words."""
    method = {"name": "elidao-min", "params": {"instruction": instruction}}
    lines = checked(tmp_path, methods=[method])
    assert len(lines) == 1 and lines[0].startswith(f"methods.0.params.instruction: {why}")
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    with pytest.raises(MethodError) as exc:
        build(lm, "elidao-min", {"instruction": instruction})
    assert lines[0].split(": ", 1)[1] in str(exc.value)


def test_elidao_instruction_and_longest_prompt_must_fit_the_context(tmp_path: Path) -> None:
    """At the boundary the run's own rule (`ReferenceStream.start`) agrees: the longest
    gendered example prompt is 8 tokens with BOS, the instruction 2 + 'female' / 'male'."""
    prefix = "word " * 300
    instruction = prefix + "#GENDER#"
    method = {"name": "elidao-min", "params": {"instruction": instruction}}
    need = 8 + 301
    fits = checked(tmp_path, methods=[method], generation={"max_new_tokens": 512 - need})
    assert fits == []
    over = checked(tmp_path, methods=[method], generation={"max_new_tokens": 513 - need})
    assert over == [
        f"methods.0.params.instruction: elidao-min's instruction + the longest prompt with a "
        f"group ({need} tokens) + max_new_tokens {513 - need} exceed the 512 tokens of model "
        "tiny-random/gpt2 (models.0.id); shorten the instruction or the prompts, or lower "
        f"max_new_tokens to at most {512 - need}"
    ]


def test_a_head_as_wide_as_the_cached_models_config_says(tmp_path: Path, offline_hub: str) -> None:
    """A hub model in the cache (config only): its hidden size is read from its config.json,
    so a head of another width is refused before any weight is downloaded."""
    from tests.test_task_heads import write_head

    snapshot = Path(offline_hub and str(tmp_path / "hf")) / "hub" / "models--org--wide"
    (snapshot / "refs").mkdir(parents=True)
    (snapshot / "refs" / "main").write_text("abc")
    (snapshot / "snapshots" / "abc").mkdir(parents=True)
    config = {"model_type": "gpt2", "n_embd": 96, "n_positions": 512}
    (snapshot / "snapshots" / "abc" / "config.json").write_text(json.dumps(config))
    head = write_head(tmp_path, "tiny-random/gpt2", "sentiment")
    data = json.loads(write_config(tmp_path).read_text())
    data.update(models=[{"id": "org/wide", "heads": {"sentiment": head}}], methods=["lidao-min"])
    with pytest.raises(ValueError, match="is 64 wide, but model org/wide has hidden size 96"):
        parse_config(data)


def test_the_checks_see_the_same_facts_in_files_and_in_a_loaded_model(tmp_path: Path) -> None:
    """`read_facts` (files, on the driver) and `facts_of` (a loaded model, in the actor)
    agree on what the checks read: the config's keys and the tokenizer."""
    from workers.tiny import TINY_FAMILIES, TINY_PREFIX

    folder = save_tiny(tmp_path / "m")
    for spec in [TINY_PREFIX + f for f in TINY_FAMILIES if f != "bert"] + [folder]:
        lm = load_lm(ModelRef(spec), device="cpu")
        files, loaded = read_facts(spec), facts_of(lm)
        assert files.vocab is not None and loaded.vocab is not None
        assert files.vocab() == loaded.vocab()
        assert files.encode is not None and loaded.encode is not None
        assert files.encode("The nurse said") == loaded.encode("The nurse said")
        for key, value in files.config.items():
            assert loaded.config.get(key) == value, (spec, key)
    assert method_problems("lidao-min", {}, "sentiment", read_facts(folder)) == []
