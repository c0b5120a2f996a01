"""A drafter with another tokenizer (``specviz.drafters.cross_tokenizer``): exact, with two tokenizers
built here (the tokenizers library) and tiny models built from a config.

- Sampled runs: the chi-square harness of tests/test_exactness.py on two word-level vocabularies
  that share 6 of the target's 8 tokens, with the planted fault (q restricted to the shared
  vocabulary but not renormalised) caught at the same threshold.
- Greedy runs: both schemes give the target's own greedy decoding (``generate``), token for token,
  on two byte-level BPE tokenizers trained on different text.
- Bad pairs: no shared tokens, too few (the fraction named), special tokens that differ.
"""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specviz import Sampling, autoregressive_generate, speculative_generate
from specviz.drafters import make_drafter
from specviz.drafters.cross_tokenizer import UNNORMALISED, CrossTokenizerDrafter, CrossTokenizerError, shared_vocabulary
from specviz.lab import ALPHA, PROMPT, VOCAB, chi_square
from specviz.lab.models import tiny_lm
from specviz.trace import Trace
from specviz.views.replay import round_html

# The target's 8 words (ids 0..7, as the harness's VOCAB) and the drafter's 10: "<unk>", a, b, c, e, f shared.
TARGET_WORDS = ["<unk>", "a", "b", "c", "d", "e", "f", "g"]
DRAFTER_WORDS = ["x", "<unk>", "c", "a", "y", "e", "b", "z", "f", "w"]


def word_tokenizer(words: list[str], unk: str = "<unk>") -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk)


def bpe_tokenizer(corpus: list[str], size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


ENGLISH = ["the cat sat on the mat and the dog sat on the log", "a bird in the hand is worth two in the bush"] * 8
CODE = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n", "the cat sat on the mat"] * 8


def tiny_llama(vocab: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def word_pair():
    target = tiny_lm(vocab=VOCAB, layers=2, seed=1, init=0.5)
    drafter = tiny_lm(vocab=len(DRAFTER_WORDS), layers=1, seed=2, init=0.5)
    return drafter, target, word_tokenizer(DRAFTER_WORDS), word_tokenizer(TARGET_WORDS)


@pytest.fixture(scope="module")
def bpe_pair():
    drafter_tok, target_tok = bpe_tokenizer(CODE, 300), bpe_tokenizer(ENGLISH, 330)
    return tiny_llama(len(drafter_tok), 3), tiny_llama(len(target_tok), 4), drafter_tok, target_tok


def test_the_shared_vocabulary_maps_strings_to_both_ids(word_pair):
    _, _, drafter_tok, target_tok = word_pair
    shared = shared_vocabulary(drafter_tok, target_tok)
    pairs = {TARGET_WORDS[t]: DRAFTER_WORDS[d] for d, t in zip(shared.drafter_ids.tolist(), shared.target_ids.tolist())}
    assert pairs == {w: w for w in ("<unk>", "a", "b", "c", "e", "f")}
    assert shared.fraction == 6 / 10  # of the drafter's vocabulary


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.8, top_k=5)])
def test_intersection_keeps_the_targets_distribution(word_pair, sampling):
    drafter, target, drafter_tok, target_tok = word_pair
    cross = CrossTokenizerDrafter(drafter, drafter_tok, target_tok)
    stat, pvalue, acceptance = chi_square(cross, target, sampling, gamma=2)
    print(f"\nintersection {sampling}: chi2={stat:.1f} p={pvalue:.3g} acceptance={acceptance:.3f}")
    assert pvalue > ALPHA
    assert acceptance > 0.05  # the drafts are tested, not all refused


