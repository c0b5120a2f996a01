"""Load: the app as a separate process, many concurrent gradio_client clients, a small queue.

``python app.py --port N`` runs with ``SPECVIZ_MAX_QUEUE=4``, so most requests find the queue full. For a bounded time,
CLIENTS clients each send /generate requests one after another. Every request must either complete with the colour-coded
tokens and a "Done" status, or be refused with the server's refusal (HTTP 429 naming the limit; gradio_client raises it
as ``httpx.HTTPStatusError``, or ``QueueError`` for a 503); anything else is an error. The server's resident memory
(VmRSS) is sampled throughout and must stay flat after the warm-up; the server must still serve afterwards. ``-s``
prints the figures.

Gradio runs each step of a streaming handler on whichever worker thread of its pool is free, so
the engine's streams must survive being resumed on another thread; a fast test checks that alone.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import httpx  # noqa: E402
from gradio_client import Client  # noqa: E402
from gradio_client.utils import QueueError  # noqa: E402  (what the client raises when the server answers 503 queue full)

from tests.conftest import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = 24
MAX_QUEUE = 4
WARMUP_S = 15  # every client has a session and the first requests are done
MEASURED_S = 50  # memory must stay flat over this stretch
RSS_GROWTH_LIMIT_MB = 200
STARTUP_TIMEOUT_S = 120
PROMPTS = ["def is_prime(n):", "class Stack:\n    def __init__(self):", "import os\n\n\ndef read_lines(path):"]


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


@pytest.fixture
def server(tmp_path):
    """The app in its own process, the way it is deployed; its log goes to a file."""
    port = free_port()
    env = os.environ | {
        "SPECVIZ_MAX_QUEUE": str(MAX_QUEUE),
        # every simulated visitor shares 127.0.0.1: the per-address request budgets would refuse them as one flood
        "SPECVIZ_JOINS_PER_MINUTE": "100000",
        "SPECVIZ_HEARTBEATS_PER_MINUTE": "100000",
        "SPECVIZ_NEW_SESSIONS_PER_MINUTE": "100000",
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_OFFLINE": "1",  # the embedded pair needs no hub; nothing may try to reach one
        "GRADIO_SERVER_NAME": "127.0.0.1",
    }
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(url + "config", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.close()
            pytest.fail(f"the app did not start (exit {proc.poll()}):\n{(tmp_path / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)
    try:
        yield proc, url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def client_for(url: str) -> Client:
    return Client(url, verbose=False, download_files=False, analytics_enabled=False)


def request_args(rng: random.Random) -> tuple:
    # pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed
    # short runs: many per second
    return (
        "embedded",
        rng.choice(PROMPTS),
        rng.randint(1, 8),
        rng.choice([0.0, 0.7, 1.0]),
        40,
        0.95,
        12,
        rng.randint(0, 10**6),
    )


def check_outputs(outputs) -> str | None:
    """None when the outputs are a finished run, else what is wrong with them."""
    outputs = outputs if isinstance(outputs, (list, tuple)) else (outputs,)
    if not (outputs and isinstance(outputs[0], str) and "sv-" in outputs[0]):
        return f"first output has no coloured tokens: {str(outputs[0])[:200]!r}"
    if not any(isinstance(o, str) and o.startswith("Done") for o in outputs):
        return "no status output starting with 'Done'"
    return None


@pytest.mark.slow
def test_concurrent_clients_complete_or_are_refused_and_memory_stays_flat(server):
    proc, url = server
    clients = [client_for(url) for _ in range(CLIENTS)]
    lock = threading.Lock()
    counts = {"requests": 0, "completed": 0, "refused": 0}
    errors: list[str] = []
    start = time.monotonic()
    stop_at = start + WARMUP_S + MEASURED_S
    samples: list[tuple[float, float]] = []
    sampling = threading.Event()

    def sample():
        while not sampling.is_set():
            value = rss_mb(proc.pid)
            if value is not None:
                samples.append((time.monotonic() - start, value))
            sampling.wait(0.5)

    def visitor(i: int, client: Client):
        rng = random.Random(i)
        while time.monotonic() < stop_at:
            with lock:
                counts["requests"] += 1
            try:
                outputs = client.predict(*request_args(rng), api_name="/generate")
            except (QueueError, httpx.HTTPStatusError) as err:
                with lock:
                    counts["refused"] += 1
                if isinstance(err, httpx.HTTPStatusError) and err.response.status_code != 429:
                    errors.append(f"{err.response.status_code}: {err}")
                elif isinstance(err, QueueError) and "queue is full" not in str(err).lower():
                    errors.append(f"QueueError without the queue-full message: {err}")
                time.sleep(rng.uniform(0.5, 1.5))  # a visitor tries again a moment later
                continue
            except Exception as err:  # noqa: BLE001 - every other outcome is counted as an error
                errors.append(f"{type(err).__name__}: {err}")
                continue
            problem = check_outputs(outputs)
            with lock:
                if problem is None:
                    counts["completed"] += 1
                else:
                    errors.append(problem)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=visitor, args=(i, c), daemon=True) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WARMUP_S + MEASURED_S + 60)
    hung = sum(t.is_alive() for t in threads)
    sampling.set()
    sampler.join(5)
    elapsed = time.monotonic() - start

    alive = proc.poll() is None
    after = (
        check_outputs(client_for(url).predict(*request_args(random.Random(-1)), api_name="/generate"))
        if alive
        else "server exited"
    )

    warm = [v for t, v in samples if WARMUP_S - 3 <= t <= WARMUP_S]
    final = [v for t, v in samples if t >= WARMUP_S + MEASURED_S - 3]
    warm_mb, final_mb = statistics.median(warm), statistics.median(final)
    peak_mb = max(v for _, v in samples)
    print(
        f"\nload test: {CLIENTS} clients, queue size {MAX_QUEUE}, {elapsed:.0f} s: {counts['requests']} requests, "
        f"{counts['completed']} completed, {counts['refused']} refused (queue full), {len(errors)} errors, {hung} "
        "hung; "
        f"server RSS {samples[0][1]:.0f} MB at start, {warm_mb:.0f} MB after {WARMUP_S} s warm-up, {final_mb:.0f} MB "
        "at the end "
        f"(growth {final_mb - warm_mb:+.0f} MB, limit {RSS_GROWTH_LIMIT_MB}), peak {peak_mb:.0f} MB; "
        f"served afterwards: {after is None}\n  RSS every 10 s (MB): "
        + " ".join(f"{v:.0f}" for t, v in samples if int(t * 2) % 20 == 0)
        + "".join(f"\n  error: {e[:300]}" for e in errors[:5])
    )
    assert not errors, errors[:5]
    assert hung == 0
    assert alive and after is None, after
    assert counts["completed"] >= 10  # the app did real work under load
    assert counts["refused"] > 0  # the queue really filled up, and the refusals were the clean kind
    assert counts["requests"] == counts["completed"] + counts["refused"]
    assert final_mb - warm_mb < RSS_GROWTH_LIMIT_MB


def test_a_stream_resumed_on_other_threads_gives_the_same_run(embedded):
    """Each next() on a new thread, as Gradio may do: same output as in one thread, no thread left in inference mode."""
    import torch

    from specviz import Sampling, autoregressive_stream, speculative_stream
    from specviz.pair import encode_prompt

    ids = encode_prompt(embedded, PROMPTS[0])
    kw = dict(
        sampling=Sampling(0.7, top_k=40, top_p=0.95),
        max_new_tokens=24,
        seed=3,
        eos_token_id=embedded.eos_token_ids,
        tokenizer=embedded.tokenizer,
    )
    streams = {
        "speculative": lambda: speculative_stream(ids, embedded.drafter, embedded.target, gamma=3, **kw),
        "autoregressive": lambda: autoregressive_stream(ids, embedded.target, **kw),
    }
    for name, make in streams.items():
        reference = list(make())[-1].output_ids
        stream, last, leaked = make(), None, []
        while True:
            box: list = []

            def step():
                try:
                    box.append(next(stream))
                except StopIteration:
                    box.append(StopIteration)
                except Exception as err:  # noqa: BLE001 - reported below
                    box.append(err)
                leaked.append(torch.is_inference_mode_enabled())

            t = threading.Thread(target=step)
            t.start()
            t.join(60)
            if box[0] is StopIteration:
                break
            assert not isinstance(box[0], Exception), f"{name}: {box[0]!r}"
            last = box[0]
        assert last.output_ids == reference, name
        assert not any(leaked), f"{name}: a step left its thread in inference mode"
