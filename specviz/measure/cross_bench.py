"""Bench a drafter with its own tokenizer: ours beside transformers' ``assistant_tokenizer`` path.

On the same pair, prompts and settings, in one run: our autoregressive decoding (the baseline),
our token-level intersection (greedy and sampled), our string-level scheme (greedy), and
transformers' ``generate(assistant_model=..., tokenizer=..., assistant_tokenizer=...)`` (greedy:
its string-level generator; sampled: its universal speculative decoding, token-level
intersection) beside transformers' own plain ``generate``. Each row gives alpha, tokens per round,
c (drafter step / target step), v (verify pass / target step) and the speedup over our
autoregressive decoding and over transformers' assisted path under the same sampling.

The offline pair (``offline_pair``, the preset ``cross``): the embedded code drafter (GPT-2, its
own 4,096-token byte-level BPE) drafting for the English pair's target (SmolLM2-135M-Instruct,
49,152 tokens), on code prompts. ``python -m specviz bench --pair cross`` (any pair whose drafter
has its own tokenizer, or ``--drafter-kind cross-tokenizer``) runs this bench (``run``);
``python -m specviz.measure.cross_bench`` too.

transformers' assisted rows get a copy of the drafter: its sampled path prunes the assistant's
output layer to the shared tokens in place (``assistant_prune_lm_head``). Where the drafter's fp32
products are routed (``specviz.pair.kernels``) the copy runs transformers' own products
(``unrouted_copy``: a routed model cannot be deep-copied), and our rows keep the routed drafter.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass

import torch

from specviz import theory
from specviz.engine.chain import autoregressive_generate, speculative_generate
from specviz.engine.sampling import Sampling
from specviz.assets import ASSETS
from specviz.drafters.cross_tokenizer import CrossTokenizerDrafter
from specviz.pair.kernels import unrouted_copy

SETTINGS = {"greedy": Sampling(0.0), "sampled": Sampling(1.0)}


@dataclass
class Row:
    """One method under one sampling setting, summed over the prompts.

    Attributes:
        method: "ours: autoregressive", "ours: intersection", "ours: string", "transformers: plain",
            "transformers: assistant_tokenizer".
        tokens, seconds: new tokens and wall time (s) over every prompt.
        alpha: accepted / tested drafts (ours only); tokens_per_round: emitted / rounds (ours only).
        c, v: drafter step / target step and verify pass / target step (ours only, against our baseline).
    """

    method: str
    setting: str
    tokens: int
    seconds: float
    alpha: float | None = None
    tokens_per_round: float | None = None
    c: float | None = None
    v: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def offline_pair(device=None):
    """(drafter, drafter tokenizer, target, target tokenizer): the preset ``cross``, the embedded code
    drafter and the English target.

    Raises:
        PairError: the English target is not installed here (``specviz.pair.english_available``).
    """
    from specviz.pair import CROSS, load_pair

    pair = load_pair(CROSS, device=device)
    return pair.drafter, pair.drafter_tokenizer, pair.target, pair.tokenizer


def code_prompts(count: int) -> list[str]:
    """The embedded pair's held-out code prompts (assets/prompts.json)."""
    raw = json.loads((ASSETS / "prompts.json").read_text())
    items = raw if isinstance(raw, list) else raw.get("prompts", [])
    return [p if isinstance(p, str) else p.get("prompt", "") for p in items][:count]


def _ours(method: str, setting: str, traces: list, baselines: list) -> Row:
    tokens = sum(len(t.output_ids) for t in traces)
    seconds = sum(t.total_ms for t in traces) / 1000
    accepted, rejected = sum(t.accepted for t in traces), sum(t.rejected for t in traces)
    rounds = sum(len(t.rounds) for t in traces)
    cs = [c for t, b in zip(traces, baselines) if (c := theory.cost_coefficient(t, b)) is not None]
    vs = [v for t, b in zip(traces, baselines) if (v := theory.verify_cost(t, b)) is not None]
    return Row(
        method,
        setting,
        tokens,
        seconds,
        alpha=accepted / (accepted + rejected) if accepted + rejected else None,
        tokens_per_round=tokens / rounds if rounds else None,
        c=sum(cs) / len(cs) if cs else None,
        v=sum(vs) / len(vs) if vs else None,
    )


