"""`bench_methods.py`'s `reference-style` row: the UDDIA reference's call structure rebuilt on
the same model (batch 1, a fresh Adam per token, the context re-run at every step)."""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F

from workers.decoding import prompt_token_ids
from workers.methods.biastune import cropped_cache, find_sites
from workers.methods.estimators import (
    demographic_loss,
    gender_geometry,
    property_loss,
)
from workers.methods.heads import resolve_head
from workers.methods.lidao import DiscountedHistory, min_objective
from workers.models import LoadedLM
from workers.sampler import sample


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
                seed = torch.randint(0, 2**62, (1,), generator=gen).to(mixed.device)
                token = sample(mixed, 0.9, seed, made_here)
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
