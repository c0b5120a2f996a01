"""``python -m specviz.visitors.page_speed``: what the page adds to the engine's time, and /run's rate against bench's.

Launches the app as ``specviz.visitors.attack`` does (its own process and temporary folder, the page's default pair
loaded and warmed up before it serves), then, one job at a time and nothing else on the server:

1. **Generate** with the page's defaults (its first prompt, gamma, sampling, tokens and seed), ``--runs`` times, each
   in a fresh page session joined through the queue and read to its end as a browser does. For each: the wall time
   from the job's start (``process_starts``) to its last message, the updates streamed, and the engine's own time,
   the speculative run's and the baseline's ``total_ms`` summed (read from the run's JSON download, the recording the
   page keeps); their ratio is what the page adds (rendering, streaming, the final views).
2. **/run** with the same settings, ``--runs`` times: its wall time and the tokens/s of both runs it reports.
3. **bench's rate** on the same prompt and settings, in this process once the app has stopped: the speculative and
   autoregressive runs as ``specviz.measure.bench`` times them (``--runs`` each, after one warm-up), so /run's
   tokens/s compare with bench's on one machine minutes apart.

The figures depend on the machine; nothing here asserts them. Linux only. Takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from specviz.visitors.attack import App, messages
from specviz.visitors.sessions import client, fn_index
from specviz.recording import Recording
from specviz.ui.page.defaults import DEFAULT_PAIR, DEFAULTS, EXAMPLES

LOOPBACK = "127.0.0.1"


def settings(pair: str) -> dict:
    """The page's defaults for ``pair``: what a visitor who only presses Generate runs."""
    d = DEFAULTS
    return dict(
        pair=pair,
        prompt=EXAMPLES[0],
        gamma=d["gamma"],
        temperature=d["temperature"],
        top_k=d["top_k"],
        top_p=d["top_p"],
        max_new_tokens=d["max_new_tokens"],
        seed=d["seed"],
        chat=True,
    )


def generate_data(s: dict) -> list:
    """The Generate endpoint's values, in order."""
    return [
        s["pair"],
        s["prompt"],
        s["gamma"],
        s["temperature"],
        s["top_k"],
        s["top_p"],
        s["max_new_tokens"],
        s["seed"],
        s["chat"],
        "",
        "",
        "model",
        "constant",
        1.0,
        "chain",
    ]


def run_data(s: dict) -> list:
    """/run's values, in order."""
    return [
        s["pair"],
        s["prompt"],
        s["gamma"],
        s["temperature"],
        s["top_k"],
        s["top_p"],
        s["max_new_tokens"],
        s["seed"],
        s["chat"],
        "model",
        "constant",
        1.0,
        "chain",
    ]


def _download(http: httpx.Client, app: App, output: dict) -> Recording | None:
    """The run's JSON download named in Generate's last message, read back."""
    for value in output.get("data", []):
        file = value.get("value") if isinstance(value, dict) and isinstance(value.get("value"), dict) else value
        if isinstance(file, dict):
            url = file.get("url") or ""
            if url.endswith(".json"):
                return Recording.from_json(http.get(url).content)
    return None


def page_generate(http: httpx.Client, app: App, data: list) -> dict:
    """One Generate in a fresh page session: wall seconds (start to last message), updates, engine seconds."""
    session = uuid.uuid4().hex
    body = {
        "data": data,
        "fn_index": app.fn["generate"],
        "session_hash": session,
        "event_data": None,
        "trigger_id": None,
    }
    http.post(f"{app.url}/gradio_api/queue/join", json=body).raise_for_status()
    started, updates = None, 0
    for message in messages(http, app, session):
        if message.get("msg") == "process_starts":
            started = time.monotonic()
        elif message.get("msg") == "process_generating":
            updates += 1
        elif message.get("msg") == "process_completed":
            wall = time.monotonic() - started
            rec = _download(http, app, message.get("output") or {})
            if rec is None or rec.baseline is None:
                raise SystemExit(f"Generate did not finish: {str(message)[:400]}")
            engine = (rec.speculative.total_ms + rec.baseline.total_ms) / 1000
            return dict(
                wall=wall,
                updates=updates,
                engine=engine,
                tokens=len(rec.speculative.output_ids),
                speculative=rec.speculative.tokens_per_second,
                autoregressive=rec.baseline.tokens_per_second,
            )
    raise SystemExit("the result stream ended early")


