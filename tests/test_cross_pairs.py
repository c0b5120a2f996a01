"""Pairs whose drafter has a tokenizer of its own, loaded as a pair (``specviz.pair``): the hub presets across
families on offline stand-ins (tests/families.py: two families' tokenizers, trained here), and the
loader's refusals that stay for every other pair.

- A cross-family preset loads through the visitor's path (the hub's answers and downloads faked from
  the stand-ins' folders); the Pair carries both tokenizers; its drafter drafts as "cross-tokenizer"
  by default and is refused as "model"; greedy output is the target's own greedy, token for token,
  under both schemes.
- Custom ids with two tokenizers are refused unless the caller drafts with the cross-tokenizer kind;
  then a pair whose vocabularies cannot serve is refused with the reason.
"""

from __future__ import annotations

import pytest

from specviz import Sampling, speculative_generate
from specviz import pair as pairs
from specviz.drafters import CrossTokenizerDrafter, default_kind, usable_kinds
from specviz.pair import PRESETS, PairError, encode_prompt, load_pair
from specviz.pair.drafter import pair_drafter
from tests.families import FAMILIES, save_pair
from tests.test_families import reference_greedy
from tests.test_pair import WORDS, FakeHub, save_tiny

# preset -> (drafter's family, target's family)
CROSS_FAMILY = {
    "Qwen2.5-0.5B-Instruct -> SmolLM2-1.7B-Instruct": ("qwen2.5", "smollm2"),
    "gpt2 -> Llama-3.2-3B-Instruct": ("gpt2", "llama3.2"),
}
TEXT = "What is speculative decoding? def add(a, b):"


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> dict[str, tuple[str, str]]:
    root = tmp_path_factory.mktemp("cross-standins")
    return {
        name: save_pair(FAMILIES[name], root / name) for name in {f for pair in CROSS_FAMILY.values() for f in pair}
    }


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in (pairs.ALLOW_CUSTOM_ENV, pairs.RESIDENT_PAIRS_ENV, "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    pairs.unload_all()
    yield
    pairs.unload_all()


def serve(monkeypatch, standins, name: str) -> FakeHub:
    """The hub, faked: the preset's drafter from its family's stand-in drafter, its target from the other family's
    stand-in target."""
    import huggingface_hub

    drafter_family, target_family = CROSS_FAMILY[name]
    hub = FakeHub(monkeypatch)
    hub.add(PRESETS[name].drafter, standins[drafter_family][0])
    hub.add(PRESETS[name].target, standins[target_family][1])
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")  # the gated Llama target asks for a token
    return hub


def test_the_cross_family_presets_are_marked_and_named_in_readme():
    from pathlib import Path

    front = Path(__file__).resolve().parents[1].joinpath("README.md").read_text().split("---")[1]
    for name in CROSS_FAMILY:
        p = PRESETS[name]
        assert p.own_tokenizer and p.instruct and "own tokenizer" in p.summary
        assert f"  - {p.drafter}\n" in front and f"  - {p.target}\n" in front  # models the Space already names


@pytest.mark.parametrize("name", CROSS_FAMILY)
def test_a_cross_family_preset_loads_with_both_tokenizers_and_decodes_the_targets_greedy(standins, monkeypatch, name):
    serve(monkeypatch, standins, name)
    pair = load_pair(name, device="cpu")
    assert pair.own_tokenizer and pair.drafter_tokenizer.get_vocab() != pair.tokenizer.get_vocab()
    assert pair.vocab_size == len(pair.tokenizer)  # the target's vocabulary sizes the run
    assert default_kind(pair) == "cross-tokenizer"
    kinds = usable_kinds(pair.target, pair.own_tokenizer)
    assert "cross-tokenizer" in kinds and "model" not in kinds
    with pytest.raises(ValueError, match="tokenizer of its own.*cross-tokenizer kind"):
        pair_drafter("model", pair)
    ids = encode_prompt(pair, TEXT, chat=True)
    ref = reference_greedy(pair.target, ids, 12, pair.vocab_size, set(pair.eos_token_ids))
    for scheme in ("intersection", "string"):
        drafter = pair_drafter(None, pair, scheme=scheme)
        assert isinstance(drafter, CrossTokenizerDrafter) and drafter.scheme == scheme
        trace = speculative_generate(
            ids,
            drafter,
            pair.target,
            gamma=3,
            sampling=Sampling(0.0),
            max_new_tokens=12,
            eos_token_id=pair.eos_token_ids,
            tokenizer=pair.tokenizer,
        )
        assert trace.output_ids == ref, scheme
        assert trace.settings["drafter"]["kind"] == "cross-tokenizer"
    drafted = [d for r in trace.rounds for d in r.drafts]
    assert drafted  # the string scheme drafted something in 12 tokens


def test_a_same_tokenizer_preset_carries_one_tokenizer(standins, monkeypatch):
    name = "SmolLM2-135M-Instruct -> SmolLM2-360M-Instruct"
    hub = FakeHub(monkeypatch)
    hub.add(PRESETS[name].drafter, standins["smollm2"][0])
    hub.add(PRESETS[name].target, standins["smollm2"][1])
    pair = load_pair(name, device="cpu")
    assert not pair.own_tokenizer and pair.drafter_tokenizer is None and default_kind(pair) == "model"
    assert pair_drafter(None, pair).kind == "model"


def test_custom_ids_with_two_tokenizers_load_only_for_the_cross_tokenizer_kind(standins):
    drafter, target = standins["qwen2.5"][0], standins["smollm2"][1]
    with pytest.raises(PairError, match="different tokenizers.*cross-tokenizer drafter kind"):
        load_pair(drafter=drafter, target=target, device="cpu", allow_custom=True)
    pair = load_pair(drafter=drafter, target=target, device="cpu", allow_custom=True, own_tokenizer=True)
    assert pair.own_tokenizer and pair_drafter("cross-tokenizer", pair).shared.size > 0


def test_a_pair_whose_vocabularies_cannot_serve_is_refused_with_the_reason(standins, tmp_path):
    # word-level "w0".. against byte-level BPE: no token shared
    words = save_tiny(tmp_path / "words", WORDS, 32, seed=1)
    with pytest.raises(PairError, match="has its own tokenizer and cannot draft for .*share no token string"):
        load_pair(drafter=words, target=standins["smollm2"][1], device="cpu", allow_custom=True, own_tokenizer=True)
