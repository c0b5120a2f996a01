"""The page's layout and wiring only: components, tabs, and which handler each event calls.

Handlers live in one module per tab (``specviz.ui.tabs.generate``, ``replay``, ``sweep``, ``race``,
``files``, ``compare``, ``batch``, ``lab``, ``api``); they return dicts keyed by the names used
here (``ui[name]``).
"""

from __future__ import annotations

import os

import gradio as gr

from specviz import Trace
from specviz.lab.faults import FAULTS
from specviz.engine.schedules import DEFAULT_THRESHOLDS
from specviz.lab.models import KINDS as LAB_KINDS
from specviz.pair import EMBEDDED, PRESETS, bound_kernel_caches, custom_models_allowed, one_heap, freeze_long_lived
from specviz.pair.catalogue import target_origin
from specviz.pair.prompt import join_prompts
from specviz.recording import MAX_BYTES
from specviz.ui.tabs.api import run_api
from specviz.ui.tabs.batch import run_batch
from specviz.ui.guard.disk import own_cache
from specviz.ui.guard.downloads import session_ended
from specviz.ui.guard.admission import admit
from specviz.ui.guard.checks import (
    CheckedCheckbox, CheckedDropdown, CheckedFile, CheckedNumber, CheckedRadio, CheckedSlider, CheckedTextbox,
)
from specviz.ui.running.jobs import SLOTS, guarded, skips
from specviz.ui.tabs.compare import run_compare
from specviz.ui.tabs.files import (
    RESTORED,
    examples,
    export_recording,
    load_example,
    load_failed_note,
    load_recording,
    loading_note,
    restore_controls,
)
from specviz.ui.tabs.generate import failed, generate, stop
from specviz.ui.tabs.lab import run_lab
from specviz.ui.guard.limits import (
    BATCH_MAX,
    BATCH_SECONDS_MAX,
    CACHE_TTL_S,
    COMPARE_SECONDS_MAX,
    CONCURRENCY,
    EXPORT_CONCURRENCY,
    GAMMA_RANGE,
    LAB_RUNS_MAX,
    LAB_SECONDS_MAX,
    LOAD_CONCURRENCY,
    SWEEP_SECONDS_MAX,
    MAX_NEW_TOKENS_RANGE,
    PACES,
    PENALTY_RANGE,
    PROMPT_CHARS_MAX,
    QUICK_TOKENS,
    SEED_MAX,
    SESSION_TTL_S,
    SWEEP_GAMMAS,
    TEMPERATURE_RANGE,
    TOP_K_MAX,
)
from specviz.ui.page.defaults import (
    BATCH_EXAMPLES,
    CODE_EXAMPLES,
    DEFAULT_PAIR,
    DEFAULTS,
    DRAFTER_CHOICES,
    ENGLISH_EXAMPLES,
    EXAMPLES,
    GREEDY_NOTE,
    INTRO,
    SCHEDULE_CHOICES,
    caps,
    example_kind,
)
from specviz.ui.page.outputs import RUN_OUTPUTS, keyed
from specviz.ui.running.pairs import warm_up
from specviz.ui.tabs.race import start_race
from specviz.ui.tabs.replay import replay_next, replay_previous, replay_show
from specviz.ui.tabs.tree import TREE_CHOICES, replay_tree
from specviz.ui.tabs.whatif import sliders as whatif_sliders, whatif, whatif_from_run
from specviz.ui.tabs.sweep import run_sweep
from specviz.ui.page.evidence import explanation
from specviz.views import BATCH_NOTE, THEORY_NOTE, legend_html, round_html, sweep_figure
from specviz.views.batch import batch_figure, batch_lanes_html
from specviz.views.compare import compare_figure, compare_html
from specviz.views.lab import lab_figure
from specviz.views.theory import WHATIF_DEFAULT, sweep_note, whatif_figure, whatif_markdown
from specviz.views.tree_budget import auto_note_markdown, chosen_tree_figure, placeholder_figure
from specviz.views.verdict import headline_html


def kind_for_pair(name: str | None, kind: str | None):
    """The drafter menu after the pair menu changed: a pair whose drafter has its own tokenizer drafts as
    "cross-tokenizer" (its ids are not the target's, so "model" would be refused); leaving such a pair
    goes back to "model"; any other choice stays."""
    preset = PRESETS.get(name or EMBEDDED)
    if preset is not None and preset.own_tokenizer and kind in ("model", "argmax", None):
        return gr.update(value="cross-tokenizer")
    if (preset is None or not preset.own_tokenizer) and kind == "cross-tokenizer":
        return gr.update(value="model")
    return gr.update()


