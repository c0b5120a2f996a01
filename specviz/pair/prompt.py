"""Prompts as token ids, with or without the pair's chat template."""

from __future__ import annotations

from specviz.pair.errors import PairError
from specviz.pair.loading import Pair


def encode_prompt(pair: Pair, prompt: str, chat: bool | None = None) -> list[int]:
    """The prompt's token ids, wrapped in the chat template for an instruct pair.

    Args:
        chat: True applies the tokenizer's chat template (one user turn, then the assistant's
            turn opened); False encodes the text as it is; None does what suits the pair
            (the template for instruct pairs).

    Raises:
        PairError: the template was asked for and the tokenizer has none.
    """
    tok = pair.tokenizer
    if chat is None:
        chat = pair.instruct
    if not chat:
        return tok(prompt, add_special_tokens=False)["input_ids"]
    if not getattr(tok, "chat_template", None):
        raise PairError(f"'{pair.name}' has no chat template; turn the chat template off to send the text as it is")
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    # The template writes the special tokens (BOS included) itself.
    return tok(text, add_special_tokens=False)["input_ids"]


def split_prompts(text: str) -> list[str]:
    """Prompts written one per non-empty line, ``\\n`` in a line standing for a newline (the
    Batch tab's box and ``generate --prompts-file``)."""
    return [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]


def join_prompts(prompts: list[str]) -> str:
    """The inverse of ``split_prompts``: one prompt per line, newlines written as ``\\n``."""
    return "\n".join(p.replace("\n", "\\n") for p in prompts)
