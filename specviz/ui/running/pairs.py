"""The model pair a request names: loaded (or reused) for it, and every failure while loading
or generating mapped to a message for the visitor; and the pairs made ready before the page serves
(``warm_up``).

Warm-up: the page's pairs (``SPECVIZ_PRELOAD``, default the page's default pair) are loaded when the
page is built, before the server listens: the model files read (a packaged GGUF target converted on a
machine's first start), the CPU form chosen and timed (``specviz.pair.precision``) and an fp32 pair's
products timed (``specviz.pair.kernels``). Then one short Generate runs as the page's device half runs
one (``specviz.ui.running.device.run_on_device``: drafter, verify passes, baseline in turns), so the passes'
first-call costs are paid too. The first visitor's Generate then takes what a later one takes. ``SPECVIZ_WARM_UP=0``
turns it off (the tests do: they start many servers); a pair then loads on its first Generate. On
ZeroGPU the pairs are loaded before launch either way (its GPU workers see only what was loaded then),
and nothing runs: there is no GPU outside a visitor's job.

The warm-up runs on the device thread (``specviz.serving.device_thread``), where every later run of the server
runs: a model pass on any other thread (the main thread's, at start-up) would leave a second OpenMP team in the
process, and with more OpenMP threads than cores every team sleeps between parallel regions (measured on 2 cores,
bf16, the English pair, 128 tokens at the page's defaults: 35 speculative tokens/s against 52 with one thread).
"""

from __future__ import annotations

import logging
import os
import time

import gradio as gr
import torch

from specviz.drafters import default_kind
from specviz.engine.sampling import DEFAULT_SAMPLING
from specviz.measure.baseline import with_baseline
from specviz.pair import Pair, PairError, encode_prompt, free_memory, load_pair, loaded_pair, preload
from specviz.pair.download import in_background
from specviz.pair.drafter import pair_drafter
from specviz.serving import device_thread, load_thread
from specviz.engine.zerogpu import on_zerogpu
from specviz.ui.guard.checks import excerpt, mistake
from specviz.ui.guard.limits import PROMPT_TOKENS_MAX
from specviz.ui.page.defaults import CODE_EXAMPLES, DEFAULTS, ENGLISH_EXAMPLES, example_kind

log = logging.getLogger("specviz")

WARM_UP_ENV = "SPECVIZ_WARM_UP"
# the warm-up Generate's new tokens: every pass shape of a run (prefill, draft, verify, baseline step) comes up
WARM_UP_TOKENS = 16


def pair_ids(pair_name, custom_drafter, custom_target) -> dict:
    """load_pair's arguments: the custom ids when the visitor gave any, else the preset name."""
    drafter, target = (custom_drafter or "").strip(), (custom_target or "").strip()
    return dict(drafter=drafter, target=target) if drafter or target else dict(name=pair_name)


def ensure_pair(
    pair_name,
    custom_drafter,
    custom_target,
    progress,
    doing: str | None = None,
    owner: device_thread.Owner | None = None,
) -> Pair:
    """Load (or reuse) the pair outside any GPU call, reporting progress to the page. A model still on
    the hub downloads in the background: the visitor is told so within seconds (``specviz.pair.download``).
    On a CPU the load runs on the load thread (``specviz.serving.load_thread``): the visitor waits for it, and the
    device thread goes on with other visitors' runs meanwhile (only the product kernels' timing, once per machine, is
    a step of its own there), its Python in turns for ``owner`` (the visitor's) where the device thread has steps
    (``device_thread.deferring``). With CUDA it stays a step of the device thread for ``owner``: weights copied to
    the GPU from another thread while the device thread captures a CUDA graph would break the capture.

    ``doing`` (what the job runs next, in words) then replaces the loader's last message, with no
    bar: a resident pair's "is loaded - 100%" stood for seconds over a sweep, a comparison or a batch
    while nothing loaded."""
    ids = pair_ids(pair_name, custom_drafter, custom_target)
    try:
        pair = _resident_preset(ids)  # not queued behind another visitor's load of another pair
        if pair is None:
            loads = device_thread.run if torch.cuda.is_available() else load_thread.run
            pair = loads(_load_in_background, ids, lambda f, m: progress(f, desc=m), owner=owner)
    except PairError as err:
        raise mistake(str(err), title="Model pair unavailable") from err
    if doing:
        progress(None, desc=doing)
    return pair


def _resident_preset(ids: dict) -> Pair | None:
    """A preset pair (no custom ids) that is resident now, marked the most recently used; else None."""
    if ids.get("drafter") or ids.get("target"):
        return None
    try:
        return loaded_pair(**ids)
    except PairError:
        return None  # the load path words the refusal


