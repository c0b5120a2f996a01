"""Measure the embedded pair and write its model card.

    python -m specviz.measure.evaluate               # print the measurements
    python -m specviz.measure.evaluate --write-card  # and rewrite assets/models/README.md
    python -m specviz.measure.evaluate --theory      # Leviathan et al.'s predictions against the held-out runs

Measured: bits per byte of target, drafter and ``gzip -9`` on the held-out standard-library
files; the greedy acceptance rate with gamma = 4 on the held-out prompts (assets/prompts.json);
the drafter and target step times and the cost coefficient c on this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import platform

import torch

from specviz import metrics, theory
from specviz.engine.chain import autoregressive_generate, speculative_generate
from specviz.engine.sampling import Sampling

from specviz.training import corpus
from specviz.measure.common import pooled_acceptance
from specviz.drafters import EarlyExitDrafter, early_exit_model
from specviz.trace import Trace
from specviz.pair import ASSETS, load_pair
from specviz.training.train import bits_per_byte, encode_all, gzip_bits_per_byte

MODELS = ASSETS / "models"


def measure(new_tokens: int = 64, gamma: int = 4) -> dict:
    pair = load_pair("embedded", device="cpu")
    _, held = corpus.split(corpus.stdlib_files())
    held_text = "".join(f.text for f in held)
    held_ids = encode_all(pair.tokenizer, held)
    n_bytes = len(held_text.encode()) + len(held)
    prompts = json.loads((ASSETS / "prompts.json").read_text())
    specs, bases = [], []
    for p in prompts:
        ids = pair.tokenizer(p["prompt"], add_special_tokens=False)["input_ids"]
        kw = dict(sampling=Sampling(0.0), max_new_tokens=new_tokens, eos_token_id=pair.eos_token_id)
        specs.append(speculative_generate(ids, pair.drafter, pair.target, gamma=gamma, **kw))
        bases.append(autoregressive_generate(ids, pair.target, **kw))
    acceptance = pooled_acceptance(specs)
    drafter_ms, target_ms = theory.drafter_step_ms(*specs), theory.target_step_ms(*bases)
    return {
        "held_out_files": len(held),
        "held_out_bytes": n_bytes,
        "target_bits_per_byte": bits_per_byte(pair.target, held_ids, n_bytes),
        "drafter_bits_per_byte": bits_per_byte(pair.drafter, held_ids, n_bytes),
        "gzip9_bits_per_byte": gzip_bits_per_byte(held_text),
        "prompts": len(prompts),
        "gamma": gamma,
        "new_tokens": new_tokens,
        "greedy_acceptance_rate": acceptance["draft_acceptance_rate"],
        "greedy_alpha": acceptance["alpha"],
        "greedy_mean_beta": acceptance["mean_beta"],
        "verify_cost": metrics.verify_cost(theory.verify_ms_per_round(*specs), target_ms),
        "greedy_tokens_per_round": acceptance["mean_tokens_per_round"],
        "drafter_step_ms": drafter_ms,
        "target_step_ms": target_ms,
        "cost_coefficient": metrics.cost_coefficient(drafter_ms, target_ms),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}",
        "sample": pair.tokenizer.decode(bases[0].output_ids),
        "sample_prompt": prompts[0]["prompt"],
        "early_exit": early_exit_rows(pair, held_ids, n_bytes, prompts, new_tokens, gamma),
    }


def early_exit_rows(
    pair, held_ids, n_bytes: int, prompts: list[dict], new_tokens: int, gamma: int, layers=(2, 5, 8)
) -> list[dict]:
    """The target's early exits as drafters: bits per byte of the target cut after k layers on the
    held-out files, and alpha (accepted / tested) drafting for the whole target, greedy, gamma 4."""
    rows = []
    for k in layers:
        drafter = EarlyExitDrafter(pair.target, k)
        specs = [
            speculative_generate(
                pair.tokenizer(p["prompt"], add_special_tokens=False)["input_ids"],
                drafter,
                pair.target,
                gamma=gamma,
                sampling=Sampling(0.0),
                max_new_tokens=new_tokens,
                eos_token_id=pair.eos_token_id,
            )
            for p in prompts
        ]
        accepted = sum(t.accepted for t in specs)
        rows.append(
            {
                "exit_layer": k,
                "bits_per_byte": bits_per_byte(early_exit_model(pair.target, k), held_ids, n_bytes),
                "greedy_alpha": accepted / (accepted + sum(t.rejected for t in specs)),
                "greedy_tokens_per_round": sum(len(t.output_ids) for t in specs) / sum(len(t.rounds) for t in specs),
            }
        )
    return rows


def theory_check(
    gammas=range(1, 9), temperatures=(0.0, 1.0), new_tokens: int = 128, prompts: int | None = None
) -> list[dict]:
    """Leviathan et al. 2023's predictions against speculative runs on the held-out prompts.

    For each gamma and temperature (top-k and top-p off, EOS ignored so every run generates ``new_tokens``), pooled over
    the prompts: measured tokens per round (emitted / rounds, rounds that drafted the full gamma); Eq. (1) from alpha =
    accepted / (accepted + rejected) and from the draft acceptance rate accepted / drafted; mean beta over the tested
    drafts and over every drafted position; the chi-square p-value of the accepted-drafts histogram against the capped
    geometric law at alpha (cells under 5 pooled, ddof 1); and acceptance by position against alpha^i. No timings: see
    ``bench`` for speed.
    """
    from scipy.stats import chisquare

    pair = load_pair("embedded", device="cpu")
    texts = [p["prompt"] for p in json.loads((ASSETS / "prompts.json").read_text())][:prompts]
    ids = [pair.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    rows = []
    for temperature in temperatures:
        for gamma in gammas:
            specs = [
                speculative_generate(
                    x,
                    pair.drafter,
                    pair.target,
                    gamma=gamma,
                    sampling=Sampling(temperature),
                    max_new_tokens=new_tokens,
                    eos_token_id=None,
                    seed=i,
                    vocab_size=pair.vocab_size,
                )
                for i, x in enumerate(ids)
            ]
            full = [r for t in specs for r in t.rounds if len(r.drafts) == gamma]
            acceptance = pooled_acceptance(specs)
            alpha, rate = acceptance["alpha"], acceptance["draft_acceptance_rate"]
            all_betas = [d.beta for t in specs for r in t.rounds for d in r.drafts]
            counts = [r.accepted_count for r in full]
            observed = [counts.count(k) for k in range(gamma + 1)]
            expected = [e * len(counts) for e in theory.accepted_drafts_distribution(alpha, gamma)]
            obs, exp = [], []
            for o, e in zip(observed, expected):  # pool small cells into the next one
                if obs and exp[-1] < 5:
                    obs[-1] += o
                    exp[-1] += e
                else:
                    obs.append(o)
                    exp.append(e)
            if len(exp) > 1 and exp[-1] < 5:
                obs[-2] += obs.pop()
                exp[-2] += exp.pop()
            pvalue = (
                float(chisquare(obs, [e * sum(obs) / sum(exp) for e in exp], ddof=1).pvalue) if len(obs) > 2 else None
            )
            positions = theory.acceptance_by_position(Trace(mode="speculative", prompt_ids=[], rounds=full))
            rows.append(
                {
                    "gamma": gamma,
                    "temperature": temperature,
                    "rounds": len(full),
                    "tokens_per_round": sum(c + 1 for c in counts) / len(counts),
                    "eq1_alpha": theory.expected_tokens_per_round(alpha, gamma),
                    "eq1_draft_acceptance_rate": theory.expected_tokens_per_round(rate, gamma),
                    "alpha": alpha,
                    "draft_acceptance_rate": rate,
                    "mean_beta": acceptance["mean_beta"],
                    "mean_beta_all_drafted": metrics.mean(all_betas),
                    "histogram_chi2_pvalue": pvalue,
                    "acceptance_by_position": [a / n for n, a in positions],
                    "alpha_power_i": [alpha ** (i + 1) for i in range(len(positions))],
                }
            )
    return rows


def card(m: dict) -> str:
    logs = {name: json.loads((MODELS / name / "training_log.json").read_text()) for name in ("target", "drafter")}
    t, d = logs["target"], logs["drafter"]
    alpha, c, v = m["greedy_alpha"], m["cost_coefficient"], m["verify_cost"]
    early_rows = "\n".join(
        f"| {r['exit_layer']} | {r['bits_per_byte']:.3f} | {r['greedy_alpha']:.3f} | "
        f"{r['greedy_tokens_per_round']:.2f} |"
        for r in m.get("early_exit", [])
    )
    row = lambda name, log, bpb: (  # noqa: E731
        f"| {name} | GPT2LMHeadModel, {log['shape']['n_layer']} layers x {log['shape']['n_embd']} wide, "
        f"{log['shape']['n_head']} heads | {log['parameters'] / 1e6:.2f} M | {log['objective']} | {log['steps']} steps "
        "of "
        f"{log['batch']} | {log['train_seconds'] / 60:.0f} min | {log['loss_log'][-1]['loss']:.3f} | {bpb:.3f} |"
    )
    return f"""# The embedded model pair

