"""Every hub preset's family, offline: stand-in pairs (tests/families.py) down the path a visitor's pair takes.

Each stand-in drafter and target is loaded by ``load_pair`` from its folder (a custom id), its prompt
is encoded with the chat template on and off, and then:

- greedy speculative decoding equals the target's own greedy decoding, computed here without a KV
  cache and with the logits cut to the tokenizer's size: exactly in fp32; in bf16 either exactly or
  up to a first divergence that the logits show is a near-tie;
- the reply stops at each of the family's end-of-turn tokens (the tokenizer's EOS and the target's
  generation config's), whether the token comes as a correction, an accepted draft or a bonus;
- padded embedding rows (Qwen2.5) are never emitted, even when they would win;
- a small-vocabulary variant of each family keeps the target's two-token law (chi-square), with
  planted-fault controls at the same sample size;
- the demo's generate handler, driven through gradio_client, runs each preset name with the model
  hub's answers served from the stand-ins.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specviz import Sampling, autoregressive_generate, speculative_generate

from specviz.engine import rejection
from specviz import pair as pairs
from specviz.pair import PairError, encode_prompt, load_pair
from tests.conftest import download_index
from tests.families import FAMILIES, SMALL_WORDS, end_of_turn_ids, save_pair
from tests.test_exactness import ALPHA, PROMPT, VOCAB

assert SMALL_WORDS == VOCAB

TEXT = "What is speculative decoding? def add(a, b):"
NEW_TOKENS = 24
STAT_RUNS = 500  # per family: the statistical check's sample size (and its controls')
STAT_GAMMA = 2


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """Family name -> (drafter folder, target folder), built once per module."""
    root = tmp_path_factory.mktemp("standins")
    return {name: save_pair(f, root / name) for name, f in FAMILIES.items()}


@pytest.fixture(scope="module")
def small_standins(tmp_path_factory) -> dict[str, tuple[str, str]]:
    root = tmp_path_factory.mktemp("small-standins")
    return {name: save_pair(f, root / name, small=True) for name, f in FAMILIES.items()}


@pytest.fixture(autouse=True)
def resident(monkeypatch):
    """Room for every stand-in at once, so a module's tests load each pair once; nothing stays after the module."""
    monkeypatch.setenv(pairs.RESIDENT_PAIRS_ENV, "16")
    yield


@pytest.fixture(scope="module", autouse=True)
def unload_after_module():
    yield
    pairs.unload_all()


def load(folders: tuple[str, str], device="cpu"):
    return load_pair(drafter=folders[0], target=folders[1], device=device, allow_custom=True)


def reference_greedy(model, ids: list[int], n: int, vocab: int, eos=()) -> list[int]:
    """The target's own greedy decoding: the whole sequence re-fed each step (no cache), logits cut to ``vocab``."""
    seq, out = list(ids), []
    with torch.inference_mode():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([seq], device=model.device), use_cache=False).logits[0, -1, :vocab]
            token = int(logits.argmax())
            out.append(token)
            seq.append(token)
            if token in eos:
                break
    return out


def last_logits(model, ids: list[int], vocab: int) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids], device=model.device), use_cache=False).logits[0, -1, :vocab].float()


def prompt_ids(pair, family, chat: bool) -> list[int]:
    if chat and not family.instruct:
        with pytest.raises(PairError, match="has no chat template"):
            encode_prompt(pair, TEXT, chat=True)
        pytest.skip(f"{family.name} has no chat template (refused with a message, checked above)")
    ids = encode_prompt(pair, TEXT, chat=chat)
    specials = [t for t in pair.tokenizer.convert_ids_to_tokens(ids) if t in family.first + family.last]
    assert bool(specials) == chat  # the template's special tokens are single tokens; plain text has none
    return ids


