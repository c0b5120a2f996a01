"""The run's vocabulary comes from the target, not from the narrowest output layer: a drafter whose
head (named ``lm_head``, as transformers names it) scores only the first tokens gets q = 0 past its
head, and the target's tokens there stay reachable with the target's mass."""

import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from specviz import Sampling, speculative_generate
from specviz.engine.rounds import _vocab_size
from specviz.engine.runner import widen

VOCAB, HEAD = 12, 6


def _tiny(seed: int):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


def _truncated_drafter():
    model = _tiny(1)
    head = torch.nn.Linear(16, HEAD, bias=False)
    head.weight.data = model.lm_head.weight.data[:HEAD].clone()
    model.lm_head = head  # a narrower head under transformers' usual name
    return model


def test_width_is_the_target_s():
    assert _vocab_size((_truncated_drafter(), _tiny(0)), None, None) == VOCAB


def test_widen_pads_with_zero_probability():
    logits = torch.zeros(2, HEAD)
    q = torch.softmax(widen(logits, VOCAB), dim=-1)
    assert q.shape == (2, VOCAB) and torch.all(q[:, HEAD:] == 0) and torch.allclose(q.sum(-1), torch.ones(2))


def test_high_ids_reachable_with_the_target_s_mass():
    """First token of 400 runs against the target's own p at that position: chi-square p > 1e-4
    (a planted control: the old cut to the head's width puts no mass on ids >= HEAD)."""
    target, drafter = _tiny(0), _truncated_drafter()
    prompt = [1, 2, 3]
    sampling = Sampling(temperature=1.0)
    with torch.no_grad():
        p = torch.softmax(target(torch.tensor([prompt])).logits[0, -1].double(), dim=-1).numpy()
    high_mass = p[HEAD:].sum()
    assert high_mass > 0.2  # the test means something only if the target wants high ids
    runs = 400
    counts = [0] * VOCAB
    for seed in range(runs):
        trace = speculative_generate(prompt, drafter, target, gamma=2, sampling=sampling, max_new_tokens=1, seed=seed)
        counts[trace.output_ids[0]] += 1
    assert sum(counts[HEAD:]) > 0
    assert chisquare(counts, p * runs).pvalue > 1e-4
    # Control: the law of a run cut to the head (the old behaviour) is refused by the same test.
    cut = [*p[:HEAD], *([1e-6] * (VOCAB - HEAD))]
    cut = [x / sum(cut) * runs for x in cut]
    assert chisquare(counts, cut).pvalue < 1e-4
