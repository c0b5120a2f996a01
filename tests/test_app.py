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

DEFAULTS = dict(
    pair_name="embedded",
    prompt="def is_prime(n):",
    gamma=4,
    temperature=0.7,
    top_k=40,
    top_p=0.95,
    max_new_tokens=48,
    seed=0,
)


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
    tokens, stats, acceptance, timeline, status, *rest = call(client)
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
    text = autoregressive_generate(
        ids,
        embedded.target,
        sampling=Sampling(0.0),
        max_new_tokens=32,
        eos_token_id=embedded.eos_token_id,
        tokenizer=embedded.tokenizer,
    ).output_text
    import html
    import re

    shown = html.unescape(
        re.sub(
            r"<[^>]+>",
            "",
            re.sub(
                r'<span class="sv-(rejected|prompt)"[^>]*>.*?</span>|<details class="sv-prompt-details".*?</details>',
                "",
                tokens,
                flags=re.S,
            ),
        )
    ).replace("\u2400", "")
    assert shown == text


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(prompt="   "), "prompt is empty"),
        # Number controls check their bounds before the handler runs, naming the control and its range.
        (dict(gamma=0), "gamma.*must be from 1 to 16"),
        (dict(gamma=17), "gamma.*must be from 1 to 16"),
        (dict(temperature=-0.5), "temperature.*must be from 0.0 to 2.0"),
        (dict(max_new_tokens=0), "max new tokens must be from 1 to 256"),
        (dict(top_k=-3), "top-k.*must be from 0 to 1000"),
        (dict(seed=-1), "seed must be from 0 to 9223372036854775807"),
        (dict(seed=2**70), "seed must be from 0 to 9223372036854775807"),
        (dict(pair_name="SmolLM2-135M-Instruct -> SmolLM2-360M-Instruct"), "cannot be reached|could not be"),
        (dict(pair_name="no such pair"), "Model pair.*must be one of"),
    ],
)
def test_bad_input_gets_a_message_and_the_app_serves_the_next_call(client, changes, message):
    import re

    with pytest.raises(AppError) as err:
        call(client, **changes)
    assert re.search(message, err.value.message), err.value.message
    tokens, *_ = call(client, max_new_tokens=8)
    assert "sv-" in tokens


def test_outputs_include_replay_theory_race_and_a_download(client):
    import json

    out = call(client, max_new_tokens=24)
    # then the replay's tree (None for a chain)
    first_round, replay, speedup, histogram, position, sweep, race, download = out[5:13]
    assert int(first_round["value"]) == 1  # a finished run replays from round 1
    assert "Round 1 of " in replay and "min(1, p/q)" in replay
    for fig in (speedup, histogram, position):
        assert fig["type"] == "plotly"
    assert (
        "Thm 3.8" in speedup["plot"]
        and "optimal gamma" in speedup["plot"]
        and "measured verify cost" in speedup["plot"]
    )
    assert "sv-race-token" in race
    from specviz.recording import Recording

    assert download["interactive"]
    download = download["value"]  # the client fetched the file into its own folder
    rec = Recording.load(download)
    assert len(rec.speculative.output_ids) == 24 and rec.baseline is not None
    assert json.loads(open(download).read())["format"] == "specviz-recording"


def test_sweep_runs_gamma_1_to_8(client):
    from specviz.recording import Recording

    call(client, max_new_tokens=8)
    figure, status, download, _ = client.predict("embedded", "def add(a, b):", 0.7, 40, 0.95, 16, 0, api_name="/sweep")
    assert status.startswith("Sweep done")
    assert "whole run (prefill included)" in figure["plot"]  # the points' name (plotly's JSON writes / as \\/)
    # The download now holds the run shown and the sweep (README: "trace, baseline and sweep").
    rec = Recording.load(download["value"] if isinstance(download, dict) else download)
    assert len(rec.speculative.output_ids) == 8 and [p.gamma for p in rec.sweep.points] == list(range(1, 9))


def test_prepared_recording_and_bad_uploads(client, tmp_path):
    from gradio_client import handle_file

    from specviz.demo import _examples

    out = client.predict(_examples()[0], api_name="/load_prepared")
    assert "sv-accepted" in out[0] and out[4].startswith("Replaying a recording")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "specviz-recording", "speculative": {"mode": "speculative"}}')
    with pytest.raises(AppError) as err:
        client.predict(handle_file(str(bad)), api_name="/load_recording")
    assert "cannot be replayed" in err.value.message and "Field required" in err.value.message
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x00\xff not json")
    with pytest.raises(AppError, match="cannot be replayed"):
        client.predict(handle_file(str(garbage)), api_name="/load_recording")
    good = tmp_path / "good.json"
    from specviz.demo import RECORDINGS

    good.write_bytes((RECORDINGS / f"{_examples()[0]}.json").read_bytes())
    out = client.predict(handle_file(str(good)), api_name="/load_recording")
    assert "sv-" in out[0]


