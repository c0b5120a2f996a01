"""The model pair a request names: loaded (or reused) for it, and every failure while loading
or generating mapped to a message for the visitor."""

from __future__ import annotations

import logging

import gradio as gr
import torch

from specviz.pair import Pair, PairError, encode_prompt, free_memory, load_pair, loaded_pair
from specviz.pair.download import in_background
from specviz.ui.checks import excerpt, mistake
from specviz.ui.limits import PROMPT_TOKENS_MAX

log = logging.getLogger("specviz")


def pair_ids(pair_name, custom_drafter, custom_target) -> dict:
    """load_pair's arguments: the custom ids when the visitor gave any, else the preset name."""
    drafter, target = (custom_drafter or "").strip(), (custom_target or "").strip()
    return dict(drafter=drafter, target=target) if drafter or target else dict(name=pair_name)


def ensure_pair(pair_name, custom_drafter, custom_target, progress, doing: str | None = None) -> Pair:
    """Load (or reuse) the pair outside any GPU call, reporting progress to the page. A model still on
    the hub downloads in the background: the visitor is told so within seconds (``specviz.pair.download``).

    ``doing`` (what the job runs next, in words) then replaces the loader's last message, with no
    bar: a resident pair's "is loaded - 100%" stood for seconds over a sweep, a comparison or a batch
    while nothing loaded."""
    try:
        with in_background():
            pair = load_pair(**pair_ids(pair_name, custom_drafter, custom_target), progress=lambda f, m: progress(f, desc=m))
    except PairError as err:
        raise mistake(str(err), title="Model pair unavailable") from err
    if doing:
        progress(None, desc=doing)
    return pair


def resident(pair_name, custom_drafter, custom_target) -> Pair:
    """The pair ``ensure_pair`` loaded. It may be missing here: on ZeroGPU this runs in a worker process
    forked before a later-loaded pair existed, and elsewhere another visitor's pair may have
    replaced it; then it is loaded here (on ZeroGPU, once per worker)."""
    ids = pair_ids(pair_name, custom_drafter, custom_target)
    pair = loaded_pair(**ids)
    if pair is None:
        try:
            pair = load_pair(**ids)
        except PairError as err:
            raise mistake(str(err), title="Model pair unavailable") from err
    return pair


def encode(pair: Pair, prompt: str, chat: bool) -> list[int]:
    """The prompt's token ids, through the chat template when asked and the pair is instruct.

    Raises:
        gr.Error: the pair has no chat template, or the prompt is over PROMPT_TOKENS_MAX tokens
            (counted with the template), the limit that bounds a prefill's work.
    """
    try:
        ids = encode_prompt(pair, prompt, bool(chat) and pair.instruct)
    except PairError as err:
        raise mistake(str(err), title="Cannot use the chat template") from err
    if len(ids) > PROMPT_TOKENS_MAX:
        raise mistake(f"The prompt is {len(ids)} tokens for this pair's tokenizer (chat template included); the limit is "
                      f"{PROMPT_TOKENS_MAX} tokens. Shorten it: emoji and rare characters take several tokens each.", title="Prompt too long")
    return ids


def failure(err: Exception, pair: Pair | None = None) -> gr.Error:
    """A visitor-facing message for an error raised while generating; frees memory after an OOM."""
    if isinstance(err, gr.Error):
        return err
    if isinstance(err, ValueError):
        return mistake(str(err), title="Cannot generate")
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        free_memory(pair.device if pair is not None else None)
        log.warning("out of memory while generating; memory freed")
        return mistake("Out of memory: ask for fewer tokens, a shorter prompt or a smaller pair. The app is still running.", title="Out of memory")
    # the app must keep serving; the visitor gets what failed, the log gets the traceback
    log.exception("generation failed")
    return gr.Error(f"Generation failed ({type(err).__name__}: {excerpt(err, 200)}). The app is still running: try again or change the settings.",
                    title="Generation failed")
