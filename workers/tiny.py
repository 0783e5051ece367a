"""Offline tiny random-weight models under the reserved `tiny-random/<family>` ids, so that
everything runs with no network and no GPU. The weights come from a fixed seed (the same model
in every process, same torch version); the word-level tokenizer holds every built-in gender
seed word as a single token.
"""

from __future__ import annotations

from typing import Any

TINY_PREFIX = "tiny-random/"
TINY_FAMILIES = ("gpt2", "opt", "opt-proj", "falcon", "llama", "gemma3", "bert")
TINY_SEED = 1234
TINY_WIDTH = 64  # hidden size of every tiny model
TINY_PROJECTED = 32  # `opt-proj`: the embeddings' and the LM head's width (projected in / out)
TINY_POSITIONS = 512  # tokens (prompt + continuation) of every family but Falcon's
FALCON_POSITIONS = 2048  # transformers' default for Falcon (rotary: a declared length, no table)
# `gemma3`: Gemma 3's layout (sliding-window layers below a full-attention one, scaled
# embeddings, four norms per block plus per-head query and key norms) with a window of 4
# positions, which every test prompt plus its continuation exceeds
GEMMA3_WINDOW = 4
GEMMA3_LAYERS = ("sliding_attention", "sliding_attention", "sliding_attention", "full_attention")


def tiny_context(family: str) -> int:
    """The context (`n_positions` / `max_position_embeddings`) of `tiny-random/<family>`."""
    return FALCON_POSITIONS if family == "falcon" else TINY_POSITIONS


def tiny_config_facts(family: str) -> dict[str, Any]:
    """The config.json keys of `tiny-random/<family>` that the checks read (torch-free; its
    `tiny_config` agrees, tests/test_method_checks.py): {} for a family not listed here."""
    if family not in ("gpt2", "opt", "opt-proj", "falcon", "llama", "bert"):
        return {}
    model_type = {"opt-proj": "opt"}.get(family, family)
    layers = 2 if family == "bert" else 4
    facts: dict[str, Any] = {"model_type": model_type, "vocab_size": len(tiny_vocab())}
    if family == "gpt2":
        return {**facts, "n_embd": TINY_WIDTH, "n_layer": layers, "n_positions": TINY_POSITIONS}
    facts.update(hidden_size=TINY_WIDTH, num_hidden_layers=layers)
    if family in ("opt", "opt-proj"):
        facts["word_embed_proj_dim"] = tiny_head_width(family)
    facts["max_position_embeddings"] = tiny_context(family)
    return facts


def check_tiny_id(model_id: str, causal: bool = True) -> str | None:
    """Why `model_id` (under `TINY_PREFIX`) names no tiny model (`causal`: no causal LM), or None."""
    family = model_id[len(TINY_PREFIX) :]
    if family in TINY_FAMILIES and not (causal and family == "bert"):
        return None
    known = ", ".join(TINY_PREFIX + f for f in TINY_FAMILIES if not (causal and f == "bert"))
    return f"unknown tiny model {model_id!r}; known: {known}"


def tiny_head_width(family: str) -> int:
    """The width of the states the LM head of `tiny-random/<family>` reads (its attribute heads'
    input width)."""
    return TINY_PROJECTED if family == "opt-proj" else TINY_WIDTH


_COMMON = """
the a an and or but if then so because of to in on at by for with from about as into over
after before under between through during without within up down out off again further once
is are was were be been being have has had do does did will would shall should can could may
might must not no yes very too also just only even still already never always often sometimes
i you we they it this that these those who whom whose which what where when why how all any
both each few more most other some such own same than there here my your our their its
one two three four five six seven ten hundred first second last next new old good bad great
little big small long short high low young early late right left best better worse worst
time year day week night morning world life way people family friend friends home house
school work job company city country state government group team game money place part
story book word name car door room water food hand head eye face body heart mind love
say said says tell told ask asked think thought know knew see saw look looked come came
go went get got make made take took give gave find found call called feel felt leave left
want wanted need needed like liked help helped try tried keep kept let begin began seem
show showed hear heard play played run ran move moved live lived believe bring brought
happen happened write wrote sit sat stand stood lose lost pay paid meet met include
continue set learn change lead understand watch follow stop create speak read allow add
spend grow open walk win offer remember consider appear buy wait serve die send expect
build stay fall cut reach kill remain suggest raise pass sell require report decide pull
nice happy sad angry kind cruel smart stupid strong weak beautiful ugly rich poor honest
famous known best-known successful talented quiet loud calm wild gentle brave afraid
doctor nurse teacher student worker engineer lawyer police officer soldier driver artist
writer singer player leader boss manager owner neighbor person child children baby adult
""".split()