def test_out_of_memory_mid_run_is_a_message_then_the_next_run_works(client, monkeypatch):
    import torch

    from specviz.engine import rejection

    real = rejection.draft_token
    calls = {"n": 0}

    def oom_on_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(rejection.EXACT, "draft_token", oom_on_third)
    with pytest.raises(AppError) as err:
        call(client, max_new_tokens=16)
    assert "Out of memory" in err.value.message and "still running" in err.value.message
    monkeypatch.setattr(rejection.EXACT, "draft_token", real)
    tokens, *_ = call(client, max_new_tokens=8)
    assert "sv-" in tokens


@pytest.mark.parametrize(
    "error, message",
    [
        ("gated", "is gated"),
        ("missing", "not found"),
        ("offline", "cannot be reached"),
        ("tokenizers", "different tokenizers"),
        ("too large", "limit"),
    ],
)
def test_pair_failures_reach_the_visitor_then_the_app_serves(client, monkeypatch, error, message):
    """Each PairError the loader raises (tested one by one in test_pair.py) is shown as it is."""
    import specviz.ui.running.pairs as pairs_ui
    from specviz.pair import PairError

    texts = {
        "gated": "'meta-llama/Llama-3.2-3B-Instruct' is gated: accept its licence on the hub and set HF_TOKEN",
        "missing": "'x/y' was not found on the model hub",
        "offline": "'x/y' is not in the local cache and the model hub cannot be reached; use the embedded pair",
        "tokenizers": "the drafter 'a' and the target 'b' use different tokenizers",
        "too large": "'x/y' has 70.0 GB of weights; this server's limit is 16 GB",
    }

    def refuse(*args, **kwargs):
        raise PairError(texts[error])

    monkeypatch.setattr(pairs_ui, "load_pair", refuse)
    with pytest.raises(AppError) as err:
        call(client, pair_name="gpt2 -> gpt2-large")
    assert message in err.value.message
    monkeypatch.undo()
    tokens, *_ = call(client, max_new_tokens=8)
    assert "sv-" in tokens


def test_a_run_cancelled_mid_stream_leaves_the_app_serving(client):
    import time

    job = client.submit(*(DEFAULTS | dict(max_new_tokens=256, gamma=1)).values(), api_name="/generate")
    deadline = time.monotonic() + 60
    while not job.outputs() and time.monotonic() < deadline:
        time.sleep(0.05)
    job.cancel()
    tokens, *_, status = call(client, max_new_tokens=8)[:5]
    assert "sv-" in tokens and status.startswith("Done")


def test_an_oversized_upload_is_refused(client, tmp_path):
    from gradio_client import handle_file

    from specviz.recording import MAX_BYTES

    big = tmp_path / "big.json"
    big.write_bytes(b"{" + b" " * (MAX_BYTES + 10) + b"}")
    with pytest.raises(Exception) as err:
        client.predict(handle_file(str(big)), api_name="/load_recording")
    assert "large" in str(err.value).lower() or "size" in str(err.value).lower() or "413" in str(err.value), err.value
    tokens, *_ = call(client, max_new_tokens=8)
    assert "sv-" in tokens


FUZZ = ["NaN", "Infinity", "-Infinity", "1e300", str(2**70), str(-(2**70)), '"seven"', "null", "[4]", "true"]


def raw_call(client, args: dict) -> str:
    """Call /generate over HTTP with a hand-written JSON body (NaN and Infinity are sent as the
    literals a client can send, which gradio_client refuses to encode); return the event stream text."""
    import httpx

    body = (
        '{"data": ['
        + ", ".join(
            v if isinstance(v, str) and k.startswith("raw:") else __import__("json").dumps(v) for k, v in args.items()
        )
        + "]}"
    )
    base = client.src.rstrip("/") + "/gradio_api/call/generate"
    event = httpx.post(base, content=body, headers={"content-type": "application/json"}, timeout=60).json()["event_id"]
    return httpx.get(f"{base}/{event}", timeout=120).text


