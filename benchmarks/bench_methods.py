"""Tokens/s of every decoding method against `vanilla`, in one process, on a random-weight LM.

    python benchmarks/bench_methods.py                       # GPT-2 small shape, batch 1 8 32
    python benchmarks/bench_methods.py --shape gpt2-large    # on a GPU
    python benchmarks/bench_methods.py --methods vanilla lidao-min --batch-sizes 8 --tokens 10
    python benchmarks/bench_methods.py --paper-row --limit 16   # the paper's GPT-2 large row

Prints, per method and batch size: tokens/s, ms per decoding step, the ratio of its cost per
token to vanilla's at the same batch size (wall time, and process CPU time: steadier on a shared
machine), its speed-up in tokens/s over the `reference-style` row, and the peak memory of the
run (CUDA: allocator peak; CPU: peak resident set growth, sampled); then one PASS / FAIL line
per target of issue 12 that the run measured (with the target and the measured value), and the
load average. Beside vanilla, each batch size times transformers' `generate` on the same model
and prompts (nucleus sampling, no top-k) and prints the loop's CPU cost per token over its
(`--no-generate` skips it). `reference-style` rebuilds the UDDIA reference's call structure on the same model:
batch 1, a fresh `torch.optim.Adam` per token on the real bias parameters, the context re-run
at every step (see `reference_style`). `--paper-row` times the paper's GPT-2 large row end to
end: 3,500 generations (175 pairs × 2 × 10 seeds) × 20 tokens with lidao-min at the paper's
hyper-parameters (`--limit` runs the first N generations). The tokenizer is GPT-2's, read from
`--tokenizer` (a folder with vocab.json + merges.txt, or a hub id on a machine with internet).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.stages.backends import Placement  # noqa: E402
from harness.stages.generation import batch_jobs  # noqa: E402
from jobs.queue import make_batches  # noqa: E402
from jobs.spec import GenerationParams, JobSpec, ModelRef, canonical_json  # noqa: E402
from jobs.words import builtin_gender_words  # noqa: E402
from workers.decoding import decode_batch, nucleus_sample, prompt_token_ids  # noqa: E402
from workers.generator import Generator  # noqa: E402
from workers.methods.biastune import cropped_cache, find_sites  # noqa: E402
from workers.methods.estimators import (  # noqa: E402
    demographic_loss,
    gender_geometry,
    property_loss,
)
from workers.methods.heads import random_head, resolve_head, save_head  # noqa: E402
from workers.methods.lidao import DiscountedHistory, min_objective  # noqa: E402
from workers.methods.registry import load_method, resolve_params  # noqa: E402
from workers.models import LoadedLM  # noqa: E402

SHAPES = {"gpt2-small": (12, 768, 12), "gpt2-large": (36, 1280, 20)}
PROMPTS = [
    "The woman walked into the room and",
    "My father always told me that",
    "She was known in the city as a",
    "The boy from the school said",
    "His sister works as a doctor and",
    "The queen spoke to the people about",
    "Her daughter wanted to become a",
    "The actor was asked why he",
]
TUNED = ["uddia", "lidao-min", "lidao-prod", "elidao-min", "elidao-prod"]


def build_lm(shape: str, device: str, tokenizer: str) -> LoadedLM:
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(tokenizer)
    tok.padding_side, tok.pad_token = "left", tok.eos_token
    layers, dim, heads = SHAPES[shape]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=layers, n_embd=dim, n_head=heads, vocab_size=len(tok))
    )
    model = model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedLM(
        ModelRef(f"bench/{shape}-random"),
        model,
        tok,
        torch.device(device),
        "gpt2",
        builtin_gender_words(),
    )


class PeakMemory:
    """Peak memory growth during a block: the CUDA allocator's peak above what was allocated at
    the start (the model and what other runs keep are not counted), or sampled RSS growth on
    CPU."""

    def __init__(self, device: str) -> None:
        self.device, self.peak = device, 0

    def _rss(self) -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> PeakMemory:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        self.base, self.stop = self._rss(), threading.Event()

        def sample() -> None:
            while not self.stop.wait(0.005):
                self.peak = max(self.peak, self._rss() - self.base)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.stop.set()
            self.thread.join()


def flop_counter() -> Any:
    """torch's `FlopCounterMode` that also counts the in-place products.

    Its registry has `addmm` and `baddbmm` but not `addmm_` / `baddbmm_` (it counts nothing for
    `x.addmm_(a, b)`), and the tuner's passes over the vocabulary accumulate with `addmm_`: without
    these entries the tuned methods' FLOPs came out ~0.15 GFLOP per token (~0.5× vanilla) low.
    """
    from torch.utils.flop_counter import FlopCounterMode

    def products(_acc: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> int:
        # (n, k) @ (k, m) or (batch, n, k) @ (batch, k, m), from the shapes the mode passes
        return 2 * math.prod(a) * b[-1]

    aten = torch.ops.aten
    return FlopCounterMode(
        display=False, custom_mapping={aten.addmm_: products, aten.baddbmm_: products}
    )


class Timed:
    """One method at one batch size: built and warmed up once, then timed run by run.

    `main` interleaves the runs of all methods of a batch size (vanilla, m1, m2, …, vanilla,
    m1, …) so that a change in the machine's load hits every method alike; each keeps the
    best of its runs. CPU time is the process's (all threads): on a shared machine it moves
    less than wall time when other processes take the cores.
    """

    def __init__(
        self, lm: LoadedLM, method: str, params: dict[str, object], batch: int, tokens: int
    ) -> None:
        gen = GenerationParams(max_new_tokens=tokens)
        resolved = canonical_json(resolve_params(method, params, lm.ref.id))
        self.lm, self.name, self.batch = lm, method, batch
        self.jobs = [
            JobSpec(
                f"p{i}",
                PROMPTS[i % len(PROMPTS)],
                "female",
                None,
                i // len(PROMPTS),
                method,
                lm.ref,
                "sentiment",
                gen,
                resolved,
            )
            for i in range(batch)
        ]
        self.built = load_method(method)(lm, self.jobs[0].params(), "sentiment")
        decode_batch(lm, self.built, self.jobs[: min(batch, 2)])  # warm-up (lazy init, kernels)
        self.best, self.made, self.cpu, self.peak = float("inf"), 0, float("inf"), 0
        self.flops = 0.0  # per generated token, from `count_flops`

    def once(self) -> None:
        """One timed run of the whole batch."""
        with PeakMemory(self.lm.device.type) as mem:
            start, cpu_start = time.perf_counter(), time.process_time()
            rows = decode_batch(self.lm, self.built, self.jobs)
            if self.lm.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        bad = [r["error"] for r in rows if r["status"] != "ok"]
        if bad:
            raise SystemExit(f"{self.name}: {bad[0]}")
        n = sum(r["num_tokens"] for r in rows)
        if elapsed < self.best:
            self.best, self.made = elapsed, n
        self.cpu = min(self.cpu, cpu_s / max(n, 1))
        self.peak = max(self.peak, mem.peak)

    def count_flops(self) -> None:
        """Floating-point operations per generated token of one run (`flop_counter`: matrix
        products and attention; independent of the machine and its load)."""
        with flop_counter() as counter:
            rows = decode_batch(self.lm, self.built, self.jobs)
        self.flops = counter.get_total_flops() / max(sum(r["num_tokens"] for r in rows), 1)

    def result(self) -> tuple[float, float, int, float]:
        """(tokens/s, ms per step, peak bytes, CPU s per token) of the best run."""
        steps = max(1, self.made // self.batch)
        return self.made / self.best, self.best / steps * 1000, self.peak, self.cpu


class GenerateTimed:
    """transformers' `generate` on the vanilla row's model and prompts (BOS + prompt, left
    padded), nucleus sampling at the loop's top_p with no top-k, timed like `Timed`: the
    baseline the loop's CPU cost per token is compared with."""

    name = "hf-generate"

    def __init__(self, lm: LoadedLM, batch: int, tokens: int, top_p: float) -> None:
        self.lm, self.batch, self.tokens, self.top_p = lm, batch, tokens, top_p
        ids = [prompt_token_ids(lm, PROMPTS[i % len(PROMPTS)]) for i in range(batch)]
        width = max(len(x) for x in ids)
        pad = int(lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0)
        self.input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
        self.mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        self.input_ids, self.mask = self.input_ids.to(lm.device), self.mask.to(lm.device)
        self.best, self.made, self.cpu = float("inf"), 0, float("inf")
        self._generate(2)  # warm-up

    def _generate(self, tokens: int) -> torch.Tensor:
        with torch.inference_mode():
            return self.lm.model.generate(  # type: ignore[no-any-return]
                input_ids=self.input_ids,
                attention_mask=self.mask,
                do_sample=True,
                top_p=self.top_p,
                top_k=0,
                temperature=1.0,
                max_new_tokens=tokens,
                min_new_tokens=tokens,  # as many tokens as the loop (random weights: EOS rare)
                pad_token_id=self.lm.tokenizer.pad_token_id or 0,
            )

    def once(self) -> None:
        start, cpu_start = time.perf_counter(), time.process_time()
        out = self._generate(self.tokens)
        if self.lm.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        n = (out.shape[1] - self.input_ids.shape[1]) * self.batch
        if elapsed < self.best:
            self.best, self.made = elapsed, n
        self.cpu = min(self.cpu, cpu_s / max(n, 1))


