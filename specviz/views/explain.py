"""The explanation panel: every quantity the demo shows, named in the field's terms."""

EXPLANATION = r"""
### How one round works
1. **Drafting.** The small **drafter** proposes **gamma** ($\gamma$) tokens one after another, each sampled from its
   distribution $q$ after the sampling settings (temperature, then top-k, then top-p) are applied.
2. **Verification.** The large **target** scores the context and all $\gamma$ drafts in **one forward pass**, which gives
   its own processed distributions $p_1, \dots, p_{\gamma+1}$: one per draft and one after the last.
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
| **verify cost** $v$ | time of the target's one pass over $\gamma + 1$ tokens / time of one autoregressive target step, both measured in this run |
| **tokens per round** | emitted tokens / rounds, counting the correction or bonus token |
| **cost coefficient** $c$ | time of one drafter forward pass / time of one target forward pass, both measured in this run |
| **speedup** | speculative tokens/s / autoregressive tokens/s, same target, prompt, settings and seed |
| **acceptance by position** | share of rounds whose $i$-th draft was accepted (vLLM's per-position metric) |

### What theory predicts (Leviathan et al. 2023, Sec. 3)
If each tested draft is accepted independently with probability $\alpha$, a round emits on average
$$E[\text{tokens per round}] = \frac{1 - \alpha^{\gamma+1}}{1 - \alpha} \qquad \text{(Eq. 1)}$$
and, since a round costs $\gamma$ drafter passes and one target pass, the walltime speedup is
$$\text{speedup} = \frac{1 - \alpha^{\gamma+1}}{(1 - \alpha)(\gamma c + 1)} \qquad \text{(Thm 3.8)}.$$
The **optimal gamma** maximises it: a cheaper drafter (small $c$) or a better one (large $\alpha$) pays for longer drafts.
The number of accepted drafts per round then follows a capped geometric law,
$P(k) = (1-\alpha)\alpha^k$ for $k < \gamma$ and $P(\gamma) = \alpha^\gamma$, and the $i$-th draft is accepted with
probability $\alpha^i$.

**Why EAGLE accepts more.** A drafter model must guess the target's next token from the tokens alone; the EAGLE
drafter reads the target's own last hidden state, the feature its output layer turns into $p$, at the last position
the target scored, so it only has to predict how that feature moves one token on (Li et al. 2024). The verify pass
computes those features anyway, so the higher acceptance costs no extra target pass.

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

**What the embedded pair shows** (24 held-out prompts, gamma 1 to 8): with alpha from the tested drafts, Eq. (1)
predicts the measured tokens per round within 1 % at temperature 1 and within 4 % greedy, and the accepted-drafts
histogram follows the capped geometric law at temperature 1. Greedy rounds show a mild dependence at gamma 6 and
above (the first draft is a little harder than the later ones). On a CPU the verify pass costs more than one target
step, and the prediction with the measured $v$ is the one the measured speedup follows.
"""


THEORY_NOTE = r"""
Leviathan et al. 2023, Sec. 3, beside this run. **alpha** = accepted / (accepted + rejected) drafts: the share of
*tested* drafts accepted (drafts discarded after a rejection were never tested, so the draft acceptance rate
accepted / drafted is not alpha). **Mean beta**, the average over the tested drafts of $\sum_x \min(p, q)$, estimates
the same alpha = E[beta] with less noise (Def. 3.1, Cor. 3.6); both are in the stats table. **c** = drafter step /
target step; **v** = the target's verify pass over gamma + 1 tokens / one target step. Thm 3.8 assumes v = 1; the
dashed curve uses the measured v (scaled linearly with gamma), and where v > 1 its best gamma is shorter.
"""


def explanation_markdown() -> str:
    """The panel's Markdown; formulas use $...$ (inline) and $$...$$ (display) LaTeX delimiters."""
    return EXPLANATION


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

**When a batch gains, measured.** The speedup (speculative tokens/s over the batch / autoregressive tokens/s over
the batch) is about E[tokens per round] / (gamma c + v) (Leviathan et al. 2023, Thm 3.8 with the verify pass costing
*v* baseline steps instead of 1). A batch gives the autoregressive baseline B tokens per weight read too, while the
verify pass over B × (gamma + 1) positions does (gamma + 1) times a baseline step's arithmetic, so *v* grows with B;
and a batch runs until its slowest row is done, carrying the others' padding. So on this CPU, in the form the pairs
run in now, **the speedup falls as the batch grows: batches of 2 gain a little, batches of 4 and more lose** (English
pair, bf16, gamma 3, 32 tokens: 1.04×, 1.12×, 0.88×, 0.69× at batch 1, 2, 4, 8; embedded pair, gamma 4, 128 tokens:
1.40×, 1.30×, 0.82×, 0.83×). Only where a single sequence's verify pass is itself slow does a small batch first help:
the English target in fp32 paid about two steps for a pass over a handful of tokens, a batch made the baseline's step
a matrix product as well, and batches of 2 and 4 gained (0.84×, 1.31×, 1.36×, 0.98× at batch 1, 2, 4, 8). The tables
and their commands are in docs/benchmarks.md; `python -m specviz bench --batch-sizes 1,2,4,8` measures *c*, *v* and
the rounds on your machine.
"""
