"""The EAGLE head's chunked training: corpus shards, features, checkpoints and resumption, on a tiny Llama.

Offline and fast: the tiny Llama and byte-level tokenizer of tests/test_english.py (a ChatML template), a plan of
template prompts, shards of 8 answers of at most 12 tokens, and a head of 64 tokens trained for a few steps.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from specviz.drafters.eagle_head import EagleConfig, EagleHead
from specviz.training import distill, eagle, instructions
from specviz.training import eagle_checkpoint as ckpt
from specviz.training import eagle_corpus as ec
from specviz.training.eagle_features import Features
from tests.test_english import tiny_llama, tiny_tokenizer

HELD = distill.held_out()


@pytest.fixture(scope="module")
def pair():
    tok = tiny_tokenizer()
    return tiny_llama(len(tok)), tok


def small_plan(count: int = 24, **kw) -> ec.Plan:
    prompts = instructions.build(count, seed=3, exclude=set(HELD))
    return ec.Plan.create(HELD, seed=5, shard_size=8, max_new_tokens=12, target="tiny", prompts=prompts, **kw)


@pytest.fixture
def corpus_dir(tmp_path, pair):
    """A corpus folder with shards 0 (greedy) and 1 (sampled) of a 24-prompt plan."""
    target, tok = pair
    folder = tmp_path / "corpus"
    plan = small_plan()
    plan.save(folder)
    assert ec.add_shards(target, tok, folder, plan, time_s=1e9, gen_batch=4, max_shards=2) == [0, 1]
    return folder


def chunk(**kw) -> eagle.ChunkSettings:
    return eagle.ChunkSettings(**{"chunk_s": 1e9, "batch": 4, "dtype": "float32", "feature_group": 3,
                                  "eval_prompts": 0, **kw})


RUN = {"head_size": 64, "warmup": 2, "total_steps": 6, "lr": 3e-3}


# ---- the corpus ---------------------------------------------------------------------------------------------


def test_a_shard_rebuilt_gives_the_same_ids(pair):
    target, tok = pair
    plan = small_plan()
    for index in (0, 1, 6):  # greedy, sampled, and a later sampled pass (three slices: shards 6+ are pass 2)
        a = ec.generate_shard(target, tok, plan, index, gen_batch=4)
        b = ec.generate_shard(target, tok, plan, index, gen_batch=4)
        for key in ("ids", "lengths", "prompt_lengths", "prompt_index"):
            assert np.array_equal(a[key], b[key]), (index, key)
    assert ec.shard_spec(plan, 0).setting["name"] == "greedy" and ec.shard_spec(plan, 1).setting["name"] == "t0.7-p0.9"
    assert ec.shard_spec(plan, 6).prompt_indices == ec.shard_spec(plan, 0).prompt_indices
    assert ec.shard_spec(plan, 6).seed != ec.shard_spec(plan, 1).seed


def test_shards_resume_at_the_first_missing_index_and_round_trip(tmp_path, pair):
    target, tok = pair
    folder = tmp_path / "c"
    plan = small_plan()
    plan.save(folder)
    assert ec.add_shards(target, tok, folder, plan, 1e9, 4, max_shards=2) == [0, 1]
    assert ec.add_shards(target, tok, folder, plan, 1e9, 4, max_shards=1) == [2]
    ec.shard_path(folder, 1).unlink()
    assert ec.add_shards(target, tok, folder, plan, 1e9, 4, max_shards=2) == [1, 3]
    assert ec.add_shards(target, tok, folder, plan, 0.0, 4) == []  # no time: nothing started
    corpus = ec.load(folder, HELD, target.config.vocab_size)
    assert corpus.shards == [0, 1, 2, 3] and len(corpus) == 32
    again = ec.generate_shard(target, tok, plan, 2, gen_batch=4)
    stored = ec.load_shard(ec.shard_path(folder, 2), plan, target.config.vocab_size)
    assert stored["ids"].tolist() == again["ids"].astype(np.int64).tolist()
    with np.load(ec.shard_path(folder, 2), allow_pickle=False) as z:
        assert z["ids"].dtype == np.uint16 and json.loads(str(z["meta"]))["gen_batch"] == 4


def test_held_out_prompts_are_never_in_the_corpus(tmp_path, pair):
    target, tok = pair
    assert len(HELD) == 24
    plan = ec.Plan.create(HELD, seed=0)  # every template prompt but the held-out ones
    assert len(plan.prompts) == 7006 - len({h.lower() for h in HELD} & {p.lower() for p in instructions.build(None)})
    assert not {p.strip().lower() for p in plan.prompts} & {h.strip().lower() for h in HELD}
    # a held-out prompt planted in the prompt list, or written into a saved plan, is refused
    with pytest.raises(ec.CorpusError, match="held-out"):
        ec.Plan.create(HELD, prompts=["Tell me a fun fact about bees.", "  " + HELD[3].upper() + " "])
    folder = tmp_path / "c"
    small_plan().save(folder)
    raw = json.loads((folder / ec.PLAN).read_text())
    raw["prompts"][5] = HELD[0]
    (folder / ec.PLAN).write_text(json.dumps(raw))
    with pytest.raises(ec.CorpusError, match="held-out"):
        ec.Plan.load(folder, HELD)
    # and no shard's prompt is a held-out prompt's chat, token for token
    plan = small_plan()
    held_ids = {tuple(distill.chat_ids(tok, h)) for h in HELD}
    arrays = ec.generate_shard(target, tok, plan, 0, gen_batch=8)
    starts = np.cumsum(arrays["lengths"]) - arrays["lengths"]
    for s, n in zip(starts, arrays["prompt_lengths"]):
        assert tuple(arrays["ids"][s:s + n].tolist()) not in held_ids


def test_a_shard_that_does_not_match_its_plan_is_refused(corpus_dir, pair):
    target, _ = pair
    plan = ec.Plan.load(corpus_dir, HELD)
    path = ec.shard_path(corpus_dir, 0)
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    ec.write_shard(corpus_dir, 4, arrays)  # shard 0's file under another index: its meta names shard 0
    with pytest.raises(ec.CorpusError, match="another shard"):
        ec.load_shard(ec.shard_path(corpus_dir, 4), plan)
    bad = dict(arrays, ids=np.full_like(arrays["ids"], target.config.vocab_size))
    ec.write_shard(corpus_dir, 0, bad)
    with pytest.raises(ec.CorpusError, match="vocabulary"):
        ec.load_shard(path, plan, target.config.vocab_size)
    ec.write_shard(corpus_dir, 0, dict(arrays, lengths=arrays["lengths"] + 1))
    with pytest.raises(ec.CorpusError, match="lengths"):
        ec.load_shard(path, plan)


def test_features_do_not_depend_on_the_order_they_are_asked_in(corpus_dir, pair):
    target, _ = pair
    corpus = ec.load(corpus_dir, HELD)
    a, b = Features(target, corpus, group=3), Features(target, corpus, group=3)
    for i in range(len(corpus)):
        a.get(i)
    for i in reversed(range(len(corpus))):
        assert torch.equal(a.get(i), b.get(i))
    full = Features(target, corpus, group=3, max_cached_bytes=0)  # nothing kept: recomputed the same each time
    full.precompute()
    assert full.cached_bytes == 0 and torch.equal(full.get(7), a.get(7)) and torch.equal(full.get(7), a.get(7))
    assert full.passes == 2
    with torch.no_grad():  # and a sequence's features are its own pass's, padding aside
        alone = target.model(input_ids=corpus.sequence(5)[None]).last_hidden_state[0].to(torch.bfloat16)
    assert (alone.float() - a.get(5).float()).abs().max() < 0.05  # bf16 rounding of two pass shapes


# ---- the checkpoint and resumption -------------------------------------------------------------------------


def _tensors(folder):
    return ckpt.load(folder)


def test_a_chunk_then_a_resumed_chunk_equals_one_run_bit_for_bit(tmp_path, corpus_dir, pair):
    """float32 moments on a CPU: the split run's weights, moments, step, schedule and data order are the
    uninterrupted run's to the bit (5 steps of 4 answers over 16 cross a pass over the data)."""
    target, tok = pair
    run = {**RUN, "moments": "float32"}
    split, whole = tmp_path / "split", tmp_path / "whole"
    eagle.run_chunk(target, tok, chunk(max_steps=3), split, corpus_dir, run, init="target", held_out=HELD)
    entry = eagle.run_chunk(target, tok, chunk(max_steps=2), split, corpus_dir, {}, init="target", held_out=HELD)
    eagle.run_chunk(target, tok, chunk(max_steps=5), whole, corpus_dir, run, init="target", held_out=HELD)
    (ia, ta), (ib, tb) = _tensors(split), _tensors(whole)
    assert entry["chunk"] == 2 and entry["steps_before"] == 3 and ia["step"] == ib["step"] == 5
    assert ia["data"] == ib["data"] and ia["data"]["pass"] == 1 and ia["data"]["position"] == 4
    assert ia["scheduler"] == ib["scheduler"] and ia["param_groups"] == ib["param_groups"]
    assert set(ta) == set(tb)
    for key in ta:
        if not key.startswith("rng."):
            assert torch.equal(ta[key], tb[key]), key


