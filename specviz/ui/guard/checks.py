"""Input checks: every value a visitor or a client sends is checked here before it is used, and a
bad one becomes a ``gr.Error`` naming the field and its allowed range (never a traceback).

Also the checked number widgets, which refuse a bad value before Gradio converts it, and
``queue_refusal``: a value Gradio itself would fail on with a logged traceback and a message that
names no field (a plain menu's value outside its choices), refused before a job joins the queue
(``specviz.ui.guard.admission``).
"""

from __future__ import annotations

import html
import logging
import math
import re

import gradio as gr
from gradio.context import LocalContext

from specviz import Sampling
from specviz.drafters import KINDS as DRAFTER_KINDS
from specviz.pair import PairError
from specviz.pair.catalogue import check_drafter_kind
from specviz.pair.prompt import split_prompts
from specviz.engine.schedules import SCHEDULES
from specviz.ui.guard.limits import (
    BATCH_MAX,
    GAMMA_RANGE,
    MAX_NEW_TOKENS_RANGE,
    PENALTY_RANGE,
    PROMPT_CHARS_MAX,
    PROMPT_TOKENS_MAX,
    SEED_MAX,
    TEMPERATURE_MIN,
    TEMPERATURE_RANGE,
    TOP_K_MAX,
)
from specviz.ui.guard.address import client_address
from specviz.ui.guard.budgets import LogBudget, span

log = logging.getLogger("specviz")
# Log lines refusals may cost: per client address (refusals made before a handler runs, where Gradio
# names no request, share the address "") and from everyone, within the window; past either the
# visitor still gets the message, the log nothing.
REFUSAL_LOGS = LogBudget()
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")

# a message's length at most: whatever part of it came from a value sent is an excerpt, never the value
MESSAGE_MAX_CHARS = 600
EXCERPT_CHARS = 60  # what of a value sent a message may quote at most


def excerpt(text, n: int = EXCERPT_CHARS) -> str:
    """``text`` (any value, as str) cut to ``n`` characters, with "…" where it was cut."""
    text = str(text)
    return text if len(text) <= n else text[: n - 1] + "…"


def mistake(message: str, title: str) -> gr.Error:
    """A visitor's mistake (a bad setting, a file that is not a recording): the visitor gets the
    message with its title, the server log one line, no traceback (an unexpected failure keeps it).

    Gradio's error toast renders its message as HTML: the message is escaped here, so whatever part of
    it came from a visitor (a model id, a field's name in a recording) shows as text, never as markup.
    Messages name the field and its allowed range; they do not repeat the value sent. One that quotes a
    lower layer's message (a pair that could not load, a file's field) is cut to MESSAGE_MAX_CHARS, so a
    100,000-character value sent comes back as an excerpt at most.

    The log line is one line (control characters and line breaks become spaces), within ``REFUSAL_LOGS``."""
    message, title = excerpt(message, MESSAGE_MAX_CHARS), excerpt(title, EXCERPT_CHARS)
    note_refusal(title, message)
    return gr.Error(html.escape(message, quote=False), title=html.escape(title, quote=False), print_exception=False)


def note_refusal(title: str, message: str, budget: LogBudget | None = None, address: str | None = None) -> None:
    """One log line for a refused request, at INFO, within ``budget`` (None: ``REFUSAL_LOGS``) for ``address``
    (None: the address of the request being handled, Gradio's, where it names one)."""
    budget = budget or REFUSAL_LOGS
    address = client_address(LocalContext.request.get(None)) if address is None else address
    n = budget.take(address)
    if n is not None:
        log.info(
            "refused: %s: %s [from %s; line %d of at most %d per address in %s]",
            _CONTROL.sub(" ", title),
            _CONTROL.sub(" ", message[:200]),
            ascii(address[:64]) if address else "an unnamed address",
            n,
            budget.per_client,
            span(budget.window_s),
        )