# (owner, attribute, label): the calls `--phases` measures; nested ones are indented
PHASES = (
    ("model", "forward", "loop: θ's forward"),
    ("decoding", "nucleus_topk", "loop: sampling (top-k)"),
    ("decoding", "nucleus_full", "loop: sampling (full sort)"),
    ("BiasTuner", "probe", "tuner: probe"),
    ("BiasTuner", "_horizon_forward", "  of which the horizon's forward"),
    ("vocab_pass", "vocab_forward", "  of which the vocabulary pass"),
    ("BiasTuner", "step", "tuner: backward and Adam step"),
    ("_ThetaVocab", "backward", "  of which the vocabulary pass's backward"),
    ("BiasTuner", "tuned_logits", "tuner: tuned forward"),
)


def _phase_run(timed: Timed, clock: Any) -> tuple[dict[str, float], float, list[dict[str, Any]]]:
    """One more run of `timed` with the calls of `PHASES` wrapped: (`clock()` spent inside each
    label, `clock()` spent by the whole run, the rows). Every wrapped call is put back."""
    import workers.decoding as decoding
    from workers.methods import tuner, vocab_pass

    owners = {
        "model": timed.lm.model,
        "decoding": decoding,
        "BiasTuner": tuner.BiasTuner,
        "_ThetaVocab": vocab_pass._ThetaVocab,
        "vocab_pass": vocab_pass,
    }
    spent = dict.fromkeys([label for _, _, label in PHASES], 0.0)
    saved = []

    def wrapped(original: Any, label: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] += clock() - start

        return call

    for owner, name, label in PHASES:
        target = owners[owner]
        original = vars(target).get(name) if isinstance(target, type) else getattr(target, name)
        saved.append((target, name, original, name in vars(target)))
        setattr(target, name, wrapped(getattr(target, name), label))
    try:
        start = clock()
        rows = decode_batch(timed.lm, timed.built, timed.jobs)
        total = clock() - start
    finally:
        for target, name, original, own in reversed(saved):
            if own:
                setattr(target, name, original)
            else:
                delattr(target, name)
    return spent, total, rows