A drafter and a target trained for specviz, so that the demo, the tests and CI run with no model hub. Rebuild with
`python -m specviz train`; measure with `python -m specviz.measure.evaluate --write-card` (which wrote this file).

## Data
- Corpus: the CPython {platform.python_version()} standard library source (`Lib/`, `.py` files), test packages
  (`test`, `tests`, `idle_test`) and `pydoc_data` excluded. PSF licence.
- Split: a fixed hash of each file's path holds out one file in {corpus.HELD_OUT_MODULUS}: {m['held_out_files']} files,
  {m['held_out_bytes']:,} bytes, for validation and for the held-out prompts in `assets/prompts.json`
  (a `def` line and the three lines before it, from held-out files only).
- Tokenizer: byte-level BPE (`tokenizers`), {len(load_pair('embedded', device='cpu').tokenizer)} tokens with
  `<|endoftext|>` between files; saved with each model so `AutoTokenizer.from_pretrained(dir)` loads it.

## Models
Both are transformers `GPT2LMHeadModel`, saved with `save_pretrained` (safetensors, fp32), context {t['context']}
tokens.

| model | architecture | parameters | objective | training | time ({t['device']}, {t['torch_threads']} threads) | last training loss (nats/token: the target's cross-entropy, the drafter's KL to the target) | held-out bits/byte |
|---|---|---|---|---|---|---|---|
{row('target', t, m['target_bits_per_byte'])}
{row('drafter', d, m['drafter_bits_per_byte'])}
| `gzip -9` | | | | | | | {m['gzip9_bits_per_byte']:.3f} |