def text_ok(value) -> bool:
    """A str that encodes as UTF-8 (no lone surrogate, which would break the page's event stream)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def number(value) -> bool:
    """A finite int or float (not a bool, not NaN or infinity): checked before any int() conversion."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_controls(
    prompt: str, gamma, temperature, top_k, top_p, max_new_tokens, seed, repetition_penalty=1.0
) -> Sampling:
    """Validate the controls (every type first, then every range); raise gr.Error with what to change."""
    if not isinstance(prompt, str):
        raise mistake(f"The prompt must be text of 1 to {PROMPT_CHARS_MAX} characters.", title="Bad prompt")
    if not prompt.strip():
        raise mistake("The prompt is empty: type some text (or pick an example) to continue.", title="Empty prompt")
    if len(prompt) > PROMPT_CHARS_MAX:
        raise mistake(
            f"The prompt has {len(prompt)} characters; the limit is {PROMPT_CHARS_MAX} characters (and "
            f"{PROMPT_TOKENS_MAX} tokens).",
            title="Prompt too long",
        )
    if not text_ok(prompt):
        raise mistake(
            "The prompt holds characters that are not valid text (a lone surrogate): retype or paste it again.",
            title="Bad prompt",
        )
    checks = [
        (gamma, *GAMMA_RANGE, "gamma"),
        (max_new_tokens, *MAX_NEW_TOKENS_RANGE, "max new tokens"),
        (top_k, 0, TOP_K_MAX, "top-k"),
        (seed, 0, SEED_MAX, "seed"),
    ]
    for value, lo, hi, name in checks:
        if not number(value) or value != int(value) or not lo <= value <= hi:
            raise mistake(
                f"{name} must be a whole number from {lo} to {hi}.", title=f"{name.capitalize()} out of range"
            )
    if not number(temperature) or not (temperature == 0 or TEMPERATURE_MIN <= temperature <= TEMPERATURE_RANGE[1]):
        raise mistake(
            f"temperature must be 0 (greedy) or from {TEMPERATURE_MIN} to {TEMPERATURE_RANGE[1]}.",
            title="Temperature out of range",
        )
    if not number(top_p) or not 0 < top_p <= 1:
        raise mistake("top-p must be above 0 and at most 1 (1 keeps every token).", title="Top-p out of range")
    if not number(repetition_penalty) or not PENALTY_RANGE[0] <= repetition_penalty <= PENALTY_RANGE[1]:
        raise mistake(
            f"repetition penalty must be from {PENALTY_RANGE[0]} (off) to {PENALTY_RANGE[1]}.",
            title="Repetition penalty out of range",
        )
    try:
        return Sampling(
            temperature=float(temperature),
            top_k=int(top_k),
            top_p=float(top_p),
            repetition_penalty=float(repetition_penalty),
        )
    except ValueError as err:
        raise mistake(str(err), title="Bad sampling settings") from err


def check_drafting(drafter_kind, gamma_schedule) -> tuple[str, str]:
    """The drafter kind and schedule name, checked against the menus (an API call can send anything)."""
    if not isinstance(drafter_kind, str) or drafter_kind not in DRAFTER_KINDS:
        raise mistake(f"drafter must be one of {', '.join(DRAFTER_KINDS)}.", title="Invalid drafter")
    if not isinstance(gamma_schedule, str) or gamma_schedule not in SCHEDULES:
        raise mistake(f"gamma schedule must be one of {', '.join(SCHEDULES)}.", title="Invalid gamma schedule")
    return drafter_kind, gamma_schedule


def check_pair_kind(pair_name, drafter_kind, custom_drafter="", custom_target="") -> None:
    """The drafter kind checked against the pair's catalogue entry (``specviz.pair.catalogue.check_drafter_kind``),
    before anything loads. Custom ids pass: their tokenizers are known only once loaded.

    Raises:
        gr.Error: naming the pair, the drafter kind and the kinds the pair allows.
    """
    if (isinstance(custom_drafter, str) and custom_drafter.strip()) or (
        isinstance(custom_target, str) and custom_target.strip()
    ):
        return
    try:
        check_drafter_kind(pair_name, drafter_kind)
    except PairError as err:
        raise mistake(f"{err}.", title="Drafter kind does not fit the pair") from None


def check_batch_prompts(text, batch_size) -> list[str]:
    """The Batch tab's prompts, validated; raise gr.Error naming the field."""
    if not isinstance(text, str) or not text.strip():
        raise mistake("The batch prompts are empty: write one prompt per line.", title="Empty batch")
    if not text_ok(text):
        raise mistake(
            "The batch prompts hold characters that are not valid text (a lone surrogate).", title="Bad batch prompts"
        )
    if len(text) > BATCH_MAX * PROMPT_CHARS_MAX:
        raise mistake(
            f"The batch prompts have {len(text)} characters; the limit is {BATCH_MAX * PROMPT_CHARS_MAX}.",
            title="Batch too long",
        )
    prompts = split_prompts(text)
    if len(prompts) > BATCH_MAX:
        raise mistake(
            f"The batch prompts hold {len(prompts)} lines; give at most {BATCH_MAX}, one prompt per line.",
            title="Too many prompts",
        )
    if not number(batch_size) or batch_size != int(batch_size) or not 1 <= batch_size <= BATCH_MAX:
        raise mistake(f"batch size must be a whole number from 1 to {BATCH_MAX}.", title="Batch size out of range")
    return prompts


class _Numeric:
    """A number control that checks what a client sent before Gradio converts it: a value that is
    not a finite number, or is outside the control's range, gets a message naming the control
    and the range (Gradio's own checks fail with a bare "Error" and a logged traceback)."""

    def preprocess(self, payload):
        lo, hi = self.minimum, self.maximum
        if not number(payload):
            raise mistake(f"{self.label} must be a finite number from {lo} to {hi}.", title=f"Bad {self.label}")
        if (lo is not None and payload < lo) or (hi is not None and payload > hi):
            raise mistake(f"{self.label} must be from {lo} to {hi}.", title=f"{self.label} out of range")
        return super().preprocess(payload)