def test_bfloat16_moments_resume_within_their_rounding(tmp_path, corpus_dir, pair):
    """bf16 moments (the default, half the size): the resumed run starts its 4th step from moments rounded to
    8 significant bits (a relative 2^-9), so its weights may differ from the uninterrupted run's, by a small fraction
    of what those steps changed (at most 0.12 % of the largest change here; 1 % allowed)."""
    target, tok = pair
    split, whole = tmp_path / "split", tmp_path / "whole"
    eagle.run_chunk(target, tok, chunk(max_steps=3), split, corpus_dir, RUN, init="target", held_out=HELD)
    eagle.run_chunk(target, tok, chunk(max_steps=3), split, corpus_dir, {}, init="target", held_out=HELD)
    eagle.run_chunk(target, tok, chunk(max_steps=6), whole, corpus_dir, RUN, init="target", held_out=HELD)
    eagle.run_chunk(target, tok, chunk(max_steps=0, chunk_s=0), tmp_path / "start", corpus_dir, RUN, init="target",
                    held_out=HELD)
    (ia, ta), (_, tb), (_, t0) = _tensors(split), _tensors(whole), _tensors(tmp_path / "start")
    assert ia["moments_dtype"] == "bfloat16" and ta["exp_avg.fc.weight"].dtype == torch.bfloat16
    for name in ia["param_order"]:
        key = f"param.{name}"
        moved = (tb[key] - t0[key]).abs().max()
        assert (ta[key] - tb[key]).abs().max() <= 0.01 * moved + 1e-7, name  # 0.0012 measured


