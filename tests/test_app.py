"""The demo end to end: launched in this process, driven through gradio_client."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from tests.conftest import free_port  # noqa: E402

pytestmark = pytest.mark.slow

DEFAULTS = dict(pair_name="embedded", prompt="def is_prime(n):", gamma=4, temperature=0.7, top_k=40, top_p=0.95, max_new_tokens=48, seed=0)


@pytest.fixture(scope="module")
def client():
    from specviz.demo import build_demo, launch_kwargs

    demo = build_demo()
    kwargs = launch_kwargs(free_port())
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, **kwargs)
    try:
        yield Client(url, verbose=False)
    finally:
        demo.close()


def call(client, **changes):
    args = DEFAULTS | changes
    return client.predict(*args.values(), api_name="/generate")


def test_generate_returns_coloured_tokens_stats_and_charts(client):
    tokens, stats, acceptance, timeline, status = call(client)
    assert "sv-accepted" in tokens or "sv-correction" in tokens
    assert "sv-correction" in tokens or "sv-bonus" in tokens
    assert "q(x) =" in tokens and "u =" in tokens
    for label in ("acceptance rate", "tokens per round", "speedup", "cost coefficient c"):
        assert label in stats
    assert "…" not in stats  # every number filled in at the end
    assert acceptance["type"] == "plotly" and "accepted" in acceptance["plot"]
    assert timeline["type"] == "plotly" and "autoregressive" in timeline["plot"]
    assert status.startswith("Done")


def test_greedy_in_the_app_is_the_targets_greedy(client, embedded):
    from specviz import Sampling, autoregressive_generate

    tokens, *_ = call(client, temperature=0, max_new_tokens=32)
    ids = embedded.tokenizer(DEFAULTS["prompt"], add_special_tokens=False)["input_ids"]
    text = autoregressive_generate(ids, embedded.target, sampling=Sampling(0.0), max_new_tokens=32, eos_token_id=embedded.eos_token_id, tokenizer=embedded.tokenizer).output_text
    import html, re

    shown = html.unescape(re.sub(r"<[^>]+>", "", re.sub(r'<span class="sv-(rejected|prompt)"[^>]*>.*?</span>', "", tokens, flags=re.S))).replace("\u2400", "")
    assert shown == text


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(prompt="   "), "prompt is empty"),
        # Gradio checks slider and dropdown bounds before the handler runs, with its own message.
        (dict(gamma=0), "less than minimum value 1"),
        (dict(gamma=17), "greater than maximum value 16"),
        (dict(temperature=-0.5), "less than minimum value 0"),
        (dict(max_new_tokens=0), "less than minimum value 1"),
        (dict(top_k=-3), "less than minimum value 0"),
        (dict(seed=-1), "less than minimum value 0|seed must be"),
        (dict(pair_name="SmolLM2-135M -> SmolLM2-360M"), "cannot be reached|could not be"),
        (dict(pair_name="no such pair"), "not in the list of choices"),
    ],
)
def test_bad_input_gets_a_message_and_the_app_serves_the_next_call(client, changes, message):
    import re

    with pytest.raises(AppError) as err:
        call(client, **changes)
    assert re.search(message, err.value.message), err.value.message
    tokens, *_ = call(client, max_new_tokens=8)
    assert "sv-" in tokens
