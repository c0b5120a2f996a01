"""On-policy distillation of the drafter in chunks (specviz.training.onpolicy), on a tiny Llama and a tiny drafter.

Offline and fast: the tiny Llama and ChatML tokenizer of tests/test_english.py, a corpus of the target's answers as
in tests/test_eagle_training.py, and a SmallHeadLM of 64 head tokens trained for a few steps.
"""

from __future__ import annotations

import json

import pytest
import torch

from specviz.pair.small_head import SmallHeadConfig, SmallHeadLM
from specviz.training import eagle_checkpoint as ckpt
from specviz.training import eagle_corpus as ec
from specviz.training import instructions, onpolicy
from tests.test_eagle_training import HELD, pair, small_plan  # noqa: F401  (pair is a fixture)


@pytest.fixture
def corpus_dir(tmp_path, pair):  # noqa: F811
    target, tok = pair
    folder = tmp_path / "corpus"
    plan = small_plan()
    plan.save(folder)
    ec.add_shards(target, tok, folder, plan, time_s=1e9, gen_batch=4, max_shards=1)
    return folder


@pytest.fixture
def shipped(tmp_path, pair):  # noqa: F811
    """A tiny drafter saved as the committed one is: 64 head tokens (every other id), fp16."""
    target, tok = pair
    c = target.config
    config = SmallHeadConfig(vocab_size=c.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                             rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                             tie_word_embeddings=False, embedding_size=16, head_size=64)
    torch.manual_seed(5)
    model = SmallHeadLM(config)
    ids = torch.arange(0, 128, 2)
    ids[1] = 2  # the end-of-turn token among the head's
    model.head_ids.copy_(torch.sort(ids).values)
    folder = tmp_path / "shipped"
    model.half().save_pretrained(folder)
    return folder


def chunk(**kw) -> onpolicy.ChunkSettings:
    return onpolicy.ChunkSettings(**{"chunk_s": 1e9, "batch": 3, "dtype": "float32", "eval_prompts": 0, **kw})


RUN = {"warmup": 2, "total_steps": 8, "lr": 3e-3, "continuation_tokens": 6, "on_policy_share": 0.5}


def _go(target, tok, folder, corpus_dir, shipped, run=None, **kw):
    return onpolicy.run_chunk(target, tok, chunk(**kw), folder, run if run is not None else RUN, shipped, corpus_dir,
                              held_out=HELD)


def test_a_chunk_then_a_resumed_chunk_equals_one_run_bit_for_bit(tmp_path, pair, corpus_dir, shipped):  # noqa: F811
    """float32 moments: weights, moments, schedule and both data orders of a split run are the whole run's to the
    bit, with on-policy and corpus batches both among the 5 steps (seeded per step)."""
    target, tok = pair
    run = {**RUN, "moments": "float32"}
    split, whole = tmp_path / "split", tmp_path / "whole"
    _go(target, tok, split, corpus_dir, shipped, run, max_steps=3)
    entry = _go(target, tok, split, corpus_dir, shipped, {}, max_steps=2)
    last = _go(target, tok, whole, corpus_dir, shipped, run, max_steps=5)
    assert last["batches"]["on_policy"] > 0 and last["batches"]["target_answers"] > 0
    assert entry["chunk"] == 2 and entry["steps_before"] == 3
    (ia, ta), (ib, tb) = ckpt.load(split), ckpt.load(whole)
    assert ia["step"] == ib["step"] == 5 and ia["data"] == ib["data"] and ia["scheduler"] == ib["scheduler"]
    assert ia["parts"][0].startswith("drafter-step0000005")
    for key in ta:
        if not key.startswith("rng."):
            assert torch.equal(ta[key], tb[key]), key