def test_the_checkpoint_holds_the_optimiser_and_loads_with_safetensors_alone(tmp_path, corpus_dir, pair, monkeypatch):
    target, tok = pair
    folder = tmp_path / "ck"
    eagle.run_chunk(target, tok, chunk(max_steps=2), folder, corpus_dir, RUN, init="target", held_out=HELD)
    index = json.loads((folder / ckpt.INDEX).read_text())
    assert index["step"] == 2 and index["scheduler"]["last_epoch"] == 2 and index["chunk"] == 1
    assert index["data"]["position"] == 8 and index["run"]["head_size"] == 64
    from safetensors import safe_open

    keys = set()
    for part in index["parts"]:
        assert part.startswith("eagle-step0000002") and part.endswith(".safetensors")
        with safe_open(str(folder / part), framework="pt") as f:
            keys |= set(f.keys())
    names = index["param_order"]
    assert {f"param.{n}" for n in names} | {f"exp_avg.{n}" for n in names} | {f"exp_avg_sq.{n}" for n in names} \
        | {"head_ids", "rng.cpu"} == keys
    assert sum((folder / p).stat().st_size for p in index["parts"]) == index["bytes"]

    def refuse(*a, **k):
        raise AssertionError("a pickle was read")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    entry = eagle.run_chunk(target, tok, chunk(max_steps=1), folder, corpus_dir, {}, init="target", held_out=HELD)
    assert entry["steps"] == 3
    after = json.loads((folder / ckpt.INDEX).read_text())
    assert sorted(p.name for p in folder.glob("*.safetensors")) == sorted(after["parts"])  # the old parts are gone