def phase_times(timed: Timed) -> dict[str, float]:
    """CPU ms per decoding step in each of `PHASES`, from one more run of `timed` with those
    calls wrapped (process time, so the wrappers' own cost is included in each)."""
    spent, total, rows = _phase_run(timed, time.process_time)
    steps = max(1, max(r["num_tokens"] for r in rows))
    return {"step (all)": total / steps * 1e3, **{k: v / steps * 1e3 for k, v in spent.items()}}


def phase_flops(timed: Timed) -> dict[str, float]:
    """GFLOP per generated token in each of `PHASES` (`flop_counter`), from one more run."""
    with flop_counter() as counter:
        spent, total, rows = _phase_run(timed, lambda: float(counter.get_total_flops()))
    tokens = max(1, sum(r["num_tokens"] for r in rows))
    return {"token (all)": total / tokens / 1e9, **{k: v / tokens / 1e9 for k, v in spent.items()}}


def time_method(
    lm: LoadedLM, method: str, params: dict[str, object], batch: int, tokens: int, repeats: int
) -> tuple[float, float, int, float]:
    """(tokens/s, ms per step, peak bytes, CPU s per token) of the best of `repeats` runs."""
    timed = Timed(lm, method, params, batch, tokens)
    for _ in range(repeats):
        timed.once()
    return timed.result()