AdamW (betas 0.9/0.95, weight decay 0.1), linear warm-up then cosine decay to a tenth, gradient clipping at 1,
seed 0. The drafter is distilled from the trained target: it minimises KL(p_target || q_drafter) at every position.

## Speculative decoding with this pair
Measured on {m['machine']}, greedy, gamma = {m['gamma']}, up to {m['new_tokens']} new tokens on each of the
{m['prompts']} held-out prompts:

| quantity | value |
|---|---|
| alpha (accepted drafts / tested drafts: accepted + rejected) | {alpha:.3f} |
| mean beta (sum of min(p, q) over the tested drafts) | {m['greedy_mean_beta']:.3f} |
| draft acceptance rate (accepted drafts / drafted tokens, discarded ones included) | {m['greedy_acceptance_rate']:.3f} |
| tokens per round | {m['greedy_tokens_per_round']:.2f} |
| tokens per round predicted by Eq. (1) from alpha | {theory.expected_tokens_per_round(alpha, m['gamma']):.2f} |
| drafter step | {m['drafter_step_ms']:.2f} ms |
| target step | {m['target_step_ms']:.2f} ms |
| cost coefficient c | {c:.3f} |
| verify cost v (target pass over gamma + 1 tokens / target step) | {v:.2f} |
| predicted speedup (Leviathan et al. 2023, Thm 3.8, v = 1) | {theory.predicted_speedup(alpha, m['gamma'], c):.2f}x |
| predicted speedup with the measured v | {theory.predicted_speedup_with_verify_cost(alpha, m['gamma'], c, v):.2f}x |

Step times are measured inside specviz's loop (a drafter step includes choosing its token) and vary by
about 20 % from run to run on a shared 2-core machine. On the CPU, a step of models this small costs mostly
per-layer overhead and the 4096-row output layer, not arithmetic, so c stays near the ratio of layer counts
plus the output layer: a one-layer drafter reached c of about 0.22 but only 0.53 draft acceptance rate, because
one layer cannot form an induction head and so cannot copy from the context. With alpha estimated from tested
drafts, Eq. (1) predicts the measured tokens per round closely (`python -m specviz.measure.evaluate --theory` gives the
table for gamma 1..8, greedy and temperature 1). The verify pass over gamma + 1 tokens costs more than one target
step here (v > 1: small models on a CPU are not memory-bound), which is why the measured speedup falls short of
Thm 3.8 and matches the prediction with the measured v: see `python -m specviz bench`.

## Early exit
The target was trained with a loss on its last layer only (no early-exit loss, unlike LayerSkip). Cut after k of
its {t['shape']['n_layer']} layers (its final norm and output layer kept), it drafts for itself as follows (held-out
files; greedy, gamma = {m['gamma']}, the held-out prompts):

| exit after layer k | bits per byte of the cut model | alpha (accepted / tested) | tokens per round |
|---|---|---|---|
{early_rows}

Its early layers were never asked to predict the next token, so the cut model's distribution is far from the
target's and few drafts stand: the drafter model (2 layers trained by distillation) does far better at a similar
cost. Training with an early-exit loss would close the gap at some cost to the full target; that retraining is not
done here.

## A sample
The target, greedy, on the first held-out prompt:

```python
{m['sample_prompt']}{m['sample']}
```