def test_a_new_run_starts_from_the_shipped_head_and_logs_each_chunk(tmp_path, corpus_dir, pair):
    target, tok = pair
    torch.manual_seed(11)
    shipped = EagleHead(EagleConfig.from_target(target.config, 64), head_ids=torch.arange(0, 128, 2))
    shipped.save(tmp_path / "shipped")
    folder = tmp_path / "ck"
    eagle.run_chunk(target, tok, chunk(chunk_s=0, eval_prompts=2, eval_tokens=6), folder, corpus_dir, {},
                    init="shipped", init_folder=tmp_path / "shipped", held_out=HELD)
    index, tensors = ckpt.load(folder)
    assert index["step"] == 0 and "fresh AdamW moments" in index["started_from"]
    assert torch.equal(tensors["head_ids"], torch.arange(0, 128, 2))
    for name, p in shipped.named_parameters():
        assert torch.equal(tensors[f"param.{name}"], p.detach().half().float()), name
    eagle.run_chunk(target, tok, chunk(max_steps=2, eval_prompts=2, eval_tokens=6), folder, corpus_dir, {"lr": 1e-4},
                    held_out=HELD, export=tmp_path / "export")
    lines = [json.loads(x) for x in (folder / eagle.LOG).read_text().splitlines()]
    assert [x["chunk"] for x in lines] == [0, 1, 2] and "before training" in lines[0]["note"]
    last = lines[-1]
    assert last["steps"] == 2 and last["run_settings_changed"] == {"lr": 1e-4} and last["device"] == "cpu"
    assert last["answers_per_s"] > 0 and last["tokens_per_s"] > 0 and last["gpu_utilisation_percent"] is None
    for setting in ("greedy", "t0.7-p0.9"):
        scores = last["held_out_first_draft"][setting]
        assert (
            scores["positions"] > 0 and 0 <= scores["first_draft_mean_beta"] <= 1 and 0 <= scores["top1_agreement"] <= 1
        )
    exported = EagleHead.load(tmp_path / "export")
    assert torch.equal(exported.head_ids, torch.arange(0, 128, 2))


def test_a_grown_corpus_starts_a_new_pass(tmp_path, corpus_dir, pair):
    target, tok = pair
    folder = tmp_path / "ck"
    eagle.run_chunk(target, tok, chunk(max_steps=1), folder, corpus_dir, RUN, init="target", held_out=HELD)
    ec.add_shards(target, tok, corpus_dir, ec.Plan.load(corpus_dir, HELD), 1e9, 4, max_shards=1)
    entry = eagle.run_chunk(target, tok, chunk(max_steps=1), folder, corpus_dir, {}, held_out=HELD)
    assert entry["corpus_changed"] and entry["corpus"]["answers"] == 24 and entry["corpus"]["pass"] == 1


def test_the_commands_are_dispatched(capsys):
    from specviz.training import train

    for flag in ("--eagle", "--eagle-data"):
        with pytest.raises(SystemExit) as e:
            train.main([flag, "--help"])
        assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--chunk-s" in out and "--gen-batch" in out