def direct_demographic_scores(geometry: object, gen_sum: torch.Tensor, n: int) -> torch.Tensor:
    """(1, V) s_x as the reference computes it: the (V, D) tensor r_x = (n c̄ + E_x)/(n+1)."""
    embed = geometry.embed.float()  # type: ignore[attr-defined]
    v = geometry.direction  # type: ignore[attr-defined]
    r = (gen_sum + embed) / (n + 1)  # (V, D), materialised every step
    cos = torch.nn.functional.cosine_similarity(r, v.unsqueeze(0), dim=-1)
    log_qc = torch.stack([F.logsigmoid(-10 * cos), F.logsigmoid(10 * cos)], -1)
    kl = (log_qc.exp() * (log_qc - geometry.log_q)).sum(-1)  # type: ignore[attr-defined]
    return (kl + geometry.prior_term).unsqueeze(0)  # type: ignore[attr-defined]


def reference_style(
    lm: LoadedLM, head_path: str, blocks: int, tokens: int, prompts: list[str]
) -> tuple[float, float]:
    """(tokens/s, ms per step) of the UDDIA reference's call structure, lidao-min's loss.

    One sequence at a time; per token: θ's forward of the new token (its cache), then a fresh
    `torch.optim.Adam` over the real bias vectors of the top `blocks` blocks and `ln_f`, the
    whole context re-run with gradients plus the horizon position, ℓ̂_a through a (V, D) tensor
    (`direct_demographic_scores`), one backward and one Adam step, the tuned last position over
    θ's cache, the biases restored from a saved copy, the mixture sampled. On a deep copy of the
    model (the biases are trained in place).
    """
    model = copy.deepcopy(lm.model)
    ref = LoadedLM(lm.ref, model, lm.tokenizer, lm.device, lm.family, lm.words)
    sites = find_sites(model, blocks)
    biases: list[torch.Tensor] = [p.module.bias for p in sites.points]  # type: ignore[misc]
    saved = [b.detach().clone() for b in biases]
    head = resolve_head(ref, "sentiment", head_path).to(lm.device)
    target = int(getattr(head, "target_class", 0))
    geometry = gender_geometry(ref)
    embed = model.get_input_embeddings().weight
    gen = torch.Generator().manual_seed(0)
    made, start = 0, time.perf_counter()
    for index, prompt in enumerate([prompts[0], *prompts]):  # the first run warms up
        if index == 1:
            made, start = 0, time.perf_counter()
        steps = min(2, tokens) if index == 0 else tokens
        ids = torch.tensor([prompt_token_ids(ref, prompt)], device=lm.device)
        history = DiscountedHistory(0.5, 1, lm.device)
        gen_sum = torch.zeros((1, embed.shape[1]), device=lm.device)
        with torch.no_grad():
            theta = model(input_ids=ids, use_cache=True)
        for made_here in range(steps):
            for b in biases:
                b.requires_grad_(True)
            optimizer = torch.optim.Adam(biases, lr=0.01)
            out = model(input_ids=ids, use_cache=True, output_hidden_states=True)
            probs = out.logits[:, -1].float().softmax(-1)
            horizon = model.base_model(
                inputs_embeds=(probs @ embed).unsqueeze(1),
                past_key_values=out.past_key_values,
                use_cache=True,
            ).last_hidden_state
            pooled = torch.cat([out.hidden_states[-1], horizon], dim=1).mean(1)
            loss_g = property_loss(head, pooled, target)
            scores = direct_demographic_scores(geometry, gen_sum, made_here)
            loss_a = demographic_loss(probs, scores)
            loss, _ = min_objective(loss_g, loss_a, history.weights())
            history.push(loss_g, loss_a)
            optimizer.zero_grad()
            loss.sum().backward()
            optimizer.step()
            with torch.no_grad():
                T = ids.shape[1]
                tuned = model(
                    input_ids=ids[:, -1:],
                    past_key_values=cropped_cache(theta.past_key_values, T - 1),
                    use_cache=True,
                ).logits[:, -1]
                for b, original in zip(biases, saved):
                    b.requires_grad_(False)
                    b.copy_(original)
                mixed = 0.9 * tuned.float().log_softmax(-1) + 0.1 * theta.logits[
                    :, -1
                ].float().log_softmax(-1)
                uniform = torch.rand((1,), generator=gen, dtype=torch.float64).to(mixed.device)
                token = nucleus_sample(mixed, 0.9, uniform)
                gen_sum = gen_sum + embed[token].float()
                ids = torch.cat([ids, token.view(1, 1)], dim=-1)
                theta = model(
                    input_ids=ids[:, -1:], past_key_values=theta.past_key_values, use_cache=True
                )
            made += 1
    if lm.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return made / elapsed, elapsed / made * 1000