## Limits
These are small models of one programming language's standard library: they write plausible Python, often
repetitive under greedy decoding, and know nothing else. They exist to make speculative decoding visible and testable.
"""  # noqa: E501  (a table's rows are one line each)


def english_card(prompts: int = 6, max_new_tokens: int = 96, gamma: int = 4, seed: int = 0) -> dict:
    """The shipped drafter's figures on the held-out prompts, for its model card
    (assets/models/smollm2-drafter/README.md; ``python -m specviz.measure.evaluate --english``).

    Per sampling setting (greedy; T 0.7 with top-p 0.9; T 1): alpha = accepted / (accepted + rejected)
    pooled over speculative runs of the English pair (Leviathan et al. 2023, Sec. 3.1), with its
    tested-draft count; c and v from the same runs and their autoregressive baselines (run in
    turns, ``specviz.measure.baseline``); and the drafter's bits per byte on the target's T 1 answers over the
    positions whose token its head scores (outside the head q is 0 and the log-loss infinite).
    """
    from specviz import metrics, theory
    from specviz.engine.sampling import Sampling
    from specviz.measure.baseline import with_baseline
    from specviz.drafters import make_drafter
    from specviz.pair import encode_prompt, load_pair

    pair = load_pair("english", device="cpu")
    from specviz.training.distill import held_out

    texts = held_out()[:prompts]
    ids = [encode_prompt(pair, t, chat=True) for t in texts]
    report: dict = {"prompts": len(ids), "max_new_tokens": max_new_tokens, "gamma": gamma}
    settings = {
        "greedy": Sampling(0.0),
        "t0.7-p0.9": Sampling(0.7, top_k=0, top_p=0.9),
        "t1": Sampling(1.0, top_k=0, top_p=1.0),
    }
    for name, sampling in settings.items():
        specs, bases = [], []
        for i, x in enumerate(ids):
            spec, base = with_baseline(
                x,
                make_drafter("model", drafter_model=pair.drafter, target=pair.target),
                pair.target,
                gamma=gamma,
                sampling=sampling,
                max_new_tokens=max_new_tokens,
                seed=seed + i,
                eos_token_id=pair.eos_token_ids,
                vocab_size=pair.vocab_size,
                tokenizer=pair.tokenizer,
            )
            specs.append(spec)
            bases.append(base)
        accepted, rejected = sum(t.accepted for t in specs), sum(t.rejected for t in specs)
        report[name] = {
            "alpha": metrics.alpha(accepted, rejected),
            "tested_drafts": accepted + rejected,
            "tokens_per_round": metrics.tokens_per_round(
                sum(len(t.output_ids) for t in specs), sum(len(t.rounds) for t in specs)
            ),
            "c": metrics.cost_coefficient(theory.drafter_step_ms(*specs), theory.target_step_ms(*bases)),
            "v": metrics.verify_cost(theory.verify_ms_per_round(*specs), theory.target_step_ms(*bases)),
        }
        print(name, report[name], flush=True)
    bits, nbytes, covered, total = 0.0, 0, 0, 0
    head = set(pair.drafter.head_ids.tolist())
    for i, x in enumerate(ids):
        torch.manual_seed(seed + i)
        with torch.no_grad():
            t = torch.tensor([x])
            out = pair.target.generate(
                t, attention_mask=torch.ones_like(t), do_sample=True, top_k=0, max_new_tokens=max_new_tokens
            )
            logq = torch.log_softmax(pair.drafter(out).logits[0, len(x) - 1 : -1].float(), dim=-1)
        answer = out[0, len(x) :].tolist()
        for pos, tok in enumerate(answer):
            total += 1
            if tok in head:
                covered += 1
                bits -= float(logq[pos, tok]) / math.log(2)
                nbytes += len(pair.tokenizer.decode([tok]).encode())
    report["bits_per_byte_on_head_tokens"] = bits / max(1, nbytes)
    report["answer_tokens_in_head"] = covered / max(1, total)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specviz.measure.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("--write-card", action="store_true", help="rewrite assets/models/README.md")
    parser.add_argument(
        "--theory",
        action="store_true",
        help="only Leviathan et al.'s predictions against held-out runs, gamma 1..8, greedy and T=1",
    )
    parser.add_argument(
        "--english", action="store_true", help="the English drafter's figures on the held-out prompts (its model card)"
    )
    args = parser.parse_args(argv)
    if args.english:
        print(json.dumps(english_card(), indent=1))
        return
    if args.theory:
        print(json.dumps(theory_check(), indent=1))
        return
    m = measure()
    print(json.dumps(m, indent=1))
    if args.write_card:
        (MODELS / "README.md").write_text(card(m))
        print(f"wrote {MODELS / 'README.md'}")


if __name__ == "__main__":
    main()