def test_a_new_run_starts_from_the_committed_drafter_logs_its_start_and_exports_only_a_better_one(
        tmp_path, pair, corpus_dir, shipped):  # noqa: F811
    target, tok = pair
    folder = tmp_path / "ck"
    entry = _go(target, tok, folder, corpus_dir, shipped, max_steps=0, chunk_s=0, eval_prompts=2, eval_tokens=6)
    index, tensors = ckpt.load(folder)
    start = SmallHeadLM.from_pretrained(shipped, dtype=torch.float32)
    for name, p in start.named_parameters():
        assert torch.equal(tensors[f"param.{name}"], p.detach()), name
    assert torch.equal(tensors["head_ids"], start.head_ids)
    lines = [json.loads(x) for x in (folder / "log.jsonl").read_text().splitlines()]
    assert [x["chunk"] for x in lines] == [0, 1] and "before training" in lines[0]["note"]
    for setting in ("greedy", "t0.7-p0.9"):
        assert lines[0]["held_out"][setting]["positions"] > 0 and 0 <= entry["held_out"][setting]["mean_beta"] <= 1
    # untrained, it equals its start: not better, so nothing is exported
    assert entry["beats_start"] is False and entry["exported_to"] is None
    better = {k: {**v, "mean_beta": v["mean_beta"] + 0.01} for k, v in lines[0]["held_out"].items()}
    assert onpolicy._beats(better, lines[0]["held_out"]) and not onpolicy._beats(lines[0]["held_out"], better)
    onpolicy.export(start, tmp_path / "export", shipped)
    again = SmallHeadLM.from_pretrained(tmp_path / "export")
    assert again.dtype == torch.float16 and torch.equal(again.head_ids, start.head_ids)


def test_held_out_prompts_among_the_training_prompts_are_refused(tmp_path, pair, corpus_dir, shipped, monkeypatch):  # noqa: F811
    target, tok = pair
    real = instructions.build
    monkeypatch.setattr(instructions, "build", lambda *a, **k: real(20, 1) + [HELD[3]])
    with pytest.raises(ec.CorpusError, match="held-out"):
        _go(target, tok, tmp_path / "ck", corpus_dir, shipped, max_steps=1)


def test_the_loss_is_one_minus_beta_and_its_minimum_is_q_equal_to_p_on_the_head():
    """beta = sum_x min(p, q) (Leviathan et al. 2023, Def. 3.1): q = p restricted to the head (renormalised) gives
    beta = p's mass on the head at T 1, the largest any q on the head can reach; a planted q (uniform) scores lower."""
    torch.manual_seed(0)
    p_logits = torch.randn(5, 40) * 3
    head = torch.arange(0, 40, 2)
    run = onpolicy.RunSettings(tv_temperatures="1.0", kl_weight=0.0)
    mass = torch.softmax(p_logits, -1)[:, head].sum(-1).mean()
    loss, stats = onpolicy.losses(p_logits, p_logits[:, head], head, run)
    assert torch.allclose(stats[0], mass, atol=1e-6) and torch.allclose(loss, 1 - mass, atol=1e-6)
    assert torch.allclose(stats[1], torch.zeros(()), atol=1e-6)  # KL(p~ || q) is 0 at q = p~
    worse, _ = onpolicy.losses(p_logits, torch.zeros(5, 20), head, run)
    assert worse > loss + 0.05


def test_the_command_is_dispatched(capsys):
    from specviz.training import train

    with pytest.raises(SystemExit) as e:
        train.main(["--onpolicy", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--chunk-s" in out and "--on-policy-share" in out and "--export" in out


def test_a_deepened_drafter_gives_its_starts_logits_and_a_grown_run_keeps_its_layers(
        tmp_path, pair, corpus_dir, shipped):  # noqa: F811
    """Layers appended pass their input through at first: the same logits to the bit (they add exact zeros); a new
    run with grow_layers starts from the grown drafter, says so, and a resumed chunk keeps its layers."""
    from specviz.pair.small_head import deepened

    start = SmallHeadLM.from_pretrained(shipped, dtype=torch.float32).eval()
    grown = deepened(start, 2).eval()
    assert grown.config.num_hidden_layers == 3 and start.config.num_hidden_layers == 1
    ids = torch.randint(0, start.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(grown(ids).logits, start(ids).logits)
    with pytest.raises(ValueError, match="extra_layers"):
        deepened(start, -1)
    target, tok = pair
    folder = tmp_path / "grown"
    _go(target, tok, folder, corpus_dir, shipped, {**RUN, "grow_layers": 1}, max_steps=1)
    _go(target, tok, folder, corpus_dir, shipped, {}, max_steps=1)
    index, _ = ckpt.load(folder)
    assert index["drafter_config"]["num_hidden_layers"] == 2 and index["step"] == 2
    assert "grown by 1 layer passing" in index["started_from"]