class _OffVocabularyLM(type(tiny_lm())):
    """A tiny GPT-2 drafter that puts most of its mass on the tokens the target lacks (x, y, z, w), so
    the shared vocabulary holds little of q: a planted missing renormalisation inflates q's ratio by
    1 / (shared mass), and the control has power."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits[..., OFF_VOCABULARY] += 2.0
        return out


OFF_VOCABULARY = [DRAFTER_WORDS.index(w) for w in ("x", "y", "z", "w")]


def test_the_unnormalised_q_fault_is_caught(word_pair):
    _, target, drafter_tok, target_tok = word_pair
    base = tiny_lm(vocab=len(DRAFTER_WORDS), layers=1, seed=2, init=0.5)
    drafter = _OffVocabularyLM(base.config).eval()
    drafter.load_state_dict(base.state_dict())
    correct = CrossTokenizerDrafter(drafter, drafter_tok, target_tok)
    stat, pvalue, _ = chi_square(correct, target, Sampling(1.0), gamma=2, runs=FAULT_RUNS)
    print(f"\nthe control's drafter, correct rule: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue > ALPHA
    faulty = CrossTokenizerDrafter(drafter, drafter_tok, target_tok, fault=UNNORMALISED)
    stat, pvalue, _ = chi_square(faulty, target, Sampling(1.0), gamma=2, runs=FAULT_RUNS)
    print(f"\nplanted {UNNORMALISED}: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue < ALPHA


FAULT_RUNS = 1500


def test_intersection_drafts_only_shared_tokens_and_the_trace_keeps_the_shared_mass(word_pair):
    drafter, target, drafter_tok, target_tok = word_pair
    cross = CrossTokenizerDrafter(drafter, drafter_tok, target_tok)
    trace = speculative_generate(PROMPT, cross, target, gamma=3, sampling=Sampling(1.0), max_new_tokens=12, seed=5)
    shared = set(shared_vocabulary(drafter_tok, target_tok).target_ids.tolist())
    drafts = [d for r in trace.rounds for d in r.drafts]
    assert drafts and all(d.token_id in shared for d in drafts)
    # the drafter's own id names the same string; the mass is a probability (the drafter also gives x, y, z, w mass)
    assert all(DRAFTER_WORDS[d.own_token_id] == TARGET_WORDS[d.token_id] for d in drafts)
    assert all(0.0 < d.shared_mass < 1.0 for d in drafts)
    assert trace.settings["drafter"] == {
        "kind": "cross-tokenizer",
        "scheme": "intersection",
        "shared_tokens": 6,
        "shared_fraction": 0.6,
    }
    again = Trace.from_dict(json.loads(json.dumps(trace.to_dict())))
    assert [(d.own_token_id, d.shared_mass) for r in again.rounds for d in r.drafts] == [
        (d.own_token_id, d.shared_mass) for d in drafts
    ]
    html = round_html(trace, 0)
    assert "shared-vocabulary mass" in html and f"drafter&#x27;s id {trace.rounds[0].drafts[0].own_token_id}" in html


def test_a_file_with_a_shared_mass_out_of_range_is_refused(word_pair):
    drafter, target, drafter_tok, target_tok = word_pair
    trace = speculative_generate(
        PROMPT, CrossTokenizerDrafter(drafter, drafter_tok, target_tok), target, gamma=2, max_new_tokens=4, seed=1
    )
    d = trace.to_dict()
    d["rounds"][0]["drafts"][0]["shared_mass"] = 1.5
    with pytest.raises(ValueError, match="shared_mass"):
        Trace.from_dict(d)


@pytest.mark.parametrize("scheme", ["intersection", "string"])
def test_greedy_output_is_the_targets_own_greedy_decoding(bpe_pair, scheme):
    drafter, target, drafter_tok, target_tok = bpe_pair
    cross = make_drafter(
        "cross-tokenizer", drafter, target, drafter_tokenizer=drafter_tok, target_tokenizer=target_tok, scheme=scheme
    )
    drafted = 0
    for text in ("the cat sat on", "def add(a, b):\n", "for i in"):
        ids = target_tok.encode(text)
        trace = speculative_generate(
            ids, cross, target, gamma=4, sampling=Sampling(0.0), max_new_tokens=24, eos_token_id=0
        )
        ref = target.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=24,
            eos_token_id=0,
            pad_token_id=0,
        )
        assert trace.output_ids == ref[0, len(ids) :].tolist()
        drafted += trace.drafted
    assert drafted > 0


def test_no_shared_tokens_is_refused():
    with pytest.raises(CrossTokenizerError, match="share no token string"):
        shared_vocabulary(word_tokenizer(["<unk>", "p", "q"]), word_tokenizer(["[UNK]", "r", "s"], unk="[UNK]"))


def test_a_small_shared_vocabulary_is_refused_with_its_fraction():
    drafter = word_tokenizer(["<unk>"] + [f"t{i}" for i in range(39)])
    with pytest.raises(CrossTokenizerError, match=r"share 1 of the drafter's 40 tokens \(2\.5%\), below the 10%"):
        shared_vocabulary(drafter, word_tokenizer(["<unk>", "a", "b"]))


def test_differing_special_tokens_are_refused():
    drafter = word_tokenizer(["<unk>", "a", "b", "</s>"])
    drafter.add_special_tokens({"eos_token": "</s>"})
    with pytest.raises(CrossTokenizerError, match="special tokens differ: '</s>'"):
        shared_vocabulary(drafter, word_tokenizer(["<unk>", "a", "b", "</s>"]))


def test_an_unknown_scheme_or_fault_is_refused(word_pair):
    drafter, _, drafter_tok, target_tok = word_pair
    with pytest.raises(ValueError, match="scheme must be one of intersection, string"):
        CrossTokenizerDrafter(drafter, drafter_tok, target_tok, scheme="bytes")
    with pytest.raises(ValueError, match="fault must be"):
        CrossTokenizerDrafter(drafter, drafter_tok, target_tok, fault="loud")


def test_compare_drafters_shows_the_shared_vocabulary_mass(word_pair):
    from specviz.measure.comparison import Comparison
    from specviz.views.compare import compare_html

    drafter, target, drafter_tok, target_tok = word_pair
    spec = speculative_generate(
        PROMPT, CrossTokenizerDrafter(drafter, drafter_tok, target_tok), target, gamma=3, max_new_tokens=8, seed=2
    )
    base = autoregressive_generate(PROMPT, target, max_new_tokens=8, seed=2)
    masses = [d.shared_mass for r in spec.rounds for d in r.drafts]
    html = compare_html(Comparison(runs={"cross-tokenizer": (spec, base)}, kinds=("cross-tokenizer",)))
    assert (
        "shared-vocabulary mass" in html
        and f"{sum(masses) / len(masses):.3f}" in html
        and f"mean over {len(masses)} drafts" in html
    )


def test_the_bench_runs_ours_beside_transformers_assistant_tokenizer_path():
    from specviz.measure.cross_bench import cross_bench, table

    drafter_tok, target_tok = bpe_tokenizer(CODE, 300), bpe_tokenizer(ENGLISH, 330)
    drafter, target = tiny_llama(len(drafter_tok), 5), tiny_llama(len(target_tok), 6)
    rows = cross_bench(
        drafter, drafter_tok, target, target_tok, ["the cat sat", "def add(a, b):"], new_tokens=6, gamma=3
    )
    methods = [(r.setting, r.method) for r in rows]
    assert methods == [
        ("greedy", "ours: autoregressive"),
        ("greedy", "ours: intersection"),
        ("greedy", "ours: string"),
        ("greedy", "transformers: plain"),
        ("greedy", "transformers: assistant_tokenizer"),
        ("sampled", "ours: autoregressive"),
        ("sampled", "ours: intersection"),
        ("sampled", "transformers: plain"),
        ("sampled", "transformers: assistant_tokenizer"),
    ]
    assert all(r.tokens == 12 for r in rows)  # 6 new tokens on each of the 2 prompts, no EOS stop
    ours = [r for r in rows if r.method == "ours: intersection"]
    assert all(r.alpha is not None and 0 <= r.alpha <= 1 and r.c is not None for r in ours)
    assert "vs hf assist" in table(rows)
    # transformers' sampled path prunes its assistant's output layer in place: the bench gave it a copy
    assert drafter.get_output_embeddings().weight.shape[0] == len(drafter_tok)
    # bench's report: each row with both speedups, and the header naming the pair and the sampled setting
    from types import SimpleNamespace

    from specviz.measure.cross_bench import format_report, report

    pair = SimpleNamespace(
        name="tiny",
        drafter_id="d",
        target_id="t",
        device=torch.device("cpu"),
        drafter_tokenizer=drafter_tok,
        tokenizer=target_tok,
    )
    rep = report(pair, rows, 3, 6, Sampling(1.0), "held-out")
    assert all(
        {"alpha", "c", "v", "speedup_vs_our_autoregressive", "speedup_vs_hf_assistant_tokenizer"} <= set(r)
        for r in rep["rows"]
    )
    ar = [r for r in rep["rows"] if r["method"] == "ours: autoregressive"]
    assert all(r["speedup_vs_our_autoregressive"] == pytest.approx(1.0) for r in ar)
    text = format_report(rep)
    assert (
        text.startswith(f"tiny: drafter d ({len(drafter_tok)} tokens) -> target t ({len(target_tok)} tokens)")
        and "temperature 1.0" in text
    )
    json.dumps({k: v for k, v in rep.items() if k != "_rows"})  # --json prints it


def test_the_bench_runs_on_routed_models_and_gives_transformers_an_unrouted_copy_of_the_drafter(tmp_path, monkeypatch):
    """Where fp32 products are routed (``specviz.pair.kernels``; oneDNN's reordered weights cannot be
    deep-copied), transformers' assistant_tokenizer rows get a copy of the drafter with transformers'
    own products, and our rows keep the routed drafter."""
    from types import SimpleNamespace

    from specviz.measure.bench import hf_counterpart
    from specviz.measure.cross_bench import cross_bench
    from specviz.pair import kernels

    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    route = "onednn" if kernels._onednn_available() else "w_xt"
    drafter_tok, target_tok = bpe_tokenizer(CODE, 300), bpe_tokenizer(ENGLISH, 330)
    drafter, target = tiny_llama(len(drafter_tok), 5), tiny_llama(len(target_tok), 6)
    for model in (drafter, target):
        kernels.choose(model, force=route)
    rows = cross_bench(drafter, drafter_tok, target, target_tok, ["def add(a, b):"], new_tokens=4, gamma=3)
    assert len(rows) == 9 and all(r.tokens == 4 for r in rows)
    routed = [m for m in drafter.modules() if type(m) is torch.nn.Linear]
    assert all(m.specviz_choice.route(5) == route for m in routed)  # still routed: our rows run these products
    assert all((getattr(m, "specviz_packed", None) is not None) == (route == "onednn") for m in routed)
    # bench's counterpart for the cross-tokenizer kind copies the drafter the same way
    pair = SimpleNamespace(drafter=drafter, target=target, tokenizer=target_tok, drafter_tokenizer=drafter_tok)
    assistant = hf_counterpart("cross-tokenizer", "constant", pair, 3)[1]["assistant_model"]
    copies = [m for m in assistant.modules() if type(m) is torch.nn.Linear]
    assert len(copies) == len(routed)
    assert not any("forward" in vars(m) or hasattr(m, "specviz_choice") or hasattr(m, "specviz_packed") for m in copies)
    assert all(a is not b and torch.equal(a, b) for a, b in zip(assistant.parameters(), drafter.parameters()))
    x = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        torch.testing.assert_close(assistant(x).logits, drafter(x).logits, rtol=1e-4, atol=1e-5)


def test_bench_takes_the_cross_tokenizer_path_for_such_a_kind_or_pair():
    from specviz.cli import build_parser, cross_tokenizer_bench

    parse = build_parser().parse_args
    assert cross_tokenizer_bench(parse(["bench", "--pair", "cross"]))
    assert cross_tokenizer_bench(parse(["bench", "--pair", "embedded", "--drafter-kind", "cross-tokenizer"]))
    assert not cross_tokenizer_bench(parse(["bench", "--pair", "cross", "--drafter-kind", "ngram"]))
    assert not cross_tokenizer_bench(parse(["bench", "--pair", "embedded"]))


def test_a_repetition_penalty_reads_each_sides_own_context(word_pair):
    drafter, target, drafter_tok, target_tok = word_pair
    trace = speculative_generate(
        PROMPT,
        CrossTokenizerDrafter(drafter, drafter_tok, target_tok),
        target,
        gamma=3,
        sampling=Sampling(1.0, repetition_penalty=1.3),
        max_new_tokens=10,
        seed=3,
    )
    assert len(trace.output_ids) == 10 and all(d.shared_mass is not None for r in trace.rounds for d in r.drafts)