def call_run(http: httpx.Client, app: App, data: list) -> dict:
    """One /run: wall seconds and the tokens/s it reports."""
    start = time.monotonic()
    r = http.post(f"{app.url}/gradio_api/call/run", json={"data": data})
    r.raise_for_status()
    result = None
    with http.stream("GET", f"{app.url}/gradio_api/call/run/{r.json()['event_id']}") as stream:
        event = None
        for line in stream.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "complete":
                result = json.loads(line[5:])[0]
    if result is None:
        raise SystemExit("/run did not complete")
    s = result["summary"]
    return dict(
        wall=time.monotonic() - start,
        speculative=s["speculative_tokens_per_second"],
        autoregressive=s["autoregressive_tokens_per_second"],
    )


def bench_rates(s: dict, runs: int) -> dict:
    """Tokens/s of the speculative and autoregressive runs as bench times them, on ``s``'s prompt and settings."""
    import torch

    from specviz.engine.sampling import Sampling
    from specviz.measure.bench import _runner
    from specviz.measure.common import timed
    from specviz.drafters import default_kind
    from specviz.pair import load_pair
    from specviz.ui.running.pairs import encode

    pair = load_pair(s["pair"])
    sampling = Sampling(temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"])
    ids = encode(pair, s["prompt"], s["chat"])
    out = {}
    with torch.inference_mode():
        for method in ("speculative", "autoregressive"):
            run = _runner(method, pair, sampling, s["gamma"], s["max_new_tokens"], kind=default_kind(pair))
            timed(run, ids, s["seed"], pair.device)  # warm-up
            rates = []
            for _ in range(runs):
                seconds, _, tokens = timed(run, ids, s["seed"], pair.device)
                rates.append(tokens / seconds)
            out[method] = rates
    return out


def _median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specviz.visitors.page_speed", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default=DEFAULT_PAIR)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    s = settings(args.pair)
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        app = App(root, Path(tmp) / "gradio", Path(tmp) / "app.log", preload=args.pair)
        try:
            with client(LOOPBACK) as http:
                app.fn["generate"] = fn_index(app.url, "generate")
                gens = [page_generate(http, app, generate_data(s)) for _ in range(args.runs)]
                runs = [call_run(http, app, run_data(s)) for _ in range(args.runs)]
        finally:
            app.stop()
    bench = bench_rates(s, args.runs)
    print(f"settings: {s}")
    print("Generate (page), each run: wall s, engine s (both runs' total_ms), wall / engine, updates streamed")
    for g in gens:
        print(
            f"  {g['wall']:6.2f} {g['engine']:6.2f} {g['wall'] / g['engine']:5.2f}x {g['updates']:4d}  "
            f"({g['tokens']} tokens; {g['speculative']:.1f} and {g['autoregressive']:.1f} tok/s)"
        )
    print(f"  wall / engine, median (min-max): {_median([g['wall'] / g['engine'] for g in gens])}")
    spec_run, base_run = [r["speculative"] for r in runs], [r["autoregressive"] for r in runs]
    spec_bench, base_bench = bench["speculative"], bench["autoregressive"]
    print("tokens/s, median (min-max)       speculative            autoregressive")
    print(f"  /run                             {_median(spec_run):22s} {_median(base_run)}")
    print(
        f"  Generate (page)                  {_median([g['speculative'] for g in gens]):22s} "
        f"{_median([g['autoregressive'] for g in gens])}"
    )
    print(f"  bench (this process, after)      {_median(spec_bench):22s} {_median(base_bench)}")
    print(
        f"  /run / bench                     {statistics.median(spec_run) / statistics.median(spec_bench):.2f}x"
        f"{'':17s}{statistics.median(base_run) / statistics.median(base_bench):.2f}x"
    )
    print(f"  /run wall s: {_median([r['wall'] for r in runs])}")


if __name__ == "__main__":
    main()