def prompt_for_pair(name: str | None, prompt: str | None):
    """The prompt after the pair menu changed: a pair brings its own kind of prompt (``example_kind``). The prompt
    box, when it holds an example of the other kind (the visitor wrote nothing of their own), gets the pair's first
    example: the cross pair's code drafter with an English question gave ")." and the end of text, one token in
    one round. A prompt the visitor wrote stays."""
    own = CODE_EXAMPLES if example_kind(name) == "code" else ENGLISH_EXAMPLES
    other = ENGLISH_EXAMPLES if own is CODE_EXAMPLES else CODE_EXAMPLES
    if own and (not (prompt or "").strip() or prompt in other):
        return gr.update(value=own[0])
    return gr.update()


def chat_for_pair(name: str | None):
    """The chat-template box after the pair menu changed: ticked for a pair of instruct models, unticked and fixed
    for one that has no chat template to apply (the embedded pair, the cross pair's code drafter)."""
    preset = PRESETS.get(name or EMBEDDED)
    instruct = preset is None or preset.instruct
    return gr.update(value=instruct, interactive=instruct)


def pair_info(name: str | None) -> str:
    preset = PRESETS.get(name or EMBEDDED)
    if not preset:
        return ""
    origin = target_origin(preset)
    return f"<small>{preset.summary}" + (f"<br>target here: {origin}" if origin else "") + "</small>"


def example_boxes(name: str | None) -> tuple:
    """The two example boxes' visibility for a pair: its own kind of prompt only (``example_kind``)."""
    kind = example_kind(name)
    return gr.update(visible=kind == "english"), gr.update(visible=kind == "code")


def intro_markdown(intro: str) -> str:
    """The page's introduction: its title, then the paragraph under it in a <details>. The page's CSS shows the
    paragraph open where there is room (specviz.ui.page.css); on a phone or a short screen (a projector's 1280 x 720) it
    stays one line,
    "How it works", one tap away, so the prompt and Generate come first."""
    title, _, body = intro.strip().partition("\n")
    return f'{title}\n\n<details class="sv-intro"><summary>How it works</summary>\n\n{body.strip()}\n\n</details>\n'


