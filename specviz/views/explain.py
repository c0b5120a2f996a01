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
| **acceptance rate** $\alpha$ | accepted drafts / drafted tokens |
| **tokens per round** | emitted tokens / rounds, counting the correction or bonus token |
| **cost coefficient** $c$ | time of one drafter forward pass / time of one target forward pass, both measured in this run |
| **speedup** | speculative tokens/s / autoregressive tokens/s, same target, prompt, settings and seed |
| **acceptance by position** | share of rounds whose $i$-th draft was accepted (vLLM's per-position metric) |

### What theory predicts (Leviathan et al. 2023, Sec. 3)
If each draft were accepted independently with probability $\alpha$, a round would emit on average
$$E[\text{tokens per round}] = \frac{1 - \alpha^{\gamma+1}}{1 - \alpha} \qquad \text{(Eq. 1)}$$
and, since a round costs $\gamma$ drafter passes and one target pass, the walltime speedup would be
$$\text{speedup} = \frac{1 - \alpha^{\gamma+1}}{(1 - \alpha)(\gamma c + 1)} \qquad \text{(Thm 3.8)}.$$
The **optimal gamma** maximises it: a cheaper drafter (small $c$) or a better one (large $\alpha$) pays for longer drafts.
The number of accepted drafts per round then follows a capped geometric law,
$P(k) = (1-\alpha)\alpha^k$ for $k < \gamma$ and $P(\gamma) = \alpha^\gamma$, and the $i$-th draft is accepted with
probability $\alpha^i$. Real drafts are not independent — easy stretches (closing brackets, repeated names) are
accepted in runs — so the measured histogram is often wider than predicted and the speedup can beat the formula.
"""


def explanation_markdown() -> str:
    """The panel's Markdown; formulas use $...$ (inline) and $$...$$ (display) LaTeX delimiters."""
    return EXPLANATION
