"""Text from a trace or a recording, made safe for the page: never markup."""

from __future__ import annotations

import re
from html import escape

_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")


def markdown_literal(text: str) -> str:
    """``text`` for a Markdown component, shown as typed: HTML escaped and Markdown's punctuation
    backslash-escaped, so a recording's title cannot add a tag, a link or an image. Quotes stay as typed:
    the text is never inside an attribute, and the component shows an entity such as ``&#x27;`` literally."""
    return _MARKDOWN.sub(r"\\\1", escape(text, quote=False)).replace("\n", " ")


def run_label(trace) -> str:
    """The run's drafter and gamma schedule in words, plain text (escape before HTML):
    "drafter model, gamma 4", "prompt lookup (n-gram <= 3), heuristic gamma from 4", "drafter model,
    tree 3-2-2-1, depth 4", ...
    Traces saved before schema 4 name no drafter: a drafter model with a constant gamma."""
    s = trace.settings
    drafter = s.get("drafter") or {"kind": "model"}
    schedule = s.get("gamma_schedule") or {"name": "constant"}
    kind = drafter.get("kind")
    label = {
        "model": "drafter model",
        "argmax": "drafter model, its argmax",
        "ngram": "prompt lookup",
        "early-exit": "early exit",
        "quantized": "quantized target",
    }.get(kind, str(kind))
    if kind == "ngram" and "max_ngram" in drafter:
        label += f" (n-gram <= {drafter['max_ngram']})"
    if kind == "early-exit" and "exit_layer" in drafter:
        label += f" (layer {drafter['exit_layer']} of {drafter.get('layers', '?')})"
    if kind == "quantized" and "bits" in drafter:
        label += f" (int{drafter['bits']})"
    tree = s.get("tree")
    if isinstance(tree, dict):  # a token tree: a shape or a node budget, and a depth, no gamma
        shape = tree.get("shape")
        what = (
            f"tree {str(shape).replace(',', '-')}"
            if shape
            else f"tree of {tree.get('nodes')} nodes, any shape"
            if tree.get("kind") == "explicit"
            else f"dynamic tree of {tree.get('nodes')} nodes"
        )
        return f"{label}, {what}, depth {tree.get('depth')}"
    gamma = s.get("gamma")
    name = schedule.get("name")
    if name in (None, "constant"):
        return f"{label}, gamma {gamma}"
    if name == "confidence":
        return f"{label}, gamma up to {gamma} while max q >= {schedule.get('threshold')}"
    if name == "path":
        return f"{label}, gamma up to {gamma} while the product of max q >= {schedule.get('threshold')}"
    return f"{label}, {name} gamma from {gamma}"


def measured_so_far(done: int, total: int, what: str, elapsed_s: float) -> str:
    """ "Measured 2 of 6 batches (...) in 40 s; about 80 s left at that pace": a long job's progress in words, ``what``
    its parts named as the sentence goes on; the time left only once it can be told (``left_at_pace``)."""
    left = left_at_pace(done, total, elapsed_s)
    return f"Measured {done} of {total} {what} in {elapsed_s:.0f} s" + (f"; {left}" if left else "")


def left_at_pace(done: int, total: int, elapsed_s: float | None) -> str:
    """ "about R s left at that pace": R the mean time of a step done so far (``elapsed_s`` / ``done``) times the
    ``total - done`` steps left, rounded to whole seconds; "" when nothing is timed yet or nothing is left."""
    if elapsed_s is None or done <= 0 or done >= total:
        return ""
    return f"about {elapsed_s / done * (total - done):.0f} s left at that pace"
