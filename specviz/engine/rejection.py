"""The maths of one speculative round: drafting a token, the acceptance test, the residual.

Leviathan et al. 2023, Sec. 2.3 and Appendix A.1; Chen et al. 2023, Algorithm 2. With
beta = sum_x min(q(x), p(x)), a drafted x ~ q is kept with probability min(1, p(x)/q(x)),
and on rejection the replacement comes from norm(max(0, p - q)); the emitted token is then
distributed as p:  q(x) min(1, p(x)/q(x)) + (1 - beta) (p(x) - min(p(x), q(x))) / (1 - beta) = p(x).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from specviz.engine.sampling import Sampling


def draft_token(
    logits: torch.Tensor, sampling: Sampling, warpers, gen, context: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one draft and return it with the distribution it was sampled from.

    Returning q together with the sample is the point: the acceptance ratio must use
    exactly the processed q the token came from, never the raw softmax.

    Args:
        logits: (rows, vocab) drafter logits for the next position: one row, or one per sequence
            of a batch.
        gen: a torch.Generator, or a list of one per row (see ``sample_rows``).
        context: (rows, length) each position's context, for a repetition penalty (else None).

    Returns:
        (tokens of shape (rows,), q of shape (rows, vocab) in float32).
    """
    q = sampling.probs(logits, warpers, context)
    return sample_rows(q, sampling.greedy, gen), q


def target_probs(
    logits: torch.Tensor, sampling: Sampling, warpers, context: torch.Tensor | None = None
) -> torch.Tensor:
    """The target's processed p for a verify pass: (rows, vocab) logits in, float32 (rows, vocab) out.

    The same ``sampling.probs`` the drafter's q goes through, so both sides are processed
    identically (vLLM #9834 applied the filters to one side only); ``context`` (rows, length)
    gives each row its own context for a repetition penalty, the drafts before it included.
    """
    return sampling.probs(logits, warpers, context)


def accept(u: torch.Tensor, q_x: torch.Tensor, p_x: torch.Tensor) -> torch.Tensor:
    """The acceptance test u < min(1, p(x)/q(x)), elementwise.

    Written as u * q < p: no division, and q(x) > 0 for any x sampled from q. The strict
    "<" matters: a draft the target gives p(x) = 0 is never kept, even when u = 0.

    Args:
        u: uniforms in [0, 1), shape (gamma,); q_x, p_x: the drafts' probabilities, shape (gamma,).

    Returns:
        bool tensor of shape (gamma,).
    """
    return u * q_x < p_x


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) row by row; shape (rows, vocab) in, same out.

    When p == q the residual is all zeros; that row is never sampled (every draft is then
    accepted, since u < 1 = p/q), and p stands in for it so no NaN can appear.
    """
    r = (p - q).clamp_min(0.0)
    mass = r.sum(dim=-1, keepdim=True)
    # Rows with mass 0 divide to NaN here, but torch.where takes p for them.
    return torch.where(mass > 0, r / mass, p)


def sample_rows(probs: torch.Tensor, greedy: bool, gen: torch.Generator | list[torch.Generator] | None) -> torch.Tensor:
    """One token per row of ``probs`` (rows, vocab): the argmax when greedy, else a draw.

    ``gen`` is one generator for every row, or a list of one per row (a batch of sequences, each
    with its own random stream: row i then draws exactly what a one-row call with ``gen[i]`` would).
    On a CPU a draw is by the inverse of the row's distribution function (``_inverse_cdf``: one
    uniform per row); on a GPU by ``torch.multinomial``, which needs no host synchronisation.

    Raises:
        ValueError: a row holds NaN, inf or no mass (from NaN or all -inf logits); greedy rows
            are checked by the engine once per round instead, to spare a host synchronisation.
    """
    if greedy:
        return probs.argmax(dim=-1)
    if probs.device.type == "cpu":
        return _inverse_cdf(probs, gen)
    try:
        if isinstance(gen, list):
            return torch.cat([torch.multinomial(probs[i : i + 1], 1, generator=g)[:, 0] for i, g in enumerate(gen)])
        return torch.multinomial(probs, 1, generator=gen)[:, 0]
    except RuntimeError as err:  # torch refuses NaN, inf and all-zero rows
        raise ValueError(
            f"a model produced NaN or infinite logits; refusing to sample an invalid token ({err})"
        ) from err


def _inverse_cdf(probs: torch.Tensor, gen: torch.Generator | list[torch.Generator] | None) -> torch.Tensor:
    """Inverse transform sampling, row by row: with F the running sum of the row in float64 and
    u ~ U[0, 1), the token is the first x with F(x) > u F(V-1); (rows, vocab) in, (rows,) out.

    Exact up to float64 rounding: x is drawn with probability (F(x) - F(x-1)) / F(V-1) = p(x) / sum p,
    and a token with p(x) = 0 leaves F flat, so it is never drawn. One uniform per row and one
    pass over the vocabulary, where ``torch.multinomial`` on a CPU draws an exponential per
    token (about 1.4 ms a row over 49,152 tokens on one core, against 0.05 ms here).

    Raises:
        ValueError: a row holds NaN or inf, or has no mass.
    """
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:]
    if not bool(torch.isfinite(total).all() & (total > 0).all()):
        raise ValueError(
            "a model produced NaN or infinite logits; refusing to sample an invalid token (a row has no finite mass)"
        )
    rows = probs.shape[0]
    if isinstance(gen, list):
        u = torch.cat([torch.rand(1, 1, dtype=torch.float64, generator=g) for g in gen])
    else:
        u = torch.rand(rows, 1, dtype=torch.float64, generator=gen)
    # u < 1, but u * total may round up to total: keep the point strictly below it
    point = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, point, right=True)[:, 0]


@dataclass(eq=False)  # compared and hashed by identity: EXACT is a default argument
class Steps:
    """The steps of a round the loops call, each one of this module's functions unless replaced: ``draft_token``
    (a draft and its q), ``target_probs`` (the target's p), ``accept`` (the acceptance test) and ``residual`` (where a
    correction is drawn from).

    The loops take a ``steps`` argument (default ``EXACT``), so an experiment can run a variant of one step
    (``specviz.lab.faults``: a fault seen in a public implementation) in its own run, ``Steps(residual=...)``, without
    changing anything another run calls.

    Raises:
        TypeError: a step that is not one of the four (the dataclass's own check of its fields).
    """

    draft_token: Callable[..., tuple[torch.Tensor, torch.Tensor]] = draft_token
    target_probs: Callable[..., torch.Tensor] = target_probs
    accept: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = accept
    residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = residual


STEP_NAMES = tuple(f.name for f in fields(Steps))
EXACT = Steps()  # the algorithm as published
