"""A token tree's drafter passes are counted where they happen: one pass at the root and one
masked pass per expanded depth, not one per drafted node, so the trace's c is the tree's."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specviz import Sampling
from specviz.engine.tree.loop import tree_generate
from specviz.engine.tree.spec import TreeSpec


def _tiny(seed: int):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def test_static_tree_counts_one_pass_per_depth():
    """Tree 3-2-2-1 (depth 4): the root pass, then a masked pass for depths 1, 2 and 3 = 4 passes a
    round while the tree has 3 + 6 + 12 + 12 = 33 nodes; the trace sums the rounds' passes."""
    target, drafter = _tiny(0), _tiny(1)
    trace = tree_generate([1, 2, 3, 4], drafter, target, TreeSpec.static((3, 2, 2, 1)), sampling=Sampling(1.0),
                          max_new_tokens=40, seed=0)
    full = [r for r in trace.rounds if r.tree.depth == 4]
    assert full, "no round drafted the whole tree"
    for r in full:
        assert r.tree.drafter_passes == 4
        assert len(r.tree.nodes) == 33
    assert trace.drafter_forward_passes == sum(r.tree.drafter_passes for r in trace.rounds)
    assert trace.drafter_forward_passes < trace.drafted


def test_prompt_lookup_tree_has_no_passes():
    from specviz.drafters import PromptLookupDrafter

    target = _tiny(0)
    trace = tree_generate([5, 6, 7, 5, 6, 7, 5, 6], PromptLookupDrafter(2), target, TreeSpec.static((3, 1, 1)),
                          sampling=Sampling(1.0), max_new_tokens=6)
    assert trace.drafter_forward_passes == 0