def bf16(model):
    """A bf16 copy (load_pair gives bf16 on CUDA only; on the CPU the tests make their own)."""
    return copy.deepcopy(model).to(torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# What each family's stand-in is


@pytest.mark.parametrize("name", FAMILIES)
def test_the_stand_ins_have_their_familys_layout(standins, name):
    family = FAMILIES[name]
    pair = load(standins[name])
    assert type(pair.target) is family.model_class and type(pair.drafter) is family.model_class
    assert pair.instruct == family.instruct and pair.device.type == "cpu" and pair.target.dtype == torch.float32
    assert pair.eos_token_ids == end_of_turn_ids(family, pair.tokenizer)
    rows = [m.get_output_embeddings().weight.shape[0] for m in (pair.drafter, pair.target)]
    assert rows == [len(pair.tokenizer) + e for e in family.extra_rows]
    for model, published in zip((pair.drafter, pair.target), family.published):
        tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
        assert tied == published["tie_word_embeddings"]
        config = model.config
        if name == "gpt2":
            continue
        assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention
        assert config.rope_parameters["rope_theta"] == published["rope_theta"]
        if published["rope_scaling"]:
            assert config.rope_parameters["rope_type"] == "llama3"
            assert {k: config.rope_parameters[k] for k in published["rope_scaling"]} == published["rope_scaling"]
    if name == "qwen2.5":
        assert len(pair.tokenizer) < rows[0] < rows[1]  # as 151,665 < 151,936 < 152,064


# ---------------------------------------------------------------------------------------------
# Greedy: the target's own output


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "plain"])
@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_is_the_targets_own_greedy_in_fp32(standins, name, chat):
    family = FAMILIES[name]
    pair = load(standins[name])
    ids = prompt_ids(pair, family, chat)
    spec = speculative_generate(
        ids,
        pair.drafter,
        pair.target,
        gamma=4,
        sampling=Sampling(0.0),
        max_new_tokens=NEW_TOKENS,
        eos_token_id=pair.eos_token_ids,
        tokenizer=pair.tokenizer,
    )
    ref = reference_greedy(pair.target, ids, NEW_TOKENS, len(pair.tokenizer), set(pair.eos_token_ids))
    assert spec.output_ids == ref
    assert spec.drafted > 0 and spec.output_text == pair.tokenizer.decode(ref)


def first_divergence(target, ids: list[int], spec_ids: list[int], ref_ids: list[int], vocab: int):
    """None when the outputs are equal; else (index, gap, error) at the first token where they part.

    gap: how far apart the two tokens' logits are, computed in fp32 from the same (bf16) weights;
    error: the largest difference between ``target``'s own logits there and those fp32 ones.
    """
    if spec_ids == ref_ids:
        return None
    i = next((k for k, (a, b) in enumerate(zip(spec_ids, ref_ids)) if a != b), min(len(spec_ids), len(ref_ids)))
    assert i < min(len(spec_ids), len(ref_ids)), "one output stops early without a different token"
    context = ids + ref_ids[:i]
    own = last_logits(target, context, vocab)
    in_fp32 = last_logits(copy.deepcopy(target).float(), context, vocab)
    error = float((own - in_fp32).abs().max())
    gap = abs(float(in_fp32[ref_ids[i]] - in_fp32[spec_ids[i]]))
    return i, gap, error


def greedy_in_bf16(pair, ids: list[int]):
    """(speculative ids, cache-free greedy ids, first_divergence) with bf16 copies of the pair's models."""
    drafter, target = bf16(pair.drafter), bf16(pair.target)
    vocab, eos = len(pair.tokenizer), set(pair.eos_token_ids)
    spec = speculative_generate(
        ids,
        drafter,
        target,
        gamma=4,
        sampling=Sampling(0.0),
        max_new_tokens=NEW_TOKENS,
        eos_token_id=pair.eos_token_ids,
        tokenizer=pair.tokenizer,
    )
    assert spec.settings["dtype"] == "bfloat16"
    ref = reference_greedy(target, ids, NEW_TOKENS, vocab, eos)
    return spec.output_ids, ref, first_divergence(target, ids, spec.output_ids, ref, vocab)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "plain"])
