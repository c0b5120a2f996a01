"""Bench a drafter with its own tokenizer: ours beside transformers' ``assistant_tokenizer`` path.

On the same pair, prompts and settings, in one run: our autoregressive decoding (the baseline),
our token-level intersection (greedy and sampled), our string-level scheme (greedy), and
transformers' ``generate(assistant_model=..., tokenizer=..., assistant_tokenizer=...)`` (greedy:
its string-level generator; sampled: its universal speculative decoding, token-level
intersection) beside transformers' own plain ``generate``. Each row gives alpha, tokens per round,
c (drafter step / target step), v (verify pass / target step) and the speedup over our
autoregressive decoding and over transformers' assisted path under the same sampling.

The offline pair (``offline_pair``): the embedded code drafter (GPT-2, its own 4,096-token
byte-level BPE) drafting for the English pair's target (SmolLM2-135M-Instruct, 49,152 tokens),
on code prompts. ``python -m specviz.measure.cross_bench``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import torch

from specviz import Sampling, autoregressive_generate, speculative_generate, theory
from specviz.assets import ASSETS
from specviz.drafters.cross_tokenizer import CrossTokenizerDrafter

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


def offline_pair():
    """(drafter, drafter tokenizer, target, target tokenizer): the embedded code drafter and the English target.

    Raises:
        PairError: the English target is not installed here (``specviz.pair.english_available``).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specviz.pair import ENGLISH, load_pair

    pair = load_pair(ENGLISH, device="cpu")
    folder = ASSETS / "models" / "drafter"
    drafter = AutoModelForCausalLM.from_pretrained(folder).eval()
    return drafter, AutoTokenizer.from_pretrained(folder), pair.target, pair.tokenizer


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
    return Row(method, setting, tokens, seconds, alpha=accepted / (accepted + rejected) if accepted + rejected else None,
               tokens_per_round=tokens / rounds if rounds else None, c=sum(cs) / len(cs) if cs else None,
               v=sum(vs) / len(vs) if vs else None)


def _transformers(method: str, setting: str, target, ids_list, new_tokens: int, sampling: Sampling, seed: int, **assist) -> Row:
    tokens, seconds = 0, 0.0
    sample = dict(do_sample=False) if sampling.greedy else dict(do_sample=True, temperature=sampling.temperature, top_k=0)
    for i, ids in enumerate(ids_list):
        torch.manual_seed(seed + i)
        x = torch.tensor([ids], device=target.device)
        start = time.perf_counter()
        out = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              pad_token_id=0, **sample, **assist)
        seconds += time.perf_counter() - start
        tokens += out.shape[1] - x.shape[1]
    return Row(method, setting, tokens, seconds)


def cross_bench(drafter, drafter_tok, target, target_tok, prompts: list[str], new_tokens: int = 32, gamma: int = 4,
                settings: tuple[str, ...] = ("greedy", "sampled"), seed: int = 0) -> list[Row]:
    """Every method under every setting of ``settings`` (keys of ``SETTINGS``) on ``prompts``; no EOS
    stops a run (each makes ``new_tokens``), so all methods decode the same number of tokens.

    transformers' sampled path prunes the drafter's output layer to the shared tokens in place
    (``assistant_prune_lm_head``), so it runs last, and the drafter is not reused after this call.

    Raises:
        CrossTokenizerError: the pair's vocabularies cannot serve (``shared_vocabulary``).
    """
    settings = tuple(sorted(settings, key=lambda s: s == "sampled"))
    ids_list = [target_tok.encode(p, add_special_tokens=False) for p in prompts]
    rows = []
    for setting in settings:
        sampling = SETTINGS[setting]
        base = [autoregressive_generate(ids, target, sampling=sampling, max_new_tokens=new_tokens, seed=seed + i)
                for i, ids in enumerate(ids_list)]
        rows.append(_ours("ours: autoregressive", setting, base, base))
        schemes = ("intersection", "string") if sampling.greedy else ("intersection",)
        for scheme in schemes:
            ours = CrossTokenizerDrafter(drafter, drafter_tok, target_tok, scheme=scheme)
            traces = [speculative_generate(ids, ours, target, gamma=gamma, sampling=sampling, max_new_tokens=new_tokens, seed=seed + i)
                      for i, ids in enumerate(ids_list)]
            rows.append(_ours(f"ours: {scheme}", setting, traces, base))
        rows.append(_transformers("transformers: plain", setting, target, ids_list, new_tokens, sampling, seed))
        drafter.generation_config.num_assistant_tokens = gamma
        drafter.generation_config.num_assistant_tokens_schedule = "constant"
        rows.append(_transformers("transformers: assistant_tokenizer", setting, target, ids_list, new_tokens, sampling, seed,
                                  assistant_model=drafter, tokenizer=target_tok, assistant_tokenizer=drafter_tok))
    return rows


def table(rows: list[Row]) -> str:
    """The rows as a text table: speedups over our autoregressive decoding and over transformers'
    assistant_tokenizer path under the same setting (tokens/s over tokens/s)."""
    def num(x, digits=2):
        return "-" if x is None else f"{x:.{digits}f}"

    lines = [f"{'setting':8} {'method':36} {'tokens':>6} {'tok/s':>8} {'alpha':>6} {'tok/round':>9} {'c':>6} {'v':>6} "
             f"{'vs our AR':>9} {'vs hf assist':>12}"]
    for r in rows:
        ar = next(x for x in rows if x.setting == r.setting and x.method == "ours: autoregressive")
        hf = next(x for x in rows if x.setting == r.setting and x.method == "transformers: assistant_tokenizer")
        lines.append(f"{r.setting:8} {r.method:36} {r.tokens:>6} {r.tokens_per_second:>8.1f} {num(r.alpha, 3):>6} "
                     f"{num(r.tokens_per_round):>9} {num(r.c, 3):>6} {num(r.v):>6} "
                     f"{num(r.tokens_per_second / ar.tokens_per_second if ar.tokens_per_second else None):>9} "
                     f"{num(r.tokens_per_second / hf.tokens_per_second if hf.tokens_per_second else None):>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=8, help="code prompts (of assets/prompts.json)")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--gamma", type=int, default=4)
    args = p.parse_args(argv)
    drafter, drafter_tok, target, target_tok = offline_pair()
    print(table(cross_bench(drafter, drafter_tok, target, target_tok, code_prompts(args.prompts), args.new_tokens, args.gamma)))


if __name__ == "__main__":
    main()
