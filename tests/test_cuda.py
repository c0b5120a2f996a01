"""On a GPU: the engine, the exactness check, the stand-in pairs in bf16 and the demo's handler on CUDA.

Marked ``cuda`` and skipped where ``torch.cuda.is_available()`` is false, so CI (no GPU) never needs
one. Run them with ``python -m pytest -n 0 -m cuda``. ``SPECVIZ_TEST_DEVICE=cpu`` runs the same code
on the CPU, a check of the tests themselves on a machine without a GPU (the synchronisation check
then only checks the timings' order).

On CUDA ``load_pair`` gives bf16 weights, as a visitor of a GPU Space gets: greedy output is compared
with the target's cache-free greedy output up to a first divergence that must be a near-tie
(tests.test_families.first_divergence), and the statistical check is run in bf16 too.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from specviz import Sampling, autoregressive_generate, speculative_generate

from specviz.engine import rejection
from specviz import pair as pairs
from specviz.pair import EMBEDDED, encode_prompt, load_pair
from tests.conftest import download_index
from tests.families import FAMILIES
from tests.test_exactness import ALPHA
from tests import test_families as fam
from tests.test_families import NEW_TOKENS, TEXT, bf16, family_chi_square, first_divergence, reference_greedy

# test_families' fixtures, by name: the stand-ins, the demo, and room for every pair while this module runs.
standins, small_standins, demo_client = fam.standins, fam.small_standins, fam.demo_client
resident, unload_after_module = fam.resident, fam.unload_after_module

DEVICE = torch.device(os.environ.get("SPECVIZ_TEST_DEVICE", "cuda"))

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def on_device(folders):
    return load_pair(drafter=folders[0], target=folders[1], device=DEVICE, allow_custom=True)


def check_greedy(pair, ids, gamma: int = 4):
    """Speculative greedy against the target's cache-free greedy: equal, or parted at a near-tie."""
    vocab = len(pair.tokenizer)
    spec = speculative_generate(
        ids,
        pair.drafter,
        pair.target,
        gamma=gamma,
        sampling=Sampling(0.0),
        max_new_tokens=NEW_TOKENS,
        eos_token_id=pair.eos_token_ids,
        tokenizer=pair.tokenizer,
    )
    assert spec.settings["device"].startswith(DEVICE.type)
    ref = reference_greedy(pair.target, ids, NEW_TOKENS, vocab, set(pair.eos_token_ids))
    parted = first_divergence(pair.target, ids, spec.output_ids, ref, vocab)
    if parted is not None:
        i, gap, error = parted
        print(f"\n{pair.name}: parts at token {i}: gap {gap:.4f}, {pair.target.dtype} error {error:.4f}")
        assert gap <= 4 * error, f"token {i} is not a near-tie"
    return spec


def test_the_engine_on_the_embedded_pair():
    pair = load_pair(EMBEDDED, device=DEVICE)
    assert pair.target.device.type == DEVICE.type
    if DEVICE.type == "cuda":
        assert pair.target.dtype == torch.bfloat16
    ids = encode_prompt(pair, "def add(a, b):")
    for gamma in (1, 4, 8):
        check_greedy(pair, ids, gamma)
    sampled = speculative_generate(
        ids,
        pair.drafter,
        pair.target,
        gamma=4,
        sampling=Sampling(0.7, top_k=40, top_p=0.95),
        max_new_tokens=32,
        seed=0,
        tokenizer=pair.tokenizer,
    )
    again = speculative_generate(
        ids,
        pair.drafter,
        pair.target,
        gamma=4,
        sampling=Sampling(0.7, top_k=40, top_p=0.95),
        max_new_tokens=32,
        seed=0,
        tokenizer=pair.tokenizer,
    )
    assert sampled.output_ids == again.output_ids  # seeded on the device's generator


def test_timings_wait_for_the_device(monkeypatch):
    """On CUDA a round's end is read after a synchronisation (so it counts the GPU's work) and its phases from
    CUDA events, so a round's draft and verify times fit inside it without one synchronisation per phase."""
    pair = load_pair(EMBEDDED, device=DEVICE)
    ids = encode_prompt(pair, "def add(a, b):")
    calls = []
    if DEVICE.type == "cuda":
        real = torch.cuda.synchronize
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    spec = speculative_generate(
        ids, pair.drafter, pair.target, gamma=4, sampling=Sampling(0.0), max_new_tokens=24, tokenizer=pair.tokenizer
    )
    base = autoregressive_generate(
        ids, pair.target, sampling=Sampling(0.0), max_new_tokens=24, tokenizer=pair.tokenizer
    )
    if DEVICE.type == "cuda":
        # at least the end of every round and of every baseline step (the phases come from events)
        assert len(calls) >= len(spec.rounds) + len(base.rounds)
    for trace in (spec, base):
        ends = [r.end_ms for r in trace.rounds]
        assert ends == sorted(ends) and trace.total_ms >= ends[-1] > 0
        assert all(r.verify_ms >= 0 for r in trace.rounds)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "plain"])
@pytest.mark.parametrize("name", FAMILIES)
def test_stand_ins_in_bf16(standins, name, chat):
    family = FAMILIES[name]
    if chat and not family.instruct:
        pytest.skip("no chat template")
    pair = on_device(standins[name])
    if DEVICE.type != "cuda":  # the CPU check of these tests: bf16 copies, as load_pair gives bf16 on CUDA only
        pair = dataclasses.replace(pair, drafter=bf16(pair.drafter), target=bf16(pair.target))
    assert pair.target.dtype == torch.bfloat16
    check_greedy(pair, encode_prompt(pair, TEXT, chat=chat))


@pytest.mark.parametrize("name", ["llama3.2", "qwen2.5"])
def test_exactness_on_the_device(small_standins, name):
    pair = on_device(small_standins[name])
    pvalue, acceptance, outside = family_chi_square(pair, Sampling(1.0))
    print(f"\n{name} on {DEVICE}: p={pvalue:.3g} acceptance={acceptance:.2f}")
    assert outside == 0 and pvalue > ALPHA


def test_exactness_control_on_the_device(small_standins, monkeypatch):
    pair = on_device(small_standins["qwen2.5"])
    monkeypatch.setattr(rejection.EXACT, "residual", lambda p, q: p)
    pvalue, _, _ = family_chi_square(pair, Sampling(1.0))
    assert pvalue < ALPHA


def test_the_demo_on_the_device(standins, demo_client, monkeypatch):
    """The Llama 3.2 preset, served from its stand-in, through the demo's generate handler."""
    import huggingface_hub

    from specviz.pair import PRESETS
    from specviz.recording import Recording
    from tests.test_pair import FakeHub

    family = FAMILIES["llama3.2"]
    preset = PRESETS[family.preset]
    hub = FakeHub(monkeypatch)
    hub.add(preset.drafter, standins["llama3.2"][0])
    hub.add(preset.target, standins["llama3.2"][1])
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")
    monkeypatch.setattr(pairs.cache, "default_device", lambda: DEVICE)  # the demo asks for the default device
    out = demo_client.predict(family.preset, TEXT, 4, 0.0, 0, 1.0, 16, 0, True, "", "", api_name="/generate")
    status = out[4]
    assert status.startswith("Done") and f"on {DEVICE.type}" in status, status
    rec = Recording.load(out[download_index()]["value"])
    assert rec.speculative.settings["device"].startswith(DEVICE.type)
    assert rec.speculative.output_ids and rec.baseline is not None