@pytest.mark.parametrize(
    "control", ["gamma", "temperature", "top_k", "top_p", "max_new_tokens", "seed", "repetition_penalty"]
)
def test_api_fuzz_every_control_gets_a_message_and_the_app_keeps_serving(client, control):
    """NaN, infinities, huge, wrong-typed and missing values for each control, sent as raw JSON:
    each is answered with an error event carrying a message that names the control or the
    bound it broke (Gradio's own check or the handler's), and the next good request is served."""
    import re

    for value in FUZZ:
        if control in ("temperature", "top_p", "repetition_penalty") and value == "true":
            continue  # JSON true is the number 1 to Gradio's slider: in range for these two
        args = DEFAULTS | {
            "max_new_tokens": 4,
            "chat": True,
            "custom_drafter": "",
            "custom_target": "",
            "drafter_kind": "model",
            "gamma_schedule": "constant",
            "repetition_penalty": 1.0,
            "tree": "chain",
        }
        args = {("raw:" + k if k == control else k): (value if k == control else v) for k, v in args.items()}
        text = raw_call(client, args)
        assert "event: error" in text, (control, value, text[-300:])
        message = text.split("event: error", 1)[1]
        name = control.replace("_", "[-_ ]")
        assert re.search(rf"(?i){name}|minimum|maximum|number|value|float|int", message), (
            control,
            value,
            message[:300],
        )
    tokens, *_ = call(client, max_new_tokens=4)
    assert "sv-" in tokens


def test_a_prompt_with_a_lone_surrogate_gets_a_message(client):
    args = {("raw:prompt" if k == "prompt" else k): v for k, v in DEFAULTS.items()}
    text = raw_call(
        client,
        args
        | {
            "raw:prompt": '"def f():\\ud800"',
            "max_new_tokens": 4,
            "chat": True,
            "custom_drafter": "",
            "custom_target": "",
            "drafter_kind": "model",
            "gamma_schedule": "constant",
            "repetition_penalty": 1.0,
            "tree": "chain",
        },
    )
    assert "event: error" in text and "prompt" in text.split("event: error", 1)[1].lower(), text[-300:]


def test_run_endpoint_returns_the_trace_baseline_and_numbers(client):
    from specviz.trace import Trace

    out = client.predict("embedded", "def add(a, b):", 4, 0.0, 0, 1.0, 16, 0, True, api_name="/run")
    s = out["summary"]
    assert s["alpha"] == s["accepted"] / (s["accepted"] + s["rejected"])
    assert s["speedup"] > 0 and s["verify_cost"] > 0 and "decode_speedup_low" in s
    spec, base = Trace.from_dict(out["trace"]), Trace.from_dict(out["baseline"])
    assert spec.output_ids == base.output_ids  # greedy: the target's own tokens, equal work
    assert out["status"].startswith("Done")


def test_run_endpoint_drafts_a_token_tree(client):
    from specviz.trace import Trace

    out = client.predict(
        "embedded",
        "def add(a, b):",
        4,
        0.0,
        0,
        1.0,
        16,
        0,
        True,
        "model",
        "constant",
        1.0,
        "tree 2-2-2-1 (22 nodes)",
        api_name="/run",
    )
    spec, base = Trace.from_dict(out["trace"]), Trace.from_dict(out["baseline"])
    assert spec.has_tree and spec.output_ids == base.output_ids  # greedy: the tree keeps the target's own tokens
    s = out["summary"]
    assert s["tree"] and s["nodes_per_round"] == spec.drafted / len(spec.rounds) and s["predicted_speedup"] is None
    with pytest.raises(AppError) as err:
        client.predict(
            "embedded",
            "def add(a, b):",
            4,
            0.0,
            0,
            1.0,
            4,
            0,
            True,
            "model",
            "constant",
            1.0,
            "tree <b>9</b>",
            api_name="/run",
        )
    assert "token tree must be one of" in str(err.value) and "<b>" not in str(err.value)