def _load_in_background(ids: dict, progress) -> Pair:
    """``load_pair`` leaving a hub download under way to run in the background (``in_background``: a flag of the
    thread that loads, here the load thread), the product kernels timed on the device thread."""
    with in_background():
        return load_pair(**ids, progress=progress, timing=device_thread.run)


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
        raise mistake(
            f"The prompt is {len(ids)} tokens for this pair's tokenizer (chat template included); the limit is "
            f"{PROMPT_TOKENS_MAX} tokens. Shorten it: emoji and rare characters take several tokens each.",
            title="Prompt too long",
        )
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
        return mistake(
            "Out of memory: ask for fewer tokens, a shorter prompt or a smaller pair. The app is still running.",
            title="Out of memory",
        )
    # the app must keep serving; the visitor gets what failed, the log gets the traceback
    log.exception("generation failed")
    return gr.Error(
        f"Generation failed ({type(err).__name__}: {excerpt(err, 200)}). The app is still running: try again or change "
        "the settings.",
        title="Generation failed",
    )


def warm_up_wanted() -> bool:
    """Whether the page warms its pairs up when it is built: ``SPECVIZ_WARM_UP`` unset, or anything but 0, false,
    no or off (in any case)."""
    return os.environ.get(WARM_UP_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def warm_up(names: list[str] | None = None, max_new_tokens: int = WARM_UP_TOKENS) -> dict[str, float | PairError]:
    """Make the page's pairs ready before the first visitor (module docstring): load each (``specviz.pair.preload``),
    then run one Generate of ``max_new_tokens`` tokens with the page's default controls and the pair's own example
    prompt as the page's device half runs it (on a GPU it captures the pair's CUDA graphs, before serving). Does
    nothing when ``warm_up_wanted()`` is False, except on ZeroGPU, where the pairs are loaded (not run) either way.

    Args:
        names: preset names (default: ``SPECVIZ_PRELOAD``'s, else the page's default pair).

    Returns:
        {name: the seconds (wall clock) its load and run took, or the PairError that kept it from loading}. A pair
        that fails is reported there and printed; the page still serves, and the others are warmed.

    Raises:
        PairError: more names than ``SPECVIZ_RESIDENT_PAIRS`` keeps, or a name that is no preset (``preload``).
    """
    if not warm_up_wanted() and not on_zerogpu():
        return {}
    # On ZeroGPU the pairs load in the main process before launch, as its workers are forked from it.
    return _warm_up(names, max_new_tokens) if on_zerogpu() else device_thread.run(_warm_up, names, max_new_tokens)


def _warm_up(names: list[str] | None, max_new_tokens: int) -> dict[str, float | PairError]:
    done: dict[str, float | PairError] = {}
    start = time.perf_counter()
    for name, result in preload(names).items():
        if isinstance(result, PairError):
            print(f"specviz: could not load {name} at start-up: {result}")  # the page still serves the others
            done[name] = result
            continue
        ran = ""
        # Not on ZeroGPU, where the main process has no GPU to run on; on a GPU of its own the run captures the
        # pair's CUDA graphs before the first visitor (``specviz.engine.graphs``).
        if not on_zerogpu() and warm_up_wanted():
            try:
                _first_generate(result, max_new_tokens)
                ran = f" and ran a {max_new_tokens}-token Generate"
            except Exception as err:  # noqa: BLE001 - the page still serves; a visitor's run reports its own failure
                ran = f"; its warm-up run failed ({type(err).__name__}: {excerpt(err, 200)})"
        done[name] = time.perf_counter() - start
        print(f"specviz: {name} loaded{ran} in {done[name]:.1f} s, before serving")
        start = time.perf_counter()
    return done


def _first_generate(pair: Pair, max_new_tokens: int) -> None:
    """One Generate of ``pair`` (a preset) as the page's device half runs it
    (``specviz.ui.running.device.run_on_device``:
    the speculative run and its baseline in turns, ``specviz.measure.baseline.with_baseline``), with the page's
    default controls and the pair's example prompt; its traces dropped."""
    prompt = (ENGLISH_EXAMPLES if example_kind(pair.name) == "english" else CODE_EXAMPLES)[0]
    with_baseline(
        encode(pair, prompt, chat=True),
        pair_drafter(default_kind(pair), pair),
        pair.target,
        gamma=DEFAULTS["gamma"],
        schedule=DEFAULTS["gamma_schedule"],
        sampling=DEFAULT_SAMPLING,
        max_new_tokens=max_new_tokens,
        eos_token_id=pair.eos_token_ids,
        seed=DEFAULTS["seed"],
        tokenizer=pair.tokenizer,
    )
    free_memory("cpu")  # as after a visitor's run: what the run allocated goes back before the first visitor comes
