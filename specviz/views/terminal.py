"""The colour-coded output for a terminal (ANSI escape codes)."""

from __future__ import annotations

from specviz.trace import Trace

_CODES = {
    "accepted": "\x1b[48;5;117m\x1b[30m",  # sky blue background
    "rejected": "\x1b[38;5;166m\x1b[9m",  # vermillion, struck through
    "correction": "\x1b[48;5;214m\x1b[30m",  # orange background
    "bonus": "\x1b[48;5;36m\x1b[30m",  # bluish green background
    "prompt": "\x1b[2m",
    "target": "",
}
_RESET = "\x1b[0m"


def tokens_ansi(trace: Trace) -> str:
    """Prompt dimmed, then each token coloured by verdict, then a legend line (speculative runs only:
    the baseline's tokens are plain)."""
    out = [_CODES["prompt"] + trace.prompt_text + _RESET]
    for r in trace.rounds:
        for i, d in enumerate(r.drafts):
            if d.verdict == "discarded" or (d.verdict == "accepted" and i >= len(r.emitted_ids)):
                continue
            out.append(_CODES[d.verdict] + d.text + _RESET)
        if r.final_token_id is not None:
            out.append(_CODES[r.final_kind or "target"] + (r.final_text or "") + _RESET)
    if trace.mode != "speculative":
        return "".join(out) + "\n"
    legend = " ".join(_CODES[k] + k + _RESET for k in ("accepted", "rejected", "correction", "bonus"))
    return "".join(out) + "\n\n" + legend + "\n"
