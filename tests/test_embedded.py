"""The embedded pair: speculative greedy output is the target's own greedy output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specviz import Sampling, speculative_generate
from tests.conftest import assert_same_greedy

PROMPTS = [p["prompt"] for p in json.loads((Path(__file__).parent.parent / "assets" / "prompts.json").read_text())]


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_greedy_equals_transformers_generate(embedded, gamma):
    for prompt in PROMPTS[:4]:
        ids = embedded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        trace = speculative_generate(
            ids,
            embedded.drafter,
            embedded.target,
            gamma=gamma,
            sampling=Sampling(0.0),
            max_new_tokens=48,
            eos_token_id=embedded.eos_token_id,
            tokenizer=embedded.tokenizer,
        )
        ref = embedded.target.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=48,
            eos_token_id=embedded.eos_token_id,
            pad_token_id=embedded.eos_token_id,
        )
        assert_same_greedy(
            embedded.target, ids, trace.output_ids, ref[0, len(ids) :].tolist(), vocab=embedded.vocab_size
        )


def test_drafter_as_target_accepts_everything(embedded):
    ids = embedded.tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    trace = speculative_generate(
        ids, embedded.target, embedded.target, gamma=4, sampling=Sampling(0.8), max_new_tokens=32, seed=1
    )
    # p and q come from passes of different shapes: equal to fp32 rounding, so min(1, p/q) is
    # within 1e-5 of 1 and a rejection has probability about 1e-7 per draft (see test_engine).
    assert trace.acceptance_rate == 1.0
    assert all(abs(d.accept_prob - 1.0) < 1e-5 for r in trace.rounds for d in r.drafts)


def test_pair_shares_one_tokenizer_and_fits_the_budget(embedded):
    from specviz.pair import EMBEDDED, PRESETS

    preset = PRESETS[EMBEDDED]
    sizes = sum(
        f.stat().st_size for folder in (preset.drafter, preset.target) for f in Path(folder).glob("*.safetensors")
    )
    assert sizes <= 40 * 2**20
    assert embedded.drafter.config.vocab_size == embedded.target.config.vocab_size == len(embedded.tokenizer)