def build_demo(preload: bool = True, max_queue: int | None = None) -> gr.Blocks:
    """The Blocks app.

    Args:
        preload: warm the page's pairs up now, before the server listens (``specviz.ui.running.pairs.warm_up``: loaded,
            their CPU form timed, one short Generate run; ``SPECVIZ_WARM_UP=0`` turns it off), so the first
            visitor's Generate takes what a later one takes.
        max_queue: waiting requests beyond which new ones are refused with Gradio's
            queue-full message (default: env ``SPECVIZ_MAX_QUEUE``, else 96: a class of 40 pressing Generate at once
            waits in order, with room for others; a waiting job holds a few kB).
    """
    # Before the Blocks names Gradio's cache: every file the app writes lies in a folder of this process.
    own_cache()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    max_queue = max_queue if max_queue is not None else int(os.environ.get("SPECVIZ_MAX_QUEUE", "96"))
    # Before any thread of the server's (the preload's torch workers included) allocates: every thread
    # shares one C heap, so memory freed after a flood goes back to the system; and before any model
    # runs: the CPU's kernel caches keep a bounded number of prompt lengths' kernels (specviz.pair.memory).
    one_heap()
    bound_kernel_caches()
    if preload:
        warm_up()
    latex = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]
    ui: dict[str, gr.components.Component] = {}
    with gr.Blocks(
        title="specviz: speculative decoding, round by round", delete_cache=(CACHE_TTL_S, CACHE_TTL_S)
    ) as demo:
        ui["recording"] = gr.State(None, time_to_live=SESSION_TTL_S)
        gr.Markdown(intro_markdown(INTRO), elem_id="sv-intro")
        # Three columns in a grid (specviz.ui.page.css): what to run, what it shows, and the settings. On a wide screen
        # the output and its tabs fill the right, beside the other two; on a phone they come right after the
        # prompt and its Generate button, and the settings follow.
        with gr.Row(elem_id="sv-main"):
            with gr.Column(scale=2, min_width=320, elem_id="sv-run"):
                ui["pair_name"] = CheckedDropdown(
                    list(PRESETS),
                    value=DEFAULT_PAIR,
                    label="Model pair (drafter -> target)",
                    info="Hub pairs are downloaded on first use; one pair stays loaded at a time.",
                    elem_id="sv-pair",
                )
                ui["pair_info"] = gr.Markdown(pair_info(DEFAULT_PAIR), elem_id="sv-pair-info")
                ui["chat"] = CheckedCheckbox(
                    value=PRESETS[DEFAULT_PAIR].instruct,
                    interactive=PRESETS[DEFAULT_PAIR].instruct,
                    label="Apply the chat template (instruct pairs only)",
                )
                with gr.Row(visible=custom_models_allowed()):
                    ui["custom_drafter"] = CheckedTextbox(
                        "", label="Custom drafter (hub id[@revision])", placeholder="owner/name", max_length=200
                    )
                    ui["custom_target"] = CheckedTextbox(
                        "", label="Custom target (hub id[@revision])", placeholder="owner/name", max_length=200
                    )
                ui["prompt"] = CheckedTextbox(
                    value=EXAMPLES[0], label="Prompt", lines=5, max_length=PROMPT_CHARS_MAX, elem_id="sv-prompt"
                )
                with gr.Row(elem_id="sv-buttons"):
                    ui["run"] = gr.Button("Generate", variant="primary", scale=3)
                    ui["stop"] = gr.Button("Stop", variant="stop", scale=1, elem_id="sv-stop")
                gr.Markdown(caps(max_queue), elem_id="sv-caps")
                # One click away, so gamma and temperature stay in view under Generate at 1920 x 1080; the examples
                # that fit the chosen pair only (Python prompts under an English chat pair read as a mistake).
                with gr.Accordion("Example prompts", open=False, elem_id="sv-examples"):
                    with gr.Column(visible=example_kind(DEFAULT_PAIR) == "english") as ui["english_examples"]:
                        if ENGLISH_EXAMPLES:
                            gr.Examples(
                                ENGLISH_EXAMPLES[:10],
                                inputs=ui["prompt"],
                                label="English, held out from the drafter's training",
                            )
                    with gr.Column(visible=example_kind(DEFAULT_PAIR) == "code") as ui["code_examples"]:
                        gr.Examples(
                            CODE_EXAMPLES,
                            inputs=ui["prompt"],
                            label="Python: the embedded pair was trained on the standard library",
                        )
            with gr.Column(scale=3, min_width=400, elem_id="sv-show"):
                # the verdict, where the eye is first
                ui["headline"] = gr.HTML(headline_html(None, None), elem_id="sv-headline")
                gr.HTML(legend_html())
                ui["tokens"] = gr.HTML(label="Output", elem_id="sv-output")
                ui["status"] = gr.Markdown(elem_id="sv-status")
                with gr.Tabs(overflow_behavior="wrap"):  # on a phone every tab stays in view, on two rows
                    # one above the other, each the column's width: legible on a projector
                    with gr.Tab("Charts", id="charts"):
                        ui["acceptance_plot"] = gr.Plot(
                            label="Drafts per round", show_label=False, elem_id="sv-acceptance"
                        )
                        ui["timeline_plot"] = gr.Plot(label="Tokens over time", show_label=False, elem_id="sv-timeline")
                        ui["round_costs_plot"] = gr.Plot(
                            label="Time per round", show_label=False, elem_id="sv-round-costs"
                        )
                    with gr.Tab("Replay", id="replay", elem_id="sv-replay-tab"):
                        gr.Markdown(
                            "Step through the rounds: the drafts with q(x) and p(x), the uniform u against min(1, "
                            "p/q), and where the correction or bonus token came from."
                        )
                        with gr.Row(equal_height=True):
                            ui["prev_round"] = gr.Button("◀ Previous round", size="sm", elem_id="sv-prev", scale=1)
                            ui["replay_slider"] = CheckedSlider(
                                1, 2, value=1, interactive=False, step=1, label="round", elem_id="sv-round", scale=6
                            )
                            ui["next_round"] = gr.Button("Next round ▶", size="sm", elem_id="sv-next", scale=1)
                        # Narrower than a wide screen, the round's tables fold their less telling columns to fit their
                        # box, the verdict always in view (specviz.views.replay.COLUMNS, specviz.ui.page.css); this
                        # switch, in the page and not in the table, shows them all and stays as it is from round to
                        # round. No event: the page's CSS reads it.
                        gr.Checkbox(
                            False,
                            label="Show every column: β, and on a phone q(x) and p(x), fold away to fit the screen "
                            "(the table may then scroll sideways)",
                            elem_id="sv-replay-all",
                            container=False,
                        )
                        ui["replay"] = gr.HTML(
                            round_html(Trace(mode="speculative", prompt_ids=[]), 0), elem_id="sv-replay"
                        )
                        ui["replay_tree"] = gr.Plot(replay_tree(None, 1), show_label=False, elem_id="sv-replay-tree")
                    with gr.Tab("Theory", id="theory"):
                        gr.Markdown(THEORY_NOTE, latex_delimiters=[{"left": "$", "right": "$", "display": False}])
                        ui["speedup_plot"] = gr.Plot(show_label=False, elem_id="sv-speedup")
                        with gr.Accordion(
                            "What if? Move α, γ, c and v and watch the prediction", open=False, elem_id="sv-whatif"
                        ):
                            with gr.Row():
                                for key, slider in whatif_sliders().items():
                                    ui[f"whatif_{key}"] = slider
                            ui["whatif_from_run"] = gr.Button(
                                "Set to this run's α, γ, c and v", size="sm", elem_id="sv-whatif-run"
                            )
                            ui["whatif_note"] = gr.Markdown(whatif_markdown(**WHATIF_DEFAULT), elem_id="sv-whatif-note")
                            ui["whatif_plot"] = gr.Plot(
                                whatif_figure(**WHATIF_DEFAULT), show_label=False, elem_id="sv-whatif-plot"
                            )
                        with gr.Row():
                            ui["histogram_plot"] = gr.Plot(show_label=False, elem_id="sv-histogram")
                            ui["position_plot"] = gr.Plot(show_label=False, elem_id="sv-position")
                        with gr.Row(equal_height=True):
                            ui["sweep_button"] = gr.Button(
                                f"Run gamma sweep ({SWEEP_GAMMAS[0]}..{SWEEP_GAMMAS[-1]})",
                                elem_id="sv-sweep-button",
                                scale=1,
                            )
                            ui["sweep_status"] = gr.Markdown(sweep_note(None), elem_id="sv-sweep-status")
                        ui["sweep_plot"] = gr.Plot(sweep_figure(None), show_label=False, elem_id="sv-sweep")
                        gr.Markdown(
                            "### Which tree for this device?\nA tree verifies many guesses in one target pass, but "
                            "that pass "
                            "costs more the more nodes it holds: v(n), measured here. The auto tree weighs both.",
                            elem_id="sv-auto-head",
                        )
                        ui["auto_note"] = gr.Markdown(auto_note_markdown(None, None), elem_id="sv-auto-note")
                        ui["budget_plot"] = gr.Plot(
                            placeholder_figure("Speedup against the node budget: choose the auto tree to draw it"),
                            show_label=False,
                            elem_id="sv-budget",
                        )
                        ui["auto_tree_plot"] = gr.Plot(
                            chosen_tree_figure(None), show_label=False, elem_id="sv-auto-tree"
                        )
                        ui["rank_table"] = gr.HTML(elem_id="sv-rank-table")
                    with gr.Tab("Race", id="race"):
                        with gr.Row(equal_height=True):
                            ui["pace"] = CheckedRadio(list(PACES), value=PACES[0], label="pace", scale=3)
                            ui["race_button"] = gr.Button("Start race", elem_id="sv-race-button", scale=1)
                        ui["race"] = gr.HTML(elem_id="sv-race")
                    with gr.Tab("Save / load", id="files"):
                        gr.Markdown(
                            "Save a run as JSON and replay it later with no model: prepare runs on a GPU, show them on "
                            "a laptop offline. "
                            f"Files are checked against the trace schema; at most {MAX_BYTES // (1024 * 1024)} MB."
                        )
                        with gr.Row():
                            ui["download"] = gr.DownloadButton(
                                "Download this run (JSON)", interactive=False, elem_id="sv-download"
                            )
                            ui["upload"] = CheckedFile(
                                label="Load a recording (.json)",
                                file_types=[".json"],
                                type="filepath",
                                elem_id="sv-upload",
                            )
                        with gr.Row(equal_height=True):
                            ui["example"] = CheckedDropdown(
                                examples(),
                                value=(examples() or [None])[0],
                                label="Prepared recordings (each names its pair)",
                                scale=3,
                            )
                            ui["example_button"] = gr.Button(
                                "Load prepared recording", elem_id="sv-example-button", scale=1
                            )
                        # what a load is doing, beside its buttons
                        ui["load_status"] = gr.Markdown(elem_id="sv-load-status")
                        with gr.Row(equal_height=True):
                            ui["export_button"] = gr.Button(
                                "Export this run as one HTML file", elem_id="sv-export-button", scale=1
                            )
                            ui["export_file"] = gr.File(
                                label="A page that replays the run from disk: no server, no network (about 5 MB)",
                                interactive=False,
                                elem_id="sv-export",
                                scale=3,
                            )
                    with gr.Tab("Compare drafters", id="compare"):
                        gr.Markdown(
                            "One prompt, seed and sampling (the page's controls), decoded with each drafter kind: "
                            "which tokens "
                            "each one gets right, its tokens per round, alpha, cost and speedup. Each runs in turns "
                            "with its own "
                            "baseline; the output text is the same for all of them when sampling is greedy. The "
                            "quantized target (int8, CPU only) "
                            "shows why a drafter must be cheap as well as close: a high alpha, and a c near the "
                            "target's own cost."
                        )
                        ui["compare_button"] = gr.Button(
                            "Compare drafters", variant="primary", elem_id="sv-compare-button"
                        )
                        ui["compare_view"] = gr.HTML(compare_html(None), elem_id="sv-compare")
                        ui["compare_plot"] = gr.Plot(compare_figure(None), show_label=False, elem_id="sv-compare-plot")
                    with gr.Tab("Batch", id="batch"):
                        gr.Markdown(BATCH_NOTE)
                        ui["batch_prompts"] = CheckedTextbox(
                            join_prompts(BATCH_EXAMPLES),
                            label="Batch prompts (one per line; \\n inside a line is a newline)",
                            lines=6,
                            max_length=BATCH_MAX * PROMPT_CHARS_MAX,
                            elem_id="sv-batch-prompts",
                        )
                        with gr.Row(equal_height=True):
                            ui["batch_size"] = CheckedSlider(
                                1,
                                BATCH_MAX,
                                value=4,
                                step=1,
                                label="batch size (rows; beyond the prompts they repeat)",
                                scale=3,
                            )
                            ui["batch_button"] = gr.Button(
                                "Run batch", variant="primary", elem_id="sv-batch-button", scale=1
                            )
                        ui["batch_status"] = gr.Markdown(elem_id="sv-batch-status")
                        ui["batch_view"] = gr.HTML(batch_lanes_html(None), elem_id="sv-batch")
                        ui["batch_plot"] = gr.Plot(batch_figure(None), show_label=False, elem_id="sv-batch-plot")
                    with gr.Tab("Exactness lab", id="lab"):
                        gr.Markdown(
                            "Why is the output exactly the target's? Watch it: tiny models with a vocabulary of 8, the "
                            "exact "
                            "law of the first two tokens enumerated from the target, and thousands of seeded "
                            "speculative samples "
                            "counted as they come, with a chi-square test. Plant a fault seen in public code and watch "
                            "it fail."
                        )
                        with gr.Row():
                            ui["lab_kind"] = CheckedDropdown(list(LAB_KINDS), value="different", label="drafter")
                            ui["lab_fault"] = CheckedDropdown(
                                [(f.name, k) for k, f in FAULTS.items()], value="none", label="planted fault"
                            )
                        with gr.Row():
                            ui["lab_temperature"] = CheckedSlider(0.1, 2.0, value=1.0, step=0.1, label="temperature")
                            ui["lab_top_k"] = CheckedSlider(0, 8, value=5, step=1, label="top-k (0 = off)")
                            ui["lab_top_p"] = CheckedSlider(0.1, 1.0, value=1.0, step=0.05, label="top-p")
                            ui["lab_gamma"] = CheckedSlider(1, 8, value=3, step=1, label="gamma")
                            ui["lab_runs"] = CheckedSlider(500, LAB_RUNS_MAX, value=2000, step=500, label="samples")
                        ui["lab_button"] = gr.Button("Run the experiment", variant="primary", elem_id="sv-lab-run")
                        ui["lab_verdict"] = gr.HTML(elem_id="sv-lab-verdict")
                        ui["lab_plot"] = gr.Plot(lab_figure(None), show_label=False, elem_id="sv-lab-plot")
                    with gr.Tab("Explanation", id="explain"):
                        gr.Markdown(explanation(), latex_delimiters=latex, elem_id="sv-explain")
                # The numbers with their denominators, under the tabs: the headline above the output gives the
                # speedup, so the charts come right after the output (they had started below the fold at 1920 x 1080).
                ui["stats"] = gr.HTML(elem_id="sv-stats")
            with gr.Column(scale=2, min_width=320, elem_id="sv-settings"):
                # gamma and temperature first: the two a class changes most, in view under Generate
                ui["gamma"] = CheckedSlider(
                    *GAMMA_RANGE, value=DEFAULTS["gamma"], step=1, label="gamma (drafted tokens per round)"
                )
                ui["temperature"] = CheckedSlider(
                    *TEMPERATURE_RANGE,
                    value=DEFAULTS["temperature"],
                    step=0.05,
                    label="temperature (0 = greedy)",
                    info=GREEDY_NOTE,
                )
                ui["drafter_kind"] = CheckedRadio(
                    DRAFTER_CHOICES,
                    value=DEFAULTS["drafter_kind"],
                    label="drafter",
                    elem_id="sv-drafter-kind",
                    info="the pair's drafter model; the same proposing its most likely token (q one-hot: "
                    "kept with probability p, exact too); prompt lookup (copies from earlier text); the target's own "
                    "early layers; "
                    "the target itself with int8 weights (CPU only); "
                    "EAGLE: one layer reading the target's own features (Li et al. 2024; the English pair); "
                    "the drafter model with its own tokenizer (pairs across tokenizers, such as cross)",
                )
                ui["gamma_schedule"] = CheckedDropdown(
                    SCHEDULE_CHOICES,
                    value=DEFAULTS["gamma_schedule"],
                    label="gamma schedule",
                    info="constant: gamma drafts every round; path confidence: up to gamma, stopping once the "
                    "product of the drafter's largest q over the round's drafts falls below "
                    f"{DEFAULT_THRESHOLDS['path']}; the others set gamma each round (the first round uses the "
                    "slider's gamma)",
                    elem_id="sv-schedule",
                )
                ui["tree"] = gr.Dropdown(
                    TREE_CHOICES,
                    value="chain",
                    label="token tree",
                    elem_id="sv-tree",
                    info="draft a tree of candidates per round (shape: branching per depth, or EAGLE-2's dynamic "
                    "tree under a node budget), verified in one target pass; gamma is then unused",
                )
                with gr.Row():
                    ui["top_k"] = CheckedNumber(
                        value=DEFAULTS["top_k"], minimum=0, maximum=TOP_K_MAX, precision=0, label="top-k (0 = off)"
                    )
                    ui["top_p"] = CheckedSlider(0.05, 1.0, value=DEFAULTS["top_p"], step=0.05, label="top-p (1 = off)")
                ui["repetition_penalty"] = CheckedSlider(
                    *PENALTY_RANGE,
                    value=DEFAULTS["repetition_penalty"],
                    step=0.05,
                    label="repetition penalty (1 = off)",
                    elem_id="sv-penalty",
                    info="transformers' repetition penalty, applied to q and p alike at every position",
                )
                with gr.Row():
                    ui["max_new_tokens"] = CheckedSlider(
                        *MAX_NEW_TOKENS_RANGE, value=DEFAULTS["max_new_tokens"], step=1, label="max new tokens"
                    )
                    # A lecture's setting: a run that finishes while the class watches (set in the browser, no request)
                    ui["quick"] = gr.Button(
                        f"Quick ({QUICK_TOKENS} tokens)", size="sm", scale=0, min_width=120, elem_id="sv-quick"
                    )
                    ui["seed"] = CheckedNumber(
                        value=DEFAULTS["seed"], minimum=0, maximum=SEED_MAX, precision=0, label="seed"
                    )
        _wire(ui)
        demo.unload(session_ended)  # a visitor's files go when the session ends
    # api_open=False: every event goes through the queue and its admission rules (specviz.ui.guard.admission);
    # Gradio's default off a Space serves POST /gradio_api/run/<api> at once, outside every limit.
    demo.queue(max_size=max_queue, default_concurrency_limit=1, api_open=False)
    admit(demo)
    # the libraries, the warmed pairs and the page live as long as the server: later collections skip them
    freeze_long_lived()
    return demo