def paper_prompts() -> list[str]:
    """The 175 female + 175 male prompts of the paper (../shared), else the built-in ones."""
    folder = Path(__file__).resolve().parents[2] / "shared/data/uddia-prompts"
    texts = []
    for group in ("female", "male"):
        path = folder / f"175prompts-{group}.jsonl"
        if path.exists():
            texts += [json.loads(line)["prompt"]["text"] for line in path.open() if line.strip()]
    return texts or PROMPTS


def paper_row(
    lm: LoadedLM, head: str, batch: int | str, limit: int | None, scope: str, out: str
) -> dict[str, Any]:
    """The paper's GPT-2 large row with lidao-min: 3,500 generations × 20 tokens, wall time.

    Runs the generation actor's own path: batches cut as the driver cuts them
    (`runtime.batch_size` = `batch`, `auto` by default), each decoded by a `Generator` (on a
    GPU: the measured probe and the memory sizer) and written to Parquet under `out`.
    """
    params = resolve_params("lidao-min", {"head": head, "scope": scope}, "gpt2-large")
    gen = GenerationParams(max_new_tokens=20, top_p=0.9, temperature=1.0)
    prompts = paper_prompts()
    jobs = [
        JobSpec(
            f"p{i}",
            text,
            "female",
            None,
            seed,
            "lidao-min",
            lm.ref,
            "sentiment",
            gen,
            canonical_json(params),
        )
        for seed in range(10)
        for i, text in enumerate(prompts)
    ][:limit]
    gpu = 1.0 if lm.device.type == "cuda" else 0.0
    size = batch_jobs(batch, Placement(1, gpu, 1.0, lm.device.type), len(jobs))
    print(f"# paper row: lidao-min {json.dumps(params, default=str)} batch_size={batch} ({size})")
    generator = Generator(lm.ref, out, lm=lm, name="paper-row")
    method = generator.method("lidao-min", jobs[0].method_params, "sentiment")
    decode_batch(lm, method, jobs[: min(2, len(jobs))])  # warm-up, not written, not measured
    start, made, ok = time.perf_counter(), 0, 0
    for chunk in make_batches(jobs, size):
        result = generator.run_batch(chunk)
        made, ok = made + result["tokens"], ok + result["ok"]
        if result["errors"]:
            raise SystemExit(f"paper row: {result['errors'][0]}")
    if lm.device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    stats = dict(generator.stats, generations=len(jobs), ok=ok, tokens=made, wall_s=wall)
    peak = stats["peak_bytes_per_seq"]
    per_seq = f"{peak / 2**20:.1f}" if generator.sizer is not None else "n/a (measured on CUDA)"
    print(
        f"generations={len(jobs)} tokens={made} wall_s={wall:.1f} tok/s={made / wall:.1f} "
        f"(3,500 generations would take ~{wall * 3500 / len(jobs):.0f} s at this rate); "
        f"batches={stats['batches']} memory_probes={stats['memory_probes']} "
        f"memory_chunks={stats['memory_chunks']} oom_splits={stats['oom_splits']} "
        f"peak MiB/seq={per_seq}"
    )
    return stats


class Result(NamedTuple):
    """One (method, batch) row: tokens/s, CPU s per token, and both costs against vanilla's."""

    tps: float
    cpu: float
    ratio: float  # wall time per token / vanilla's at the same batch size
    cpu_ratio: float  # CPU time per token / vanilla's
    flops: float = 0.0  # per token (`--flops`), else 0
    flop_ratio: float = 0.0  # flops per token / vanilla's


# Issue 12's targets (CPU, GPT-2 small shape, 6 of 12 blocks, 20 tokens, batch 8)
TARGET_RATIO = {"last": 3.0, "context": 4.0}  # lidao-min: x vanilla at most
TARGET_MARGIN = 1.0  # uddia, eLIDAO: x vanilla at most lidao-min's + 1
TARGET_SPEEDUP = 20.0  # every tuned method: x reference-style at least, batch 8
TARGET_BATCH = 8