def test_stop_ends_the_run_between_rounds_and_says_so(client):
    """Stop asks the run to end at its next round; the run's last outputs and Stop's say it was
    stopped (not Gradio's "Error" of a cancelled job, nor a status still streaming), with no
    baseline numbers pending. Stop with nothing running says so."""
    import time

    job = client.submit(*(DEFAULTS | {"max_new_tokens": 256}).values(), api_name="/generate")
    deadline = time.monotonic() + 120
    while len(job.outputs()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    out = client.predict(api_name="/stop")
    assert out[4].startswith("Stopped by you after"), out[4]
    assert "needs the autoregressive baseline" in out[1] and "…" not in out[1]
    last = job.result()  # the run ended itself, without an error
    assert last[4] == out[4]
    nothing = client.predict(api_name="/stop")
    assert nothing[4].startswith("Nothing to stop")


@pytest.mark.parametrize("fault, verdict", [("none", "no evidence against exactness"), ("residual_is_p", "rejected")])
def test_exactness_lab_verdicts(client, fault, verdict):
    """The lab through the page's endpoint: the correct engine passes, a planted fault is rejected."""
    plot, html = client.predict("unlike", fault, 1.0, 0, 1.0, 1, 2000, api_name="/lab")
    assert verdict in html, html
    assert plot["type"] == "plotly"


@pytest.mark.parametrize("kind, schedule", [("ngram", "heuristic"), ("early-exit", "confidence"), ("model", "optimal")])
def test_each_drafter_kind_and_schedule_in_the_page_is_the_targets_greedy(client, embedded, kind, schedule):
    from specviz import Sampling, autoregressive_generate

    tokens, stats, acceptance, *_ = call(
        client,
        temperature=0,
        max_new_tokens=24,
        chat=True,
        custom_drafter="",
        custom_target="",
        drafter_kind=kind,
        gamma_schedule=schedule,
    )
    ids = embedded.tokenizer(DEFAULTS["prompt"], add_special_tokens=False)["input_ids"]
    want = autoregressive_generate(
        ids,
        embedded.target,
        sampling=Sampling(0.0),
        max_new_tokens=24,
        eos_token_id=embedded.eos_token_id,
        tokenizer=embedded.tokenizer,
    ).output_text
    import html
    import re

    shown = html.unescape(re.sub(r'<span class="sv-(rejected|discarded)[^"]*"[^>]*>.*?</span>', "", tokens))
    assert "alpha" in stats and acceptance["type"] == "plotly"
    assert want.strip().split()[0] in shown  # the greedy text is on screen (exact equality: tests/test_drafters.py)


def test_unknown_drafter_kind_gets_a_message(client):
    # The page's menus refuse values outside their choices (gradio names the allowed ones); /run checks them itself.
    with pytest.raises(AppError, match="drafter must be one of.*early-exit"):
        call(
            client,
            chat=True,
            custom_drafter="",
            custom_target="",
            drafter_kind="<b>eagle</b>",
            gamma_schedule="constant",
        )
    with pytest.raises(AppError, match="gamma schedule must be one of"):
        call(client, chat=True, custom_drafter="", custom_target="", drafter_kind="ngram", gamma_schedule="fastest")
    with pytest.raises(AppError, match="gamma schedule must be one of"):
        client.predict("embedded", "def add(a, b):", 4, 0.0, 0, 1.0, 8, 0, True, "ngram", "fastest", api_name="/run")


def test_compare_drafters_shows_every_kind(client):
    html, plot = client.predict(
        "embedded", "x = 1\ny = 2\nx = 1\ny =", 4, 0.0, 0, 1.0, 24, 0, True, "", "", "constant", api_name="/compare"
    )
    for label in ("drafter model", "prompt lookup", "early exit", "quantized target (int8)"):
        assert label in html
    # the quantized target too: the pair is on the CPU
    assert html.count("sv-compare-col") == 4 and "running" not in html
    assert "accepted / tested" in html and plot["type"] == "plotly"


def test_a_sampled_compare_shows_the_drafter_models_argmax_drafts_beside_its_sampled_ones(client):
    html, _ = client.predict(
        "embedded", "x = 1\ny = 2\nx = 1\ny =", 4, 1.0, 0, 1.0, 12, 0, True, "", "", "constant", api_name="/compare"
    )
    assert "drafter model, its argmax" in html and html.count("sv-compare-col") == 5


def test_batch_endpoint_decodes_rows_and_measures_batch_sizes(client):
    lanes, plot, status = client.predict(
        "embedded",
        "def is_prime(n):\nclass Stack:\\n    def __init__(self):",
        2,
        4,
        0.0,
        0,
        1.0,
        12,
        0,
        True,
        "",
        "",
        "ngram",
        "constant",
        api_name="/batch",
    )
    assert lanes.count("<tr>") == 3  # the header and two rows
    assert "batch sizes 1, 2" in status and plot["type"] == "plotly"


@pytest.mark.parametrize(
    "field, args, message",
    [
        ("prompts", {"prompts_text": "\n".join(["a"] * 9)}, "at most 8"),
        ("prompts", {"prompts_text": "  "}, "empty"),
        ("batch size", {"batch_size": 9}, "must be from 1 to 8"),
    ],
)
def test_batch_endpoint_refuses_bad_input_with_a_message(client, field, args, message):
    values = (
        dict(
            pair_name="embedded",
            prompts_text="def f():",
            batch_size=2,
            gamma=4,
            temperature=0.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=4,
            seed=0,
            chat=True,
            custom_drafter="",
            custom_target="",
            drafter_kind="model",
            gamma_schedule="constant",
        )
        | args
    )
    with pytest.raises(AppError) as err:
        client.predict(*values.values(), api_name="/batch")
    assert message in err.value.message.lower() or message in str(err.value).lower(), (field, err.value)


def test_the_repetition_penalty_control_gives_transformers_greedy_output(client, embedded):
    """Greedy with a penalty through the page's API equals target.generate(repetition_penalty=...)."""
    import torch

    out = client.predict(
        "embedded", "def is_prime(n):", 4, 0.0, 0, 1.0, 32, 0, True, "model", "constant", 1.3, api_name="/run"
    )
    ids = embedded.tokenizer("def is_prime(n):", add_special_tokens=False)["input_ids"]
    ref = embedded.target.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=32,
        repetition_penalty=1.3,
        eos_token_id=embedded.eos_token_id,
        pad_token_id=embedded.eos_token_id,
    )
    assert out["trace"]["output_ids"] == ref[0, len(ids) :].tolist()
    assert out["trace"]["settings"]["sampling"]["repetition_penalty"] == 1.3