@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_in_bf16_is_the_targets_or_parts_at_a_near_tie(standins, name, chat):
    """bf16 rounds differently for a one-token pass and a verify pass of gamma + 1 tokens, so greedy
    equality can fail where two logits are closer than bf16's error. The test allows exactly that:
    at the first divergence, the two tokens' logits (computed in fp32 from the same bf16 weights)
    differ by at most 4 times the largest difference between the bf16 and fp32 logits there (each
    of the two runs may err by that much on each of the two logits). On the CPU where these tests
    were written, every case was equal token for token."""
    family = FAMILIES[name]
    pair = load(standins[name])
    _, _, parted = greedy_in_bf16(pair, prompt_ids(pair, family, chat))
    if parted is not None:
        i, gap, error = parted
        print(
            f"\n{name} chat={chat}: bf16 parts from the cache-free greedy at token {i}: gap {gap:.4f}, bf16 error "
            f"{error:.4f}"
        )
        assert gap <= 4 * error, f"token {i} is not a near-tie: logits {gap:.4f} apart, bf16 error {error:.4f}"


def test_the_near_tie_criterion_refuses_a_real_difference(standins):
    """Control: a divergence planted at a clear choice (the least likely token instead of the greedy one) fails it."""
    pair = load(standins["llama3.2"])
    ids = encode_prompt(pair, TEXT, chat=True)
    target, vocab = bf16(pair.target), len(pair.tokenizer)
    ref = reference_greedy(target, ids, 6, vocab)
    wrong = ref[:3] + [int(last_logits(target, ids + ref[:3], vocab).argmin())] + ref[4:]
    i, gap, error = first_divergence(target, ids, wrong, ref, vocab)
    assert i == 3 and gap > 4 * error


# ---------------------------------------------------------------------------------------------
# Stopping at the end of a turn


@contextmanager
def raised_from(model, token: int, index: int, by: float = 1e4):
    """Raise ``token``'s logit by ``by`` wherever the model predicts sequence position >= ``index``.

    The stand-ins' random weights never choose an end-of-turn token on their own; this makes
    them choose it at a known place. Works with and without the KV cache.
    """
    real = model.forward

    def forward(*args, **kwargs):
        cache = kwargs.get("past_key_values")
        past = cache.get_seq_length() if cache is not None else 0
        length = kwargs["input_ids"].shape[1]
        out = real(*args, **kwargs)
        rows = out.logits.shape[1]
        for j in range(rows):  # row j predicts position past + length - rows + j + 1
            if past + length - rows + j + 1 >= index:
                out.logits[0, j, token] += by
        return out

    model.forward = forward
    try:
        yield
    finally:
        del model.forward


@pytest.mark.parametrize("name", FAMILIES)
def test_each_end_of_turn_token_ends_the_reply(standins, name):
    family = FAMILIES[name]
    pair = load(standins[name])
    ids = encode_prompt(pair, TEXT, chat=family.instruct)
    at = len(ids) + 3  # the fourth new token
    assert len(pair.eos_token_ids) == len(set(family.end_of_turn) | {pair.tokenizer.eos_token})
    for stop in pair.eos_token_ids:
        # In the target alone, the stop token comes as a correction; raised in both, as an accepted draft
        # (greedy) or a bonus token.
        for where in ("target", "both"):
            models = [pair.target] + ([pair.drafter] if where == "both" else [])
            with raised_from(models[0], stop, at), raised_from(models[1], stop, at) if len(models) > 1 else _nothing():
                for sampling in (Sampling(0.0), Sampling(1.0)):
                    kw = dict(
                        sampling=sampling,
                        max_new_tokens=12,
                        eos_token_id=pair.eos_token_ids,
                        tokenizer=pair.tokenizer,
                        seed=1,
                    )
                    spec = speculative_generate(ids, pair.drafter, pair.target, gamma=4, **kw)
                    base = autoregressive_generate(ids, pair.target, **kw)
                    for trace in (spec, base):
                        assert trace.stop_reason == "eos", (where, sampling)
                        assert trace.output_ids[-1] in pair.eos_token_ids and len(trace.output_ids) <= 4
                    if sampling.greedy:
                        assert spec.output_ids == base.output_ids and spec.output_ids[-1] == stop
                        assert spec.output_ids == reference_greedy(
                            pair.target, ids, 12, len(pair.tokenizer), set(pair.eos_token_ids)
                        )
                        came = (
                            spec.rounds[-1].final_kind if spec.rounds[-1].final_token_id == stop else "accepted draft"
                        )
                        assert came in (("correction",) if where == "target" else ("accepted draft", "bonus")), (
                            where,
                            came,
                        )