_PUNCT = list(".,;:!?'\"-()")
SPECIALS = ("<|endoftext|>", "<unk>", "<pad>")


def tiny_vocab() -> list[str]:
    """Specials, punctuation, the built-in gender seed words, then common English words."""
    from jobs.words import BUILTIN_PAIRS

    words: dict[str, None] = dict.fromkeys(SPECIALS)
    words.update(dict.fromkeys(_PUNCT))
    for pair in BUILTIN_PAIRS:
        words.update(dict.fromkeys(pair))
    words.update(dict.fromkeys(_COMMON))
    words.update(dict.fromkeys(w.capitalize() for w in _COMMON))
    return list(words)


def tiny_raw_tokenizer() -> Any:
    """The `tokenizers.Tokenizer` of `tiny_tokenizer` (no transformers, no torch)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(tiny_vocab())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # joins words with spaces
    return tok


def report_tokenizer(model: str, revision: str | None) -> Any:
    """The report's tokenizer of `model` (`results.report.pieces.TokenizerFor`): a tiny model's
    is built here, any other comes from its directory or the Hugging Face cache (never
    downloaded, no transformers, no torch)."""
    if model.startswith(TINY_PREFIX):
        return tiny_raw_tokenizer()
    from results.report.pieces import cached_tokenizer

    return cached_tokenizer(model, revision)


def tiny_tokenizer() -> Any:
    """A `PreTrainedTokenizerFast` over `tiny_vocab()` (whitespace + punctuation split)."""
    from transformers import PreTrainedTokenizerFast

    tok = tiny_raw_tokenizer()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.padding_side = "left"
    return fast


def tiny_config(family: str, vocab_size: int) -> Any:
    import transformers as tf

    eos = bos = 0  # "<|endoftext|>" is id 0 in tiny_vocab()
    common: dict[str, Any] = {"vocab_size": vocab_size, "bos_token_id": bos, "eos_token_id": eos}
    if family == "gpt2":
        return tf.GPT2Config(
            n_layer=4, n_embd=TINY_WIDTH, n_head=4, n_positions=TINY_POSITIONS, **common
        )
    # every other family: 4 heads over TINY_WIDTH, "<pad>" (id 2) as padding
    heads: dict[str, Any] = {"hidden_size": TINY_WIDTH, "num_attention_heads": 4, "pad_token_id": 2}
    decoder: dict[str, Any] = {"num_hidden_layers": 4, **heads, **common}
    if family in ("opt", "opt-proj"):  # opt-proj is opt-350m's layout: post-norm blocks, no
        # final norm, the embeddings (32 wide) projected in to the blocks' 64 and out again
        # before the LM head
        return tf.OPTConfig(
            ffn_dim=128,
            word_embed_proj_dim=tiny_head_width(family),
            do_layer_norm_before=family == "opt",
            max_position_embeddings=TINY_POSITIONS,
            **decoder,
        )
    if family == "falcon":
        return tf.FalconConfig(
            new_decoder_architecture=False,
            multi_query=True,
            parallel_attn=True,
            bias=False,
            alibi=False,
            **decoder,
        )
    mlp: dict[str, Any] = {"intermediate_size": 128, "max_position_embeddings": TINY_POSITIONS}
    if family == "llama":
        return tf.LlamaConfig(num_key_value_heads=2, **mlp, **decoder)
    if family == "gemma3":
        return tf.Gemma3TextConfig(
            num_key_value_heads=2,
            head_dim=TINY_WIDTH // 4,
            query_pre_attn_scalar=TINY_WIDTH // 4,
            sliding_window=GEMMA3_WINDOW,
            layer_types=list(GEMMA3_LAYERS),
            **mlp,
            **decoder,
        )
    if family == "bert":  # an encoder, for classifier scorers in tests
        return tf.BertConfig(num_hidden_layers=2, vocab_size=vocab_size, **mlp, **heads)
    raise ValueError(f"unknown tiny family {family!r}; known: {', '.join(TINY_FAMILIES)}")


def build_tiny_lm(model_id: str, dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) for `tiny-random/<family>`, weights from TINY_SEED."""
    import torch
    from transformers import AutoModelForCausalLM

    family = model_id[len(TINY_PREFIX) :]
    problem = check_tiny_id(model_id)
    if problem:
        raise ValueError(problem)
    tokenizer = tiny_tokenizer()
    config = tiny_config(family, len(tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = AutoModelForCausalLM.from_config(config)
    model.config.name_or_path = model_id
    if dtype is not None:
        model = model.to(dtype)
    return model.eval(), tokenizer
