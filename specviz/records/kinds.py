"""The drafter kinds a trace can name (its settings' drafter kind): their names, their labels and one line each.

The code of each kind is in ``specviz.drafters`` (which re-exports these); the views label runs and sweeps by them.
"""

KINDS = ("model", "argmax", "ngram", "early-exit", "quantized", "eagle", "cross-tokenizer")
LABELS = {
    "model": "drafter model",
    "argmax": "drafter model, its argmax",
    "ngram": "prompt lookup",
    "early-exit": "early exit",
    "quantized": "quantized target (int8)",
    "eagle": "EAGLE head (reads the target's features)",
    "cross-tokenizer": "drafter model with its own tokenizer",
}
# One line each, with its source, for the drafter menu's help.
DESCRIPTIONS = {
    "model": "a smaller model of the same tokenizer drafts each token (Leviathan et al. 2023; Chen et al. 2023)",
    "argmax": "the drafter model proposes its most likely token instead of a draw from q: q is one-hot, so a draft d "
              "is "
    "kept with probability p(d) and a rejected one replaced from p without d (exact; no draw, no warpers)",
    "ngram": "copies what followed the last n-gram earlier in the prompt and output (prompt lookup decoding)",
    "early-exit": "the target's own first layers and its output layer (LayerSkip, Elhoushi et al. 2024)",
    "quantized": "the target itself with int8 weights (self-speculation)",
    "eagle": "one decoder layer fed the target's own hidden states and the next token (EAGLE, Li et al. 2024)",
    "cross-tokenizer": "a smaller model with another tokenizer, its q kept on the tokens both vocabularies share "
                       "(Timor et al. 2025)",
}