@contextmanager
def _nothing():
    yield


def test_padded_embedding_rows_are_never_emitted_even_when_they_would_win(standins):
    """Qwen2.5's tables carry rows beyond the tokenizer (151,936 and 152,064 for 151,665 tokens)."""
    pair = load(standins["qwen2.5"])
    vocab = len(pair.tokenizer)
    padded = vocab + 3  # a row both tables have
    ids = encode_prompt(pair, TEXT, chat=True)
    with raised_from(pair.target, padded, 0), raised_from(pair.drafter, padded, 0):
        assert int(last_logits(pair.target, ids, vocab + 40).argmax()) == padded  # uncut, the padded row would win
        greedy = speculative_generate(
            ids,
            pair.drafter,
            pair.target,
            gamma=4,
            sampling=Sampling(0.0),
            max_new_tokens=NEW_TOKENS,
            eos_token_id=pair.eos_token_ids,
            tokenizer=pair.tokenizer,
        )
        assert greedy.output_ids == reference_greedy(pair.target, ids, NEW_TOKENS, vocab, set(pair.eos_token_ids))
        sampled = speculative_generate(
            ids,
            pair.drafter,
            pair.target,
            gamma=4,
            sampling=Sampling(1.5),
            max_new_tokens=64,
            tokenizer=pair.tokenizer,
            seed=0,
        )
        assert len(sampled.output_ids) == 64 and max(sampled.output_ids) < vocab


# ---------------------------------------------------------------------------------------------
# The statistical check on small-vocabulary variants


def two_token_law(target, sampling: Sampling, vocab: int) -> np.ndarray:
    """P(x1, x2 | PROMPT) under the target's processed p, logits cut to ``vocab``; shape (vocab * vocab,)."""
    device = target.device
    with torch.inference_mode():
        p1 = sampling.probs(target(input_ids=torch.tensor([PROMPT], device=device)).logits[0, -1:, :vocab].float())[0]
        batch = torch.tensor([PROMPT + [x] for x in range(vocab)], device=device)
        p2 = sampling.probs(target(input_ids=batch).logits[:, -1, :vocab].float())
    return (p1[:, None] * p2).double().cpu().numpy().ravel()


