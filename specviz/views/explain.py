"""The explanation panel: every quantity the demo shows, named in the field's terms, and what the shipped
recordings and training logs measured (computed from them, each figure naming its pair)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from specviz import metrics
from specviz.theory import expected_tokens_per_round
from specviz.views.stats import SPEEDUP_DECODING
from specviz.views.text import run_label

EXPLANATION = r"""
### How one round works
1. **Drafting.** The small **drafter** proposes **gamma** ($\gamma$) tokens one after another, each sampled from its
   distribution $q$ after the sampling settings (temperature, then top-k, then top-p) are applied.
2. **Verification.** The large **target** scores the context and all $\gamma$ drafts in **one forward pass**, which
   gives its own processed distributions $p_1, \dots, p_{\gamma+1}$: one per draft and one after the last.
3. **Acceptance test.** Draft $x_i$ is **accepted** when a uniform draw $u_i \in [0, 1)$ satisfies
   $$u_i < \min\left(1, \frac{p_i(x_i)}{q_i(x_i)}\right).$$
   A draft the target likes at least as much as the drafter ($p \ge q$) is always kept.
4. **Correction token.** At the first **rejected** draft, the round ends with a token sampled from the **residual**
   $$\mathrm{norm}\big(\max(0,\, p_i - q_i)\big),$$
   the part of the target's distribution the drafter under-weighted. Later drafts are **discarded** (never tested).
5. **Bonus token.** If all $\gamma$ drafts are accepted, $p_{\gamma+1}$ is already computed, so one more token is
   sampled from it for free.

Accepting with probability $\min(1, p/q)$ and correcting from the residual makes every emitted token distributed
**exactly** as the target's own sample (Leviathan et al. 2023, Thm 3.5; Chen et al. 2023). At temperature 0 both
distributions are one-hot, and the output is exactly the target's greedy text.