def _transformers(
    method: str, setting: str, target, ids_list, new_tokens: int, sampling: Sampling, seed: int, **assist
) -> Row:
    tokens, seconds = 0, 0.0
    sample = (
        dict(do_sample=False)
        if sampling.greedy
        else dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    )
    for i, ids in enumerate(ids_list):
        torch.manual_seed(seed + i)
        x = torch.tensor([ids], device=target.device)
        start = time.perf_counter()
        out = target.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
            **sample,
            **assist,
        )
        seconds += time.perf_counter() - start
        tokens += out.shape[1] - x.shape[1]
    return Row(method, setting, tokens, seconds)


def cross_bench(
    drafter,
    drafter_tok,
    target,
    target_tok,
    prompts: list[str] | list[list[int]],
    new_tokens: int = 32,
    gamma: int = 4,
    settings: tuple[str, ...] = ("greedy", "sampled"),
    seed: int = 0,
    sampled: Sampling | None = None,
) -> list[Row]:
    """Every method under every setting of ``settings`` (keys of ``SETTINGS``) on ``prompts`` (texts,
    encoded with the target's tokenizer, or target token ids); no EOS stops a run (each makes
    ``new_tokens``), so all methods decode the same number of tokens. ``sampled`` replaces the
    sampled setting's ``Sampling`` (default temperature 1, every token kept).

    The drafter is not changed: transformers' assisted rows run a copy of it (``unrouted_copy``: with
    transformers' own products where the drafter's are routed).

    Raises:
        CrossTokenizerError: the pair's vocabularies cannot serve (``shared_vocabulary``).
    """
    settings = tuple(sorted(settings, key=lambda s: s == "sampled"))
    ids_list = [target_tok.encode(p, add_special_tokens=False) if isinstance(p, str) else list(p) for p in prompts]
    # One short run of each model first: first calls pay one-time costs that no method should carry.
    autoregressive_generate(ids_list[0], target, max_new_tokens=2)
    autoregressive_generate(drafter_tok.encode("x", add_special_tokens=False) or [0], drafter, max_new_tokens=2)
    rows = []
    for setting in settings:
        sampling = sampled if setting == "sampled" and sampled is not None else SETTINGS[setting]
        base = [
            autoregressive_generate(ids, target, sampling=sampling, max_new_tokens=new_tokens, seed=seed + i)
            for i, ids in enumerate(ids_list)
        ]
        rows.append(_ours("ours: autoregressive", setting, base, base))
        schemes = ("intersection", "string") if sampling.greedy else ("intersection",)
        for scheme in schemes:
            ours = CrossTokenizerDrafter(drafter, drafter_tok, target_tok, scheme=scheme)
            traces = [
                speculative_generate(
                    ids, ours, target, gamma=gamma, sampling=sampling, max_new_tokens=new_tokens, seed=seed + i
                )
                for i, ids in enumerate(ids_list)
            ]
            rows.append(_ours(f"ours: {scheme}", setting, traces, base))
        rows.append(_transformers("transformers: plain", setting, target, ids_list, new_tokens, sampling, seed))
        assistant = unrouted_copy(drafter)
        assistant.generation_config.num_assistant_tokens = gamma
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        rows.append(
            _transformers(
                "transformers: assistant_tokenizer",
                setting,
                target,
                ids_list,
                new_tokens,
                sampling,
                seed,
                assistant_model=assistant,
                tokenizer=target_tok,
                assistant_tokenizer=drafter_tok,
            )
        )
        del assistant
    return rows


def table(rows: list[Row]) -> str:
    """The rows as a text table: speedups over our autoregressive decoding and over transformers'
    assistant_tokenizer path under the same setting (tokens/s over tokens/s)."""

    def num(x, digits=2):
        return "-" if x is None else f"{x:.{digits}f}"

    lines = [
        f"{'setting':8} {'method':36} {'tokens':>6} {'tok/s':>8} {'alpha':>6} {'tok/round':>9} {'c':>6} {'v':>6} "
        f"{'vs our AR':>9} {'vs hf assist':>12}"
    ]
    for r in rows:
        ar = next(x for x in rows if x.setting == r.setting and x.method == "ours: autoregressive")
        hf = next(x for x in rows if x.setting == r.setting and x.method == "transformers: assistant_tokenizer")
        lines.append(
            f"{r.setting:8} {r.method:36} {r.tokens:>6} {r.tokens_per_second:>8.1f} {num(r.alpha, 3):>6} "
            f"{num(r.tokens_per_round):>9} {num(r.c, 3):>6} {num(r.v):>6} "
            f"{num(r.tokens_per_second / ar.tokens_per_second if ar.tokens_per_second else None):>9} "
            f"{num(r.tokens_per_second / hf.tokens_per_second if hf.tokens_per_second else None):>12}"
        )
    return "\n".join(lines)


