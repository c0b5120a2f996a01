"""The Gradio page: controls in, engine, trace, views out.

Only this module and ``app.py`` know Gradio. Every failure a visitor can cause is turned
into a ``gr.Error`` with a clear message, and the app keeps serving the next visitor.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import gradio as gr  # noqa: E402
import torch  # noqa: E402

from specviz import Sampling, autoregressive_generate, speculative_stream  # noqa: E402
from specviz.pair import EMBEDDED, PRESETS, PairError, load_pair  # noqa: E402
from specviz.views import acceptance_figure, legend_html, stats_html, timeline_figure, tokens_html  # noqa: E402

# Caps shown in the UI and enforced again in the handler (a client can bypass sliders).
GAMMA_RANGE = (1, 16)
TEMPERATURE_RANGE = (0.0, 2.0)
MAX_NEW_TOKENS_RANGE = (1, 256)
TOP_K_MAX = 1000
PROMPT_CHARS_MAX = 2000
# Redraw the streamed text at most this often (ms): drawing is not free for the browser.
STREAM_INTERVAL_MS = 80

DEFAULTS = dict(gamma=4, temperature=0.7, top_k=40, top_p=0.95, max_new_tokens=128, seed=0)
# Prompts end at a colon, not a newline: the tokenizer merges a newline with the indentation
# that follows, so the models continue best from there.
EXAMPLES = [
    "def is_prime(n):",
    "class Stack:\n    def __init__(self):",
    "import os\n\n\ndef read_lines(path):",
    "    def __repr__(self):",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
]

INTRO = """\
# specviz — speculative decoding, round by round
A small **drafter** proposes `gamma` tokens; the large **target** scores them all in one forward pass. Each draft x is
accepted when u < min(1, p(x)/q(x)); the first rejected one is replaced by a **correction** sampled from
norm(max(0, p − q)); when every draft is accepted a **bonus** token comes from p. The output is distributed exactly as
the target's own (Leviathan et al. 2023; Chen et al. 2023). Temperature 0 is greedy: the output is the target's greedy text.
"""


def _check(prompt: str, gamma, temperature, top_k, top_p, max_new_tokens, seed) -> Sampling:
    """Validate the controls; raise gr.Error with what to change."""
    if not prompt or not prompt.strip():
        raise gr.Error("The prompt is empty: type some text (or pick an example) to continue.", title="Empty prompt")
    if len(prompt) > PROMPT_CHARS_MAX:
        raise gr.Error(f"The prompt has {len(prompt)} characters; the limit is {PROMPT_CHARS_MAX}.", title="Prompt too long")
    checks = [
        (gamma, *GAMMA_RANGE, "gamma"),
        (max_new_tokens, *MAX_NEW_TOKENS_RANGE, "max new tokens"),
        (top_k, 0, TOP_K_MAX, "top-k"),
    ]
    for value, lo, hi, name in checks:
        if value is None or int(value) != value or not lo <= value <= hi:
            raise gr.Error(f"{name} must be a whole number from {lo} to {hi}, got {value}.", title=f"{name} out of range")
    if temperature is None or not TEMPERATURE_RANGE[0] <= temperature <= TEMPERATURE_RANGE[1]:
        raise gr.Error(f"temperature must be from {TEMPERATURE_RANGE[0]} to {TEMPERATURE_RANGE[1]} (0 is greedy), got {temperature}.", title="Temperature out of range")
    if seed is None or int(seed) != seed or seed < 0:
        raise gr.Error(f"seed must be a whole number >= 0, got {seed}.", title="Bad seed")
    try:
        return Sampling(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
    except ValueError as err:
        raise gr.Error(str(err), title="Bad sampling settings") from err


def generate(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed):
    """Stream a speculative run round by round, then measure the autoregressive baseline.

    Yields (tokens HTML, stats HTML, acceptance figure, timeline figure, status Markdown).
    """
    sampling = _check(prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed)
    gamma, max_new_tokens, seed = int(gamma), int(max_new_tokens), int(seed)
    try:
        pair = load_pair(pair_name)
    except PairError as err:
        raise gr.Error(str(err), title="Model pair unavailable") from err
    ids = pair.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    common = dict(sampling=sampling, max_new_tokens=max_new_tokens, eos_token_id=pair.eos_token_id, seed=seed, tokenizer=pair.tokenizer)
    try:
        last_draw = 0.0
        spec = None
        for spec in speculative_stream(ids, pair.drafter, pair.target, gamma=gamma, **common):
            now = time.perf_counter() * 1000
            if now - last_draw >= STREAM_INTERVAL_MS and not spec.stop_reason:
                last_draw = now
                status = f"Speculative decoding: round {len(spec.rounds)}, {len(spec.output_ids)} tokens…"
                yield tokens_html(spec), stats_html(spec), gr.skip(), gr.skip(), status
        yield tokens_html(spec), stats_html(spec), acceptance_figure(spec), timeline_figure(spec), "Measuring the autoregressive baseline…"
        baseline = autoregressive_generate(ids, pair.target, **common)
    except ValueError as err:
        raise gr.Error(str(err), title="Cannot generate") from err
    except (MemoryError, torch.OutOfMemoryError) as err:
        raise gr.Error("Out of memory: ask for fewer tokens or pick a smaller pair.", title="Out of memory") from err
    except Exception as err:  # the app must keep serving; say what failed without a traceback
        raise gr.Error(f"Generation failed ({type(err).__name__}: {err}). The app is still running: try again or change the settings.", title="Generation failed") from err
    done = (
        f"Done: {len(spec.output_ids)} tokens in {len(spec.rounds)} rounds ({spec.stop_reason.replace('_', ' ')}). "
        f"Pair: {pair.name}, on {pair.device.type}."
    )
    yield tokens_html(spec), stats_html(spec, baseline), acceptance_figure(spec), timeline_figure(spec, baseline), done


def build_demo(preload: bool = True, max_queue: int | None = None) -> gr.Blocks:
    """The Blocks app.

    Args:
        preload: load the embedded pair now so the first Generate is quick.
        max_queue: waiting requests beyond which new ones are refused with Gradio's
            queue-full message (default: env ``SPECVIZ_MAX_QUEUE``, else 32).
    """
    if preload:
        pair = load_pair(EMBEDDED)
        # One short run pays the first-call costs before any visitor does.
        autoregressive_generate([pair.eos_token_id or 0], pair.target, max_new_tokens=2)
    with gr.Blocks(title="specviz: speculative decoding, round by round") as demo:
        gr.Markdown(INTRO)
        with gr.Row():
            with gr.Column(scale=2, min_width=320):
                pair_name = gr.Dropdown(list(PRESETS), value=EMBEDDED, label="Model pair (drafter -> target)",
                                        info="Hub pairs need access to the Hugging Face Hub.")
                prompt = gr.Textbox(value=EXAMPLES[0], label="Prompt", lines=5, max_length=PROMPT_CHARS_MAX)
                gr.Examples(EXAMPLES, inputs=prompt, label="Example prompts (Python: the embedded pair was trained on the standard library)")
                gamma = gr.Slider(*GAMMA_RANGE, value=DEFAULTS["gamma"], step=1, label="gamma (drafted tokens per round)")
                temperature = gr.Slider(*TEMPERATURE_RANGE, value=DEFAULTS["temperature"], step=0.05, label="temperature (0 = greedy)")
                with gr.Row():
                    top_k = gr.Number(value=DEFAULTS["top_k"], minimum=0, maximum=TOP_K_MAX, precision=0, label="top-k (0 = off)")
                    top_p = gr.Slider(0.05, 1.0, value=DEFAULTS["top_p"], step=0.05, label="top-p (1 = off)")
                with gr.Row():
                    max_new_tokens = gr.Slider(*MAX_NEW_TOKENS_RANGE, value=DEFAULTS["max_new_tokens"], step=1, label="max new tokens")
                    seed = gr.Number(value=DEFAULTS["seed"], minimum=0, precision=0, label="seed")
                run = gr.Button("Generate", variant="primary")
            with gr.Column(scale=3, min_width=400):
                gr.HTML(legend_html())
                tokens = gr.HTML(label="Output", elem_id="sv-output")
                status = gr.Markdown(elem_id="sv-status")
                stats = gr.HTML(elem_id="sv-stats")
        with gr.Row():
            acceptance_plot = gr.Plot(label="Drafts per round", show_label=False, elem_id="sv-acceptance")
            timeline_plot = gr.Plot(label="Tokens over time", show_label=False, elem_id="sv-timeline")
        run.click(
            generate,
            inputs=[pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed],
            outputs=[tokens, stats, acceptance_plot, timeline_plot, status],
            api_name="generate",
            concurrency_limit=1,
        )
    max_queue = max_queue if max_queue is not None else int(os.environ.get("SPECVIZ_MAX_QUEUE", "32"))
    demo.queue(max_size=max_queue, default_concurrency_limit=1)
    return demo


def launch_kwargs(port: int | None = None) -> dict:
    """Arguments for ``demo.launch``: local only, no share link, the app's theme."""
    return dict(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=port or int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        theme=gr.themes.Soft(),
        show_error=False,
    )