### The numbers
| quantity | meaning |
|---|---|
| **round** | one draft-then-verify cycle: one target forward pass |
| **draft acceptance rate** | accepted drafts / drafted tokens (vLLM's name); its denominator counts the drafts discarded after a rejection, which were never tested |
| **alpha** $\alpha$ | accepted drafts / (accepted + rejected drafts): the share of *tested* drafts accepted, Leviathan et al.'s per-draft acceptance probability |
| **beta** $\beta$ | $\sum_x \min(p(x), q(x)) = 1 - \mathrm{TV}(p, q)$ at one drafted position: the chance a draft there is accepted (Def. 3.1); $\alpha = E[\beta]$ |
| **verify cost** $v$ | time of the target's one pass over $\gamma + 1$ tokens / time of one autoregressive target step, both measured in this run (means over its passes; shown from 8 passes of each on) |
| **tokens per round** | emitted tokens / rounds, counting the correction or bonus token |
| **cost coefficient** $c$ | time of one drafter forward pass / time of one target forward pass, both measured in this run |
| **speedup** | SPEEDUP_DECODING: same target, prompt, settings and seed, the two runs in turns. It equals speculative decoding tokens/s / autoregressive decoding tokens/s over those tokens. The one figure called speedup everywhere (headline, status, stats, Theory, Compare, the auto tree); the whole runs' tokens/s ratio, prefill included, is named as that |
| **interquartile range** | the speedup's spread: the middle half of the speedups over stretches of equal tokens of the run (8 stretches at most, 4 rounds each at least). "Not distinguishable from 1x" when it straddles 1x; "wide" when it spans more than half the speedup |
| **scoring** | in the headline, the target's pass over a round's drafts in steps of the target alone's decoding time (its own sampling and bookkeeping included), so that drafting + scoring + other work adds up to the speedup. The same pass as $v$'s, in a slightly larger unit |
| **acceptance by position** | share of rounds whose $i$-th draft was accepted (vLLM's per-position metric) |

### What theory predicts (Leviathan et al. 2023, Sec. 3)
If each tested draft is accepted independently with probability $\alpha$, a round emits on average
$$E[\text{tokens per round}] = \frac{1 - \alpha^{\gamma+1}}{1 - \alpha} \qquad \text{(Eq. 1)}$$
and, since a round costs $\gamma$ drafter passes and one target pass, the walltime speedup is
$$\text{speedup} = \frac{1 - \alpha^{\gamma+1}}{(1 - \alpha)(\gamma c + 1)} \qquad \text{(Thm 3.8)}.$$
The **optimal gamma** maximises it: a cheaper drafter (small $c$) or a better one (large $\alpha$) pays for longer
drafts.
The number of accepted drafts per round then follows a capped geometric law,
$P(k) = (1-\alpha)\alpha^k$ for $k < \gamma$ and $P(\gamma) = \alpha^\gamma$, and the $i$-th draft is accepted with
probability $\alpha^i$.

**Why EAGLE accepts more.** A drafter model must guess the target's next token from the tokens alone; the EAGLE
drafter reads the target's own last hidden state, the feature its output layer turns into $p$, at the last position
the target scored, so it only has to predict how that feature moves one token on (Li et al. 2024). The verify pass
computes those features anyway, so the higher acceptance costs no extra target pass.

**A drafter with another tokenizer.** Token-level intersection keeps the drafter's distribution on the token strings
both vocabularies hold, renormalised and moved to the target's ids, so $q$ is again a distribution over target tokens
that each draft is really drawn from, and the same test $u < \min(1, p/q)$ keeps the output exactly the target's at
every temperature (Timor et al., ICML 2025, "Accelerating LLM inference with lossless speculative decoding algorithms
for heterogeneous vocabularies"). What the drafter put outside the shared tokens is lost (the replay shows that
shared-vocabulary mass per draft), so a pair whose vocabularies barely meet drafts little that the target accepts.

**Which alpha.** $\alpha$ is the chance that a *tested* draft is accepted. A round tests its drafts up to the first
rejection; the drafts after it are discarded untested. So $\alpha$ is estimated as accepted / (accepted + rejected),
or as the mean of $\beta$ over the tested drafts, never as accepted / drafted: that draft acceptance rate is lower,
and fed into Eq. (1) it predicts far fewer tokens per round than are measured, which looks like "clustered"
acceptances but is only the wrong denominator.

**The cost of verifying.** Thm 3.8 takes a target pass over $\gamma + 1$ tokens to cost one target step ($v = 1$),
true while the target is memory-bound (a large model on a GPU reads its weights once per pass, whatever the number
of tokens). Where the pass costs more — small models on a CPU, compute-bound GPUs, large batches — the speedup is
$$\text{speedup} = \frac{E[\text{tokens per round}]}{\gamma c + v},$$
and since $v$ grows with $\gamma$, the best gamma is shorter than Thm 3.8's. The Theory tab draws both predictions.

**A measured $v$ below 1.** Scoring more tokens never makes a pass cheaper, so a $v$ under 1 says how it was measured:
it is the mean time of this run's verify passes over the mean time of the target alone's steps. Where most rounds
drafted nothing (prompt lookup with nothing to copy), their verify pass scores one token, the very work of a step,
and $v$ sits near 1 on either side. On a busy machine the same pass takes half or twice as long from one moment to
the next, and a slow stretch that falls on more of the target alone's steps than of the verify passes lowers $v$;
a short run has few passes, so one slow one moves the mean (the page shows $v$ only from 8 passes of each). On a CPU
the matrix products of several tokens may take another routine than one token's (How this machine computes, in the
status); measured on the 2-core CPUs specviz was tried on, that keeps $v$ near 1 (bf16: 9 rows of the output layer's
shape cost 1.06 times one row) or above it (fp32 with routed products: 5 rows 1.1 to 1.2 times one row), not well below.
Read a $v$ under 1 as "about one step".

""".replace("SPEEDUP_DECODING", SPEEDUP_DECODING)  # noqa: E501  (a table's rows are one line each); the one speedup's name, word for word as everywhere


THEORY_NOTE = r"""
Leviathan et al. 2023, Sec. 3, beside this run. **alpha** = accepted / (accepted + rejected) drafts: the share of
*tested* drafts accepted (drafts discarded after a rejection were never tested, so the draft acceptance rate
accepted / drafted is not alpha). **Mean beta**, the average over the tested drafts of $\sum_x \min(p, q)$, estimates
the same alpha = E[beta] with less noise (Def. 3.1, Cor. 3.6); both are in the stats table, with how far apart
chance alone puts them. **c** = drafter step /
target step; **v** = the target's verify pass over gamma + 1 tokens / one target step. Thm 3.8 assumes v = 1; the
dashed curve uses the measured v (scaled linearly with gamma), and where v > 1 its best gamma is shorter. A measured
v below 1 is measurement, not a cheaper pass: means over passes that a busy machine slows unevenly, or rounds that
drafted nothing and so scored one token like a step (the stats table says which); a run of fewer than 8 passes
shows no v. The measured point is the headline's speedup (decoding, prefill excluded); the gamma sweep's points are
each run's whole tok/s ratio over its own baseline, prefill included, named so.
"""


def explanation_markdown(runs: Sequence[tuple] = (), logs: Mapping[str, Mapping] | None = None) -> str:
    """The panel's Markdown; formulas use $...$ (inline) and $$...$$ (display) LaTeX delimiters.

    Args:
        runs: (pair name, recording name, Recording) for each prepared recording to report; those
            with a gamma sweep give the measured section (``measured_markdown``).
        logs: training logs by model (``"English drafter"``, ``"EAGLE head"``: the parsed
            ``training_log.json``), for their held-out figures.
    """
    return EXPLANATION + measured_markdown(runs, logs or {})


_SETTINGS = {
    "greedy": "greedy",
    "t0.7-p0.9": "temperature 0.7, top-p 0.9",
    "t0.7": "temperature 0.7",
    "t1": "temperature 1",
}


def _code(text) -> str:
    """A model or file name from a recording, as a Markdown code span of safe characters only (files are data)."""
    return "`" + re.sub(r"[^\w./@+-]", "?", str(text))[:120] + "`"


def _share(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= x <= 1.0 else None


def _sampling(settings: Mapping) -> str:
    s = settings.get("sampling") or {}
    t = s.get("temperature")
    if not t:
        return "greedy"
    parts = [f"temperature {t:g}"]
    if s.get("top_k"):
        parts.append(f"top-k {int(s['top_k'])}")
    if s.get("top_p") is not None and s["top_p"] < 1:
        parts.append(f"top-p {s['top_p']:g}")
    return ", ".join(parts)


def sweep_fit(sweep) -> list[tuple[int, float, float, float]] | None:
    """(gamma, alpha, measured tokens per round, Eq. (1) from that alpha) for each point of a sweep
    that counted rejections (alpha = accepted / (accepted + rejected); tokens per round = emitted /
    rounds; Leviathan et al. 2023, Eq. 1); None when no point has them."""
    rows = []
    for p in sweep.points:
        if p.rejected is None or not p.rounds:
            continue
        a = metrics.alpha(p.accepted, p.rejected)
        if a is None or a >= 1.0:
            continue
        rows.append((p.gamma, a, p.tokens / p.rounds, expected_tokens_per_round(a, p.gamma)))
    return rows or None


def measured_markdown(runs: Sequence[tuple], logs: Mapping[str, Mapping]) -> str:
    """What the shipped files measured, as Markdown computed from them (no figure typed in): for each
    prepared recording with a gamma sweep, the alpha range, how closely Eq. (1) predicts its measured
    tokens per round and its fastest gamma; the held-out figures of the drafters' training logs."""
    lines = []
    for pair, name, rec in runs:
        sweep = rec.sweep
        fit = sweep_fit(sweep) if sweep is not None else None
        if not fit:
            continue
        gaps = [(abs(eq1 - tpr) / tpr, g) for g, _, tpr, eq1 in fit]
        worst, at = max(gaps)
        alphas = [a for _, a, _, _ in fit]
        models = " → ".join(_code(m) for m in rec.speculative.settings.get("models") or [])
        speedups = [(sweep.speedup(p), p.gamma) for p in sweep.points if sweep.speedup(p)]
        fastest = ""
        if speedups:
            s, g = max(speedups)
            fastest = (
                f" Highest tok/s ratio measured: gamma {g}, {s:.2f}× its own autoregressive baseline's tokens/s (whole "
                "runs, "
                "prefill included), on the machine that recorded it."
            )
        lines.append(
            f"- **{_code(pair)} pair** ({models}), {_sampling(rec.speculative.settings)}: the prepared recording "
            f"{_code(name)} "
            f"(its run: {run_label(rec.speculative)}; its sweep: gamma {fit[0][0]}..{fit[-1][0]}). Alpha (accepted / "
            "tested drafts) "
            f"{min(alphas):.2f}–{max(alphas):.2f}; Eq. (1) from each gamma's alpha predicts its measured tokens per "
            "round "
            f"(emitted / rounds) within {worst:.1%} (the largest gap, at gamma {at}; mean gap "
            f"{sum(x for x, _ in gaps) / len(gaps):.1%}).{fastest}"
        )
    drafter = (logs.get("English drafter") or {}).get("held_out_mean_beta")
    if isinstance(drafter, Mapping):
        kept = {
            k: v
            for k, v in drafter.items()
            if k in _SETTINGS and isinstance(v, Mapping) and _share(v.get("mean_beta")) is not None
        }
        figures = [f"{_share(v['mean_beta']):.3f} ({_SETTINGS[k]})" for k, v in kept.items()]
        positions = {v.get("positions") for v in kept.values()}
        if figures:
            n = next(iter(positions))
            over = (
                f" over {n:,} drafted positions each"
                if len(positions) == 1 and isinstance(n, int) and not isinstance(n, bool)
                else ""
            )
            lines.append(
                f"- **English drafter** (its training log, held-out prompts): mean beta {'; '.join(figures)}{over}; "
                "mean beta estimates alpha, and greedy it is the top-1 agreement with the target."
            )
    eagle = (logs.get("EAGLE head") or {}).get("held_out_first_draft")
    if isinstance(eagle, Mapping):
        figures = []
        for k, v in eagle.items():
            if k in _SETTINGS and isinstance(v, Mapping):
                beta, top1 = _share(v.get("first_draft_mean_beta")), _share(v.get("top1_agreement"))
                if beta is not None and top1 is not None:
                    figures.append(f"{_SETTINGS[k]}: mean beta {beta:.3f}, top-1 agreement {top1:.3f}")
        if figures:
            lines.append(
                f"- **EAGLE head** for the English pair (its training log, held-out prompts, first draft of a round): "
                f"{'; '.join(figures)}."
            )
    if not lines:
        return (
            "\n### What was measured\nNo prepared recording with a gamma sweep, and no training log, was found "
            "with this copy.\n"
        )
    return (
        "\n### What was measured\nComputed when the page starts from the prepared recordings and the training logs "
        "that "
        "ship with it, each naming its pair. On a CPU the verify pass costs more than one target step, so compare a "
        "measured speedup with the prediction that uses the measured $v$ (the Theory tab draws both for the run "
        "shown).\n\n" + "\n".join(lines) + "\n"
    )


BATCH_NOTE = """\
**Batched speculative decoding**, as servers run it: the prompts below are decoded together. Each round, one
drafter pass per draft step and **one target pass verify every row's drafts at once**; each row accepts its own
number of drafts and gets its own correction or bonus token, so the rows drift apart (the caches stay
rectangular: a per-row attention mask hides each row's rejected drafts and padding, and position ids count each
row's own tokens). A row that reaches end-of-text or its token budget leaves the batch. Each row's output is
exactly the target's for its prompt (row *b* is the single-prompt run with seed + *b*).

The lanes show one row each, one column per round of the batch: the row's tested drafts, its correction or bonus
token, and grey boxes for the draft slots it left as padding. The chart measures tokens/s over the whole batch at
each batch size up to yours, speculative and autoregressive in turns, twice each.

**When a batch gains, measured.** The tok/s ratio (speculative tokens/s over the batch / autoregressive tokens/s over
the batch, whole runs, prefill included: not Generate's decoding speedup, which leaves the prefill out) is about
E[tokens per round] / (gamma c + v) (Leviathan et al. 2023, Thm 3.8 with the verify pass costing
*v* baseline steps instead of 1). A batch gives the autoregressive baseline B tokens per weight read too, while the
verify pass over B × (gamma + 1) positions does (gamma + 1) times a baseline step's arithmetic, so *v* grows with B;
and a batch runs until its slowest row is done, carrying the others' padding. Measured on a 2-core CPU with bf16
instructions, where the pairs run in bf16, **the ratio falls as the batch grows:
batches of 2 gain a little, batches of 4 and more lose** (English pair, gamma 4, 128 tokens: 1.02×, 1.20×, 0.92×, 0.78×
at batch 1, 2, 4, 8;
embedded pair: 1.40×, 1.30×, 0.82×, 0.83×). Only where a single sequence's verify pass is itself slow does a small
batch first help: on that CPU with the English target in fp32 (the form a CPU without bf16 instructions runs), a pass
over a handful of tokens cost about two steps, a batch made the baseline's step a matrix product as well, and batches
of 2 and 4 gained (0.84×, 1.31×, 1.36×, 0.98× at batch 1, 2, 4, 8). Which form this machine runs is named in a run's
status ("Form: ..."); the figures of the other form are not this machine's. The tables
and their commands are in docs/benchmarks.md; `python -m specviz bench --batch-sizes 1,2,4,8` measures *c*, *v* and
the rounds on your machine.
"""