def _wire(ui: dict) -> None:
    """Every event: its handler, inputs and outputs (by name), and the queue it waits in."""

    def of(*names):
        return [ui[n] for n in names]

    def on(trigger, fn, inputs, outputs, **kwargs):
        """``trigger(fn)`` with a handler returning dicts keyed by ``outputs``."""
        return trigger(keyed(fn, outputs), inputs=of(*inputs), outputs=of(*outputs), **kwargs)

    controls = (
        "pair_name",
        "prompt",
        "gamma",
        "temperature",
        "top_k",
        "top_p",
        "max_new_tokens",
        "seed",
        "chat",
        "custom_drafter",
        "custom_target",
    )
    # Each kind of work waits in a queue of its own with its own limit (and, in specviz.ui.guard.admission,
    # its own bound on waiting jobs), so no kind can starve another: the main Generate and /run share
    # "device"; sweeps, comparisons and batches "long"; the lab "lab"; loads "load"; exports "export".
    device = dict(concurrency_limit=CONCURRENCY, concurrency_id="device")
    long = dict(concurrency_limit=SLOTS["long"].n, concurrency_id="long")
    # Views of a recording are cheap: they do not wait behind a generation.
    view = dict(concurrency_limit=None, show_progress="hidden")

    def long_job(trigger, fn, inputs, outputs, cap_s, **kwargs):
        """A long job: keyed outputs, the "long" slot held by its thread, a wall-clock cap. The job ends itself
        at its own cap within a round and says so (``specviz.ui.running.halting``); ``cap_s``, half as long again, is
        the backstop for a round that never ends."""
        job = guarded("long", keyed(fn, outputs), cap_s, skip=skips(len(outputs)))
        return trigger(job, inputs=of(*inputs), outputs=of(*outputs), **long, **kwargs)

    run_event = on(
        ui["run"].click,
        generate,
        (*controls, "drafter_kind", "gamma_schedule", "repetition_penalty", "tree"),
        RUN_OUTPUTS,
        api_name="generate",
        **device,
    )
    stepped = of("replay_slider", "replay", "replay_tree")
    ui["prev_round"].click(replay_previous, of("recording", "replay_slider"), stepped, api_visibility="private", **view)
    ui["next_round"].click(replay_next, of("recording", "replay_slider"), stepped, api_visibility="private", **view)
    ui["replay_slider"].release(
        replay_show, of("recording", "replay_slider"), stepped[1:], api_visibility="private", **view
    )
    ui["replay_slider"].input(
        replay_show, of("recording", "replay_slider"), stepped[1:], api_visibility="private", **view
    )
    ui["quick"].click(
        None, None, ui["max_new_tokens"], js=f"() => {QUICK_TOKENS}", api_visibility="private", queue=False
    )
    moved = ("whatif_note", "whatif_plot")
    for key in ("alpha", "gamma", "c", "v"):
        on(
            ui[f"whatif_{key}"].release,
            whatif,
            ("whatif_alpha", "whatif_gamma", "whatif_c", "whatif_v", "recording"),
            moved,
            api_visibility="private",
            **view,
        )
    on(
        ui["whatif_from_run"].click,
        whatif_from_run,
        ("recording",),
        ("whatif_alpha", "whatif_gamma", "whatif_c", "whatif_v", *moved),
        api_visibility="private",
        **view,
    )
    sweep_event = long_job(
        ui["sweep_button"].click,
        run_sweep,
        (
            "pair_name",
            "prompt",
            "temperature",
            "top_k",
            "top_p",
            "max_new_tokens",
            "seed",
            "recording",
            "chat",
            "custom_drafter",
            "custom_target",
            "repetition_penalty",
            "drafter_kind",
            "gamma_schedule",
        ),
        ("sweep_plot", "sweep_status", "recording", "download", "export_file"),
        SWEEP_SECONDS_MAX * 1.5,
        api_name="sweep",
    )
    run_event.failure(
        keyed(failed, RUN_OUTPUTS), None, of(*RUN_OUTPUTS), api_visibility="private", show_progress="hidden"
    )
    lab_event = ui["lab_button"].click(
        guarded("lab", run_lab, LAB_SECONDS_MAX * 1.5, skip=skips(2), background=True),
        of("lab_kind", "lab_fault", "lab_temperature", "lab_top_k", "lab_top_p", "lab_gamma", "lab_runs"),
        of("lab_plot", "lab_verdict"),
        api_name="lab",
        concurrency_limit=SLOTS["lab"].n,
        concurrency_id="lab",
        show_progress="hidden",
    )
    gr.api(run_api, api_name="run", **device)
    compare_event = long_job(
        ui["compare_button"].click,
        run_compare,
        (*controls, "gamma_schedule", "repetition_penalty", "tree"),
        ("compare_view", "compare_plot"),
        COMPARE_SECONDS_MAX * 1.5,
        api_name="compare",
    )
    batch_event = long_job(
        ui["batch_button"].click,
        run_batch,
        (
            "pair_name",
            "batch_prompts",
            "batch_size",
            "gamma",
            "temperature",
            "top_k",
            "top_p",
            "max_new_tokens",
            "seed",
            "chat",
            "custom_drafter",
            "custom_target",
            "drafter_kind",
            "gamma_schedule",
            "repetition_penalty",
        ),
        ("batch_view", "batch_plot", "batch_status"),
        BATCH_SECONDS_MAX * 1.5,
        api_name="batch",
    )
    # Stop asks a run, sweep, comparison, batch or lab experiment to end after its step under way; each then shows what
    # it did and says it was stopped (specviz.ui.page.state). Then the event after it cancels what is left: a job of
    # this session still waiting in the queue, or one that did not end in time.
    on(ui["stop"].click, stop, (), RUN_OUTPUTS, api_name="stop", **view).then(
        lambda: None,
        None,
        None,
        cancels=[run_event, sweep_event, compare_event, batch_event, lab_event],
        api_visibility="private",
        show_progress="hidden",
    )
    ui["pair_name"].change(pair_info, ui["pair_name"], ui["pair_info"], api_visibility="private", **view)
    ui["pair_name"].change(
        example_boxes, ui["pair_name"], of("english_examples", "code_examples"), api_visibility="private", **view
    )
    ui["pair_name"].change(
        kind_for_pair, of("pair_name", "drafter_kind"), ui["drafter_kind"], api_visibility="private", **view
    )
    ui["pair_name"].change(prompt_for_pair, of("pair_name", "prompt"), ui["prompt"], api_visibility="private", **view)
    ui["pair_name"].change(chat_for_pair, ui["pair_name"], ui["chat"], api_visibility="private", **view)
    ui["race_button"].click(start_race, of("recording", "pace"), ui["race"], api_visibility="private", **view)
    # Loading runs in the queue with its own limit, so uploads cannot starve generation.
    loads = dict(show_progress="hidden", concurrency_limit=LOAD_CONCURRENCY, concurrency_id="load")
    restore = dict(
        fn=keyed(restore_controls, RESTORED),
        inputs=ui["recording"],
        outputs=of(*RESTORED),
        api_visibility="private",
        show_progress="hidden",
    )
    # Each load first says, beside its button, that it is loading; then what it loaded, or that it was refused.
    note = dict(outputs=ui["load_status"], api_visibility="private", show_progress="hidden", queue=False)
    refused = dict(fn=load_failed_note, inputs=None, **note)
    uploading = ui["upload"].upload(loading_note, None, **note)
    loaded = on(uploading.then, load_recording, ("upload",), RUN_OUTPUTS, api_name="load_recording", **loads)
    loaded.success(**restore)
    loaded.failure(**refused)
    # The drop area is emptied after every load, good or refused, so the next file can go in.
    clear = dict(fn=lambda: None, inputs=None, outputs=ui["upload"], api_visibility="private", show_progress="hidden")
    loaded.success(**clear)
    loaded.failure(**clear)
    prepared = ui["example_button"].click(loading_note, ui["example"], **note)
    loaded = on(prepared.then, load_example, ("example",), RUN_OUTPUTS, api_name="load_prepared", **loads)
    loaded.success(**restore)
    loaded.failure(**refused)
    ui["export_button"].click(
        export_recording,
        ui["recording"],
        ui["export_file"],
        api_name="export",
        show_progress="hidden",
        concurrency_limit=EXPORT_CONCURRENCY,
        concurrency_id="export",
    )