class CheckedText:
    """A text control that refuses what is not a str of valid text (Gradio passes a list, a dict or a
    number through to the handler, which then fails with a bare "Error")."""

    def preprocess(self, payload):
        if payload is None:
            payload = ""
        if not text_ok(payload):
            limit = f" of at most {self.max_length} characters" if self.max_length else ""
            raise mistake(f"{self.label} must be text{limit}, with no lone surrogates.", title=f"Bad {self.label}")
        return super().preprocess(payload)


class CheckedTextbox(CheckedText, gr.Textbox):
    def get_block_name(self) -> str:
        return "textbox"


def choices_message(menu) -> str:
    """What a menu (``gr.Dropdown``, ``gr.Radio``) takes: "<label> must be one of: <its choices>." (never the value
    sent)."""
    return f"{menu.label} must be one of: {', '.join(str(v) for _, v in menu.choices)}."


class CheckedChoice:
    """A menu that refuses a value of the wrong type with a message naming the control and its
    choices (Gradio's own check fails with a bare "Error" on a list or a dict)."""

    def preprocess(self, payload):
        values = [v for _, v in self.choices]
        if isinstance(payload, bool) or not isinstance(payload, (str, int, float)) or payload not in values:
            raise mistake(choices_message(self), title=f"Bad {self.label}")
        return super().preprocess(payload)


class CheckedDropdown(CheckedChoice, gr.Dropdown):
    def get_block_name(self) -> str:
        return "dropdown"


class CheckedRadio(CheckedChoice, gr.Radio):
    def get_block_name(self) -> str:
        return "radio"


class CheckedCheckbox(gr.Checkbox):
    """A checkbox that takes only true or false."""

    def preprocess(self, payload):
        if not isinstance(payload, bool):
            raise mistake(f"{self.label} must be true or false.", title=f"Bad {self.label}")
        return super().preprocess(payload)

    def get_block_name(self) -> str:
        return "checkbox"


class CheckedSlider(_Numeric, gr.Slider):
    def get_block_name(self) -> str:
        return "slider"


class CheckedNumber(_Numeric, gr.Number):
    def get_block_name(self) -> str:
        return "number"


class CheckedFile(gr.File):
    """One uploaded file handed to the handler as its path. Gradio's own ``gr.File`` (``type="filepath"``)
    also writes an empty temporary file into its cache for every file it hands over, never removed
    (one per load); this one writes nothing."""

    def preprocess(self, payload):
        if payload is None:
            return None
        path = getattr(payload, "path", None)
        if not isinstance(path, str) or (
            self.file_types and not path.lower().endswith(tuple(t.lower() for t in self.file_types))
        ):
            raise mistake(
                f"{self.label} must be one file of type {', '.join(self.file_types or ['any'])}.", title="Bad file"
            )
        return path

    def get_block_name(self) -> str:
        return "file"


# Before a job joins the queue (``specviz.ui.guard.admission``): a value Gradio itself checks between the queue and the
# handler, where it fails with a logged traceback (25 lines a call) and a message that names no field (a menu's "Value:
# <the value, unescaped> is not in the list of choices"). File inputs are left to Gradio's own checks: the page sends
# back uploads, prepared recordings and downloads, and a check here of where such a file lies refused the page's own
# files.


def _menu_refusal(menu, value) -> str | None:
    """``choices_message`` for a plain Gradio menu's (``gr.Dropdown``, ``gr.Radio``) value outside its choices, as
    Gradio's own check would fail it (None passes; a multiselect menu's list is checked value by value); None when the
    value passes, the menu takes any value, or it is a menu of ours (``CheckedChoice``, which checks itself)."""
    if (
        isinstance(menu, CheckedChoice)
        or not isinstance(menu, (gr.Dropdown, gr.Radio))
        or getattr(menu, "allow_custom_value", False)
    ):
        return None
    values = [v for _, v in menu.choices]
    sent = value if getattr(menu, "multiselect", False) and isinstance(value, list) else [value]
    ok = value is None or all(not isinstance(v, (bool, list, dict)) and v in values for v in sent)
    return None if ok else choices_message(menu)


def queue_refusal(fn, data: list, state=None) -> tuple[str, str] | None:
    """(title, message) for the first of ``data`` (a job's values for the event ``fn``, Gradio's BlockFunction) that
    Gradio would fail on before the handler runs: a plain menu's value outside its choices (``_menu_refusal``); None
    when every value passes. ``state``: the job's session (Gradio's SessionState, or None): a control an earlier event
    of that session updated (new choices) is checked as that session holds it, as Gradio's own check reads it. The
    message names the field and what it takes, never the value sent (the caller escapes it: the page renders it)."""
    if not getattr(fn, "preprocess", True) or getattr(fn, "batch", False):
        return None
    props = set(getattr(fn, "component_prop_inputs", None) or ())
    for i, (component, value) in enumerate(zip(fn.inputs, data)):
        if i in props or getattr(component, "stateful", False):
            continue
        try:
            if state is not None and component._id in state:
                component = state[component._id]
        except (AttributeError, KeyError, TypeError):  # no session copy to read: the app's own control
            pass
        if message := _menu_refusal(component, value):
            return excerpt(f"Bad {component.label}", EXCERPT_CHARS), excerpt(message, MESSAGE_MAX_CHARS)
    return None