def family_chi_square(
    pair, sampling: Sampling, gamma: int = STAT_GAMMA, runs: int = STAT_RUNS, vocab_size: int | None = None
):
    """(p-value, acceptance rate, tokens outside the tokenizer) of the first two tokens of ``runs`` seeded runs.

    As tests.test_exactness.chi_square (Pearson's test, cells expected under 5 pooled), for a pair
    whose tables may be larger than its tokenizer: the engine gets the tokenizer (or ``vocab_size``,
    for a control), and a token outside the tokenizer is a cell the law gives 0, so p = 0.
    """
    vocab = len(pair.tokenizer)
    exact = two_token_law(pair.target, sampling, vocab)
    counts = np.zeros(vocab * vocab)
    outside = accepted = drafted = 0
    engine = dict(vocab_size=vocab_size) if vocab_size else dict(tokenizer=pair.tokenizer)
    for seed in range(runs):
        trace = speculative_generate(
            PROMPT,
            pair.drafter,
            pair.target,
            gamma=gamma,
            sampling=sampling,
            max_new_tokens=gamma + 1,
            seed=seed,
            **engine,
        )
        x1, x2 = trace.output_ids[:2]
        if max(x1, x2) >= vocab:
            outside += 1
        else:
            counts[x1 * vocab + x2] += 1
        accepted += trace.accepted
        drafted += trace.drafted
    if outside:
        return 0.0, accepted / drafted, outside
    expected = exact * runs
    big = expected >= 5
    assert big.sum() >= 8, "a near-deterministic target leaves the test without power"
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    wanted = wanted * observed.sum() / wanted.sum()
    return float(chisquare(observed, wanted).pvalue), accepted / drafted, 0


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_small_vocabulary_variant_keeps_the_targets_law(small_standins, name):
    """Significance ALPHA (tests.test_exactness) per family; the controls below use the same size."""
    pair = load(small_standins[name])
    assert len(pair.tokenizer) == VOCAB
    pvalue, acceptance, outside = family_chi_square(pair, Sampling(1.0))
    print(f"\n{name}: p={pvalue:.3g} acceptance={acceptance:.2f} runs={STAT_RUNS}")
    assert outside == 0 and pvalue > ALPHA
    assert 0.1 < acceptance < 0.9  # both verdicts exercised


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["logits-not-cut", "residual-is-p"])
def test_planted_faults_are_caught_at_the_same_size(small_standins, monkeypatch, fault):
    """Controls: logits not cut to the tokenizer (Qwen2.5's padded rows sampled), and the correction
    drawn from p instead of norm(max(0, p - q)), on the Qwen2.5 variant: both rejected."""
    pair = load(small_standins["qwen2.5"])
    if fault == "residual-is-p":
        monkeypatch.setattr(rejection.EXACT, "residual", lambda p, q: p)
        pvalue, _, _ = family_chi_square(pair, Sampling(1.0))
    else:
        rows = min(m.get_output_embeddings().weight.shape[0] for m in (pair.drafter, pair.target))
        pvalue, _, outside = family_chi_square(pair, Sampling(1.0), vocab_size=rows)
        assert outside > 0
    print(f"\nplanted {fault}: p={pvalue:.3g}")
    assert pvalue < ALPHA


# ---------------------------------------------------------------------------------------------
# The demo's handler


@pytest.fixture(scope="module")
def demo_client():
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    # A GPU machine without a package index may lack the web stack: the demo's test is skipped there, named
    Client = pytest.importorskip("gradio_client").Client

    from specviz.demo import build_demo, launch_kwargs
    from tests.conftest import free_port

    demo = build_demo(preload=False)
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, **launch_kwargs(free_port()))
    try:
        yield Client(url, verbose=False)
    finally:
        demo.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_the_demo_runs_each_preset_on_its_stand_in(standins, demo_client, monkeypatch, name):
    """The visitor's path: the preset picked from the menu, the hub's answers and downloads served from
    the stand-in's folders (tests.test_pair.FakeHub), greedy, the chat template on for instruct pairs."""
    import huggingface_hub

    from specviz.pair import PRESETS
    from specviz.recording import Recording
    from tests.test_pair import FakeHub

    family = FAMILIES[name]
    preset = PRESETS[family.preset]
    hub = FakeHub(monkeypatch)
    hub.add(preset.drafter, standins[name][0])
    hub.add(preset.target, standins[name][1])
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")  # the gated Llama preset asks for a token
    for chat in [True, False] if family.instruct else [False]:
        args = (family.preset, TEXT, 4, 0.0, 0, 1.0, 16, 0, chat, "", "")
        out = demo_client.predict(*args, api_name="/generate")
        tokens, stats, status = out[0], out[1], out[4]
        assert status.startswith("Done") and f"Pair: {family.preset}, on cpu" in status, status
        assert "sv-" in tokens and "acceptance rate" in stats
        pair = pairs.loaded_pair(family.preset, device="cpu")
        ids = encode_prompt(pair, TEXT, chat=chat)
        ref = reference_greedy(pair.target, ids, 16, len(pair.tokenizer), set(pair.eos_token_ids))
        # the run's download: token ids, not text re-decoded token by token
        rec = Recording.load(out[download_index()]["value"])
        assert rec.speculative.prompt_ids == ids
        assert rec.speculative.output_ids == ref and rec.baseline.output_ids == ref
    assert [c[1] for c in hub.loads("model")] == [preset.drafter, preset.target]  # loaded once