def test_stop_cancels_runs_sweeps_comparisons_and_batches(client):
    """After Stop has asked the jobs to end, the event chained after it cancels each of the device's
    jobs still there (the page's config, as the browser reads it)."""
    deps = client.config["dependencies"]
    stop = next(d for d in deps if d.get("api_name") == "stop")
    after = [d for d in deps if d.get("trigger_after") == stop["id"]]
    # Gradio adds a cancelling event beside the one that names cancels
    ids = {i for d in deps if any(d["targets"] == a["targets"] for a in [stop, *after]) for i in d.get("cancels") or []}
    ids |= {i for d in after for i in d.get("cancels") or []}
    cancelled = {d["api_name"] for d in deps if d["id"] in ids}
    assert cancelled == {"generate", "sweep", "compare", "batch", "lab"}, cancelled


def test_stop_during_a_comparison_leaves_the_app_serving(client):
    import time

    job = client.submit(
        "embedded", "def is_prime(n):", 1, 0.7, 40, 0.95, 256, 0, True, "", "", "constant", api_name="/compare"
    )
    # Under way once its first output came (what runs, said at once, then the device's rounds). A job that reports
    # progress goes from STARTING to PROGRESS and never shows PROCESSING: waiting for that alone took the whole
    # deadline.
    deadline = time.monotonic() + 60
    while not job.outputs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.outputs(), f"the comparison did not start within 60 s ({job.status().code})"
    time.sleep(1.0)  # its device work under way
    client.predict(api_name="/stop")
    job.cancel()  # the page's Stop also fires a cancelling event; a client cancels its own job
    deadline = time.monotonic() + 120  # the step under way finishes first
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job.done()
    tokens, *_ = call(client, max_new_tokens=8)
    assert "sv-" in tokens


def test_sweep_runs_the_drafter_and_schedule_the_controls_say(client):
    figure, status, *_ = client.predict(
        "embedded",
        "x = 1\ny = 2\nx = 1\ny =",
        0.0,
        0,
        1.0,
        12,
        0,
        True,
        "",
        "",
        1.0,
        "ngram",
        "heuristic",
        api_name="/sweep",
    )
    assert status.startswith("Sweep done (prompt lookup, heuristic gamma schedule)"), status
    assert "prompt lookup, heuristic gamma schedule" in figure["plot"]


def test_the_sweep_is_sized_for_its_nine_runs():
    from specviz import Sampling
    from specviz.serving.gpu_duration import estimate_seconds, pair_params
    from specviz.serving.gpu import clamp_duration
    from specviz.ui.running.device import sweep_seconds
    from specviz.ui.guard.limits import SWEEP_GAMMAS
    from specviz.ui.guard.request import RunRequest

    req = RunRequest("gpt2 -> gpt2-large", "x", 8, Sampling(0.7, 40, 0.95), 64, 0)
    want = estimate_seconds(None, 64, SWEEP_GAMMAS, baseline_runs=9, params=pair_params("gpt2 -> gpt2-large"))
    assert sweep_seconds(req) == clamp_duration(want)
    assert want > estimate_seconds(None, 64, SWEEP_GAMMAS, baseline_runs=1, params=pair_params("gpt2 -> gpt2-large"))