def report(pair, rows: list[Row], gamma: int, new_tokens: int, sampled: Sampling, prompt_set: str) -> dict:
    """What ``bench --json`` prints for a drafter with its own tokenizer: the pair, the settings and
    each row (``Row``'s fields, tokens/s, and its speedups over our autoregressive decoding and over
    transformers' assistant_tokenizer path under the same setting)."""
    out = []
    for r in rows:
        ar = next(x for x in rows if x.setting == r.setting and x.method == "ours: autoregressive")
        hf = next(x for x in rows if x.setting == r.setting and x.method == "transformers: assistant_tokenizer")
        out.append(
            asdict(r)
            | {
                "tokens_per_second": r.tokens_per_second,
                "speedup_vs_our_autoregressive": r.tokens_per_second / ar.tokens_per_second
                if ar.tokens_per_second
                else None,
                "speedup_vs_hf_assistant_tokenizer": r.tokens_per_second / hf.tokens_per_second
                if hf.tokens_per_second
                else None,
            }
        )
    shared = pair.drafter_tokenizer or pair.tokenizer
    return {
        "pair": pair.name,
        "drafter": pair.drafter_id,
        "target": pair.target_id,
        "device": pair.device.type,
        "drafter_vocabulary": len(shared),
        "target_vocabulary": len(pair.tokenizer),
        "gamma": gamma,
        "max_new_tokens": new_tokens,
        "prompt_set": prompt_set,
        "sampled": asdict(sampled),
        "rows": out,
        "_rows": rows,
    }


def format_report(rep: dict) -> str:
    """The report as bench prints it: a header line, then ``table``."""
    s = rep["sampled"]
    head = (
        f"{rep['pair']}: drafter {rep['drafter']} ({rep['drafter_vocabulary']} tokens) -> target {rep['target']} "
        f"({rep['target_vocabulary']} tokens) on {rep['device']}, gamma {rep['gamma']}, {rep['max_new_tokens']} new "
        "tokens per prompt, "
        f"{rep['prompt_set']} prompts; sampled = temperature {s['temperature']}, top-k {s['top_k']}, top-p "
        f"{s['top_p']}; "
        "one timed run per prompt and method"
    )
    return head + "\n" + table(rep["_rows"])


def run(args) -> int:
    """``python -m specviz bench`` for a drafter with its own tokenizer: greedy and sampled rows in one run
    (``--temperature`` above 0 sets the sampled setting, else temperature 1; ``--repeats`` and the
    options of other kinds are not used)."""
    from specviz.measure.common import benchmark_prompts, prompt_set_for, prompt_token_ids, run_command
    from specviz.pair import load_pair

    def work(a, sampling: Sampling) -> dict:
        pair = load_pair(a.pair, a.drafter, a.target, device=a.device, allow_custom=True, own_tokenizer=True)
        prompt_set = prompt_set_for(a.prompt_set, pair.name)
        ids = prompt_token_ids(pair, benchmark_prompts(a.prompts, prompt_set), prompt_set)
        sampled = sampling if not sampling.greedy else Sampling(1.0)
        print(
            f"bench: {len(ids)} prompts x 5 methods greedy + 4 sampled, {a.max_new_tokens} tokens each", file=sys.stderr
        )
        rows = cross_bench(
            pair.drafter,
            pair.drafter_tokenizer or pair.tokenizer,
            pair.target,
            pair.tokenizer,
            ids,
            new_tokens=a.max_new_tokens,
            gamma=a.gamma,
            seed=a.seed,
            sampled=sampled,
        )
        return report(pair, rows, a.gamma, a.max_new_tokens, sampled, prompt_set)

    def json_ready(a, sampling: Sampling) -> dict:  # --json prints the report without its Row objects
        return {k: v for k, v in work(a, sampling).items() if k != "_rows"}

    return run_command(args, json_ready if getattr(args, "json", False) else work, format_report)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=8, help="code prompts (of assets/prompts.json)")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--gamma", type=int, default=4)
    args = p.parse_args(argv)
    drafter, drafter_tok, target, target_tok = offline_pair("cpu")
    print(
        table(
            cross_bench(
                drafter, drafter_tok, target, target_tok, code_prompts(args.prompts), args.new_tokens, args.gamma
            )
        )
    )


if __name__ == "__main__":
    main()
