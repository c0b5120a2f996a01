"""Loading pairs: the same code path for folders and hub ids, and clear errors for bad pairs."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specviz import Sampling, speculative_generate
from specviz.pair import PairError, load_pair, resolve
from tests.conftest import tiny_lm


def save_tiny(folder, words: list[str], vocab: int, seed: int, layers: int = 1):
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[1]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=words[0], unk_token=words[1])
    tiny_lm(vocab=vocab, layers=layers, seed=seed, init=0.3).save_pretrained(folder)
    fast.save_pretrained(folder)
    return str(folder)


WORDS = ["<eos>", "<unk>"] + [f"w{i}" for i in range(30)]


def test_local_folders_load_and_generate(tmp_path):
    d = save_tiny(tmp_path / "d", WORDS, 32, seed=1)
    t = save_tiny(tmp_path / "t", WORDS, 40, seed=2, layers=2)  # padded embedding table
    pair = load_pair(drafter=d, target=t, device="cpu")
    assert pair.vocab_size == 32
    ids = pair.tokenizer("w1 w2 w3", add_special_tokens=False)["input_ids"]
    trace = speculative_generate(ids, pair.drafter, pair.target, gamma=3, sampling=Sampling(1.0), max_new_tokens=20, tokenizer=pair.tokenizer)
    assert all(t < 32 for t in trace.output_ids)
    assert trace.output_text == pair.tokenizer.decode(trace.output_ids)


def test_different_tokenizers_are_refused_naming_both(tmp_path):
    d = save_tiny(tmp_path / "d", WORDS, 32, seed=1)
    t = save_tiny(tmp_path / "t", WORDS[:2] + [f"v{i}" for i in range(30)], 32, seed=2)
    with pytest.raises(PairError, match=r"drafter '.*d' and the target '.*t' use different tokenizers"):
        load_pair(drafter=d, target=t, device="cpu")


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(PairError, match="cannot be reached|not found|could not be loaded"):
        load_pair(drafter="specviz-tests/no-such-model", target=str(tmp_path), device="cpu")


def test_unknown_preset_and_half_a_pair():
    with pytest.raises(PairError, match="unknown pair"):
        resolve("no such pair")
    with pytest.raises(PairError, match="both a drafter and a target"):
        resolve(drafter="x")


def test_hub_errors_become_messages():
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError

    from specviz.pair import _explain

    # huggingface_hub's own exception types, as its download code raises them (the HTTP response is not needed here).
    gated = GatedRepoError.__new__(GatedRepoError)
    Exception.__init__(gated, "401 Client Error: access to model is restricted")
    message = str(_explain("meta-llama/Llama-3.2-1B", gated))
    assert "gated" in message and "HF_TOKEN" in message
    assert "cannot be reached" in str(_explain("x/y", LocalEntryNotFoundError("offline")))
    assert "memory" in str(_explain("x/y", MemoryError()))