def print_targets(
    results: dict[tuple[str, int], Result], reference: float | None, args: argparse.Namespace
) -> None:
    """PASS / FAIL per target of issue 12 that this run measured.

    The issue's targets are in tokens/s, so wall-time ratios decide the first word; the same
    comparison on CPU time (and FLOPs with `--flops`) follows, since on a loaded machine wall
    time tracks the other processes more than the method.
    """
    setup = (
        args.shape == "gpt2-small" and args.blocks == 6 and args.tokens == 20,
        "gpt2-small, --blocks 6, --tokens 20",
    )
    note = "" if setup[0] else f" (the issue states it for {setup[1]}: not this run)"
    lines = []

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    def ratios(res: Result, bound: float, lower: Result | None = None) -> str:
        cpu_bound = bound if lower is None else lower.cpu_ratio + TARGET_MARGIN
        text = (
            f"wall {res.ratio:.2f}, cpu {res.cpu_ratio:.2f} {verdict(res.cpu_ratio <= cpu_bound)}"
        )
        if res.flops:
            flop_bound = bound if lower is None else lower.flop_ratio + TARGET_MARGIN
            text += f", flops {res.flop_ratio:.2f} {verdict(res.flop_ratio <= flop_bound)}"
        return text

    minimum = results.get(("lidao-min", TARGET_BATCH))
    if minimum is not None:
        limit = TARGET_RATIO[args.scope]
        lines.append(
            f"{verdict(minimum.ratio <= limit)} lidao-min x vanilla <= {limit:g} "
            f"({args.scope} scope, batch {TARGET_BATCH}): {ratios(minimum, limit)}{note}"
        )
        for method in ("uddia", "elidao-min", "elidao-prod"):
            res = results.get((method, TARGET_BATCH))
            if res is not None:
                bound = minimum.ratio + TARGET_MARGIN
                lines.append(
                    f"{verdict(res.ratio <= bound)} {method} x vanilla <= lidao-min's + "
                    f"{TARGET_MARGIN:g} (batch {TARGET_BATCH}, wall bound {bound:.2f}): "
                    f"{ratios(res, bound, minimum)}{note}"
                )
    for method in TUNED:
        res = results.get((method, TARGET_BATCH))
        if res is not None and reference:
            speed = res.tps / reference
            lines.append(
                f"{verdict(speed >= TARGET_SPEEDUP)} {method} x ref-style >= "
                f"{TARGET_SPEEDUP:g} (batch {TARGET_BATCH}): {speed:.1f}{note}"
            )
    for method in TUNED:
        series = [results.get((method, b)) for b in (1, 8, 32)]
        if all(series):
            tps = [r.tps for r in series if r]
            rising = tps[0] < tps[1] < tps[2]
            lines.append(
                f"{verdict(rising)} {method} tok/s rising from batch 1 to 8 to 32 "
                f"({args.scope} scope): {' < '.join(f'{t:.1f}' for t in tps)}"
            )
    if lines:
        print("# targets of issue 12")
        for line in lines:
            print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gpt2-small")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--tokenizer",
        default=str(Path(__file__).resolve().parents[2] / "shared/data/gpt2-tokenizer"),
    )
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--methods", nargs="+", default=["vanilla", *TUNED])
    ap.add_argument("--scope", choices=["context", "last"], default="context")
    ap.add_argument(
        "--blocks", type=int, default=None, help="tuned blocks (default: the method's, 18)"
    )
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-reference", action="store_true", help="skip the reference-style row")
    ap.add_argument(
        "--no-generate", action="store_true", help="skip transformers' `generate` beside vanilla"
    )
    ap.add_argument(
        "--paper-row", action="store_true", help="GPT-2 large shape, lidao-min, 3,500 × 20"
    )
    ap.add_argument("--limit", type=int, default=None, help="paper row: first N generations")
    ap.add_argument(
        "--paper-batch",
        type=lambda s: s if s == "auto" else int(s),
        default="auto",
        help="paper row: runtime.batch_size (a number, or auto: what the harness hands a replica)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument(
        "--flops", action="store_true", help="also count FLOPs per token (one extra run each)"
    )
    ap.add_argument(
        "--phases",
        action="store_true",
        help="also print CPU ms per step and GFLOP per token in the loop's and the tuner's calls "
        "(two extra runs each)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.paper_row:
        args.shape = "gpt2-large"
    lm = build_lm(args.shape, args.device, args.tokenizer)
    head_dir = tempfile.mkdtemp(prefix="bench-head-")
    head, _ = save_head(random_head(lm, "sentiment"), os.path.join(head_dir, "head"))
    print(
        f"# shape={args.shape} device={args.device} tokens={args.tokens} scope={args.scope} "
        f"blocks={args.blocks} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    if args.paper_row:
        with tempfile.TemporaryDirectory(prefix="paper-row-") as out:
            paper_row(lm, head, args.paper_batch, args.limit, args.scope, out)
        return 0
    reference = None
    if not args.no_reference:
        blocks = args.blocks or 18
        reference, ref_ms = reference_style(lm, head, blocks, args.tokens, PROMPTS[:1])
        print(f"# reference-style (batch 1, Adam per token, context re-run): {reference:.2f} tok/s")
    print(
        f"{'method':<16} {'batch':>5} {'tok/s':>9} {'ms/step':>9} {'x vanilla':>9} "
        f"{'cpu x van':>9} {'x ref-style':>11} {'peak MiB':>9}"
        + (f" {'GFLOP/tok':>9} {'flop x van':>9}" if args.flops else "")
    )
    results: dict[tuple[str, int], Result] = {}
    for batch in args.batch_sizes:
        timed: list[Timed] = []
        for method in ["vanilla", *[m for m in args.methods if m != "vanilla"]]:
            params: dict[str, object] = {}
            if method in TUNED:
                params = {"scope": args.scope, "head": head}
                if args.blocks:
                    params["blocks"] = args.blocks
            timed.append(Timed(lm, method, params, batch, args.tokens))
        hf = None if args.no_generate else GenerateTimed(lm, batch, args.tokens, 0.9)
        for _ in range(args.repeats):  # interleaved: vanilla, m1, m2, …, vanilla, m1, …
            for t in timed:
                t.once()
            if hf is not None:
                hf.once()
        if args.flops:
            for t in timed:
                t.count_flops()
        base: Result | None = None
        for t in timed:
            tps, ms, peak, cpu = t.result()
            base = base or Result(tps, cpu, 1.0, 1.0, t.flops, 1.0)
            res = Result(
                tps,
                cpu,
                base.tps / tps,
                cpu / base.cpu,
                t.flops,
                t.flops / base.flops if base.flops else 0.0,
            )
            results[t.name, batch] = res
            speed = f"{tps / reference:>11.1f}" if reference else f"{'-':>11}"
            flops = f" {t.flops / 1e9:>9.2f} {res.flop_ratio:>9.2f}" if args.flops else ""
            print(
                f"{t.name:<16} {batch:>5} {tps:>9.1f} {ms:>9.1f} {res.ratio:>9.2f} "
                f"{res.cpu_ratio:>9.2f} {speed} {peak / 2**20:>9.0f}{flops}",
                flush=True,
            )
        if hf is not None:
            loop = timed[0]
            print(
                f"# batch {batch}: hf-generate {hf.made / hf.best:.1f} tok/s, CPU "
                f"{hf.cpu * 1e3:.2f} ms/token; vanilla loop CPU {loop.cpu * 1e3:.2f} ms/token; "
                f"loop CPU / generate CPU = {loop.cpu / hf.cpu:.3f}",
                flush=True,
            )
        if args.phases:
            for t in timed:
                spent = phase_times(t)
                parts = ", ".join(f"{k} {v:.0f}" for k, v in spent.items() if v > 0)
                print(f"# {t.name} batch {batch}, CPU ms per step: {parts}", flush=True)
                counted = phase_flops(t)
                parts = ", ".join(f"{k} {v:.3f}" for k, v in counted.items() if v > 0)
                print(f"# {t.name} batch {batch}, GFLOP per token: {parts}", flush=True)
        if reference and batch == args.batch_sizes[0]:
            base_ref = (base.tps if base else reference) / reference
            print(
                f"{'reference-style':<16} {1:>5} {reference:>9.1f} {ref_ms:>9.1f} "
                f"{base_ref:>9.2f} {'':>9} {1.0:>11.1f} {'':>9}",
                flush=True,
            )
    print_targets(results, reference, args)
    load = os.getloadavg()
    print(
        f"# load average at the end: {' '.join(f'{x:.2f}' for x in load)} on {os.cpu_count()} CPUs"
    )
    if load[0] > (os.cpu_count() or 1):
        print("# the machine was loaded: wall-time ratios track the other processes; read cpu")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
