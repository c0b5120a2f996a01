"""``python -m specviz.visitors.attack``: a victim's short run under each flood an attacker tried, how fast long
jobs halt on Stop and on a hang-up, and the app's disk and memory before and after.

Launches the app (``app.py``) in a process of its own on 127.0.0.1, with a fresh Gradio temporary folder and
``SPECVIZ_TRUSTED_PROXIES=1`` (so a request carrying ``X-Forwarded-For`` counts as the address it names, as
behind a Space's proxy), and drives it over HTTP as visitors would, from loopback addresses:

0. **Start.** One visitor uses each job kind once (``warm_up``); with ``--ttl-s`` the attack then waits for its
   session and files to expire. The app's RSS then is the "start" the floods' leftovers are measured from
   (``--no-warm-up``: the app just up).
1. **Victim baseline.** An 8-token greedy Generate (``--victim-tokens``) on the embedded pair from 127.0.0.1 (a page
   session of its own, joined through the queue and read to its end), ``--victims`` times: the median wall time.
2. **Each flood**, bounded in time (``--flood-s`` at most, plus the victim's runs), while the victim runs again:
   fresh session hashes joining the queue (127.0.0.2); heartbeat connections opened and closed (127.0.0.3); concurrent
   ``/call/run`` posts of 128-token runs, two at a time from each of three addresses (127.0.0.21-23); 1 MB uploads until
   refused, and on (127.0.0.5); 8-token ``/call/run`` posts whose prompt grows by a few tokens each time (127.0.0.6:
   every prompt length is new to the CPU's kernel caches); a heavy batch (8 rows, the most tokens) re-submitted as soon
   as it ends, from another address named by ``X-Forwarded-For`` (10.9.9.9); Generate with the auto tree, 1 token, a new
   temperature each time, from three addresses (10.8.8.1-3); the exactness lab at the page's defaults, re-run as soon as
   it ends, from three addresses (10.7.7.1-3); then one address at a time (10.5.5.x, 10.6.6.1), each re-running one job
   as soon as it ends: the lab at the page's defaults, Compare, an 8-row batch, a prepared recording loaded and
   exported (each export builds its page), the auto tree at a new temperature (a calibration each time), and 1-token
   Generates switching between the English and the cross-tokenizer pairs (the app keeps three pairs resident,
   ``SPECVIZ_RESIDENT_PAIRS=3``: the victim's is never evicted, and its first runs meet the attacker's first two
   loads). The ratio is the victim's median under the flood
   over its baseline median, measured minutes apart on the same machine; the worst ratio its slowest run's.
3. **Stop and hang-up.** A heavy batch is stopped by its session's Stop button once it has streamed for a
   second (its stream read all the while); printed: seconds from the Stop request to the batch's last message,
   or "not measured" when the batch ended before the Stop was sent. A comparison's client hangs up once it has
   streamed; printed: seconds from the hang-up until the next long job (a one-row batch from another address)
   starts, which it can only once the comparison has halted.
4. **CPU**: the cores the app and this attack client kept busy during each flood (CPU seconds over wall seconds,
   from ``/proc`` and ``os.times``): on a machine of few cores the client's own work slows the app as a flood does.
5. **Disk and memory**: the bytes and files under the Gradio temporary folder (uploads, downloads, exports) and
   the app's resident set size (``/proc``), before and after each flood, and what is left in the folder after the
   app stops. With ``--ttl-s T`` the app forgets unused sessions and sweeps its cached files after T seconds
   (``SPECVIZ_SESSION_TTL_S``, ``SPECVIZ_CACHE_TTL_S``; 1,800 and 300 by default), and after the last step the
   attack waits, sending nothing, until both have run (2 T + 15 s), then measures disk and memory again: what
   the floods left once their sessions and files have expired. With T at least each flood's length, the floods
   meet the same limits as with the defaults.

The figures depend on the machine and on what else it runs; nothing here asserts them. Linux only. Takes a few
minutes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from specviz.visitors.sessions import _free_port, _wait_up, client, fn_index, rss_mb

VICTIM = "127.0.0.1"
GENERATE = ["embedded", "def is_prime(n):", 4, 0.0, 0, 1.0, 8, 0, True, "", "", "model", "constant", 1.0, "chain"]
RUN = ["embedded", "def parse(text):", 4, 0.7, 40, 0.9, 128, 0, True, "model", "constant", 1.0, "chain"]
HEAVY_BATCH = [
    "embedded",
    "def f(x):\nclass Stack:\nimport os\ndef g(y):",
    8,
    4,
    0.7,
    40,
    0.9,
    256,
    0,
    True,
    "",
    "",
    "model",
    "constant",
    1.0,
]
SMALL_BATCH = ["embedded", "def f(x):", 1, 4, 0.0, 0, 1.0, 4, 0, True, "", "", "model", "constant", 1.0]
COMPARE = ["embedded", "def is_prime(n):", 4, 0.7, 40, 0.9, 256, 0, True, "", "", "constant", 1.0, "chain"]


class App:
    """The app in a subprocess: its URL, process and temporary folder; its endpoints' indices."""

    def __init__(self, root: Path, temp: Path, log: Path, ttl_s: int | None = None, preload: str = "embedded"):
        self.temp, self.log = temp, log
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = os.environ | {
            "GRADIO_TEMP_DIR": str(temp),
            "HF_HUB_OFFLINE": "1",
            "GRADIO_ANALYTICS_ENABLED": "False",
            "SPECVIZ_TRUSTED_PROXIES": "1",
            "SPECVIZ_PRELOAD": preload,
            "SPECVIZ_RESIDENT_PAIRS": "3",
        }
        if ttl_s is not None:
            env |= {"SPECVIZ_SESSION_TTL_S": str(ttl_s), "SPECVIZ_CACHE_TTL_S": str(ttl_s)}
        self._log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "app.py", "--port", str(port)],
            cwd=root,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        if not _wait_up(self.url, self.proc, 300):
            self.stop()
            raise SystemExit(f"the app did not start: {log.read_text()[-2000:]}")
        self.victim = uuid.uuid4().hex  # the victim's page session
        self.fn = {
            name: fn_index(self.url, name)
            for name in ("generate", "stop", "batch", "compare", "lab", "load_prepared", "export")
        }

    def disk(self) -> tuple[float, int]:
        """(MB, files) under the temporary folder."""
        files = [p for p in self.temp.rglob("*") if p.is_file()]
        return sum(p.stat().st_size for p in files) / 2**20, len(files)

    def rss(self) -> float:
        return rss_mb(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user and system) a process has used: ``pid``'s from /proc, or this one's own."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def join(
    http: httpx.Client, app: App, api_name: str, data: list, session: str, headers: dict | None = None
) -> str | None:
    """Join the queue as the page does: the job's event id, or None when it was refused."""
    body = {"data": data, "fn_index": app.fn[api_name], "session_hash": session, "event_data": None, "trigger_id": None}
    r = http.post(f"{app.url}/gradio_api/queue/join", json=body, headers=headers or {})
    return r.json().get("event_id") if r.status_code == 200 else None


def messages(http: httpx.Client, app: App, session: str, headers: dict | None = None):
    """The session's queue messages as they come (dicts), until the stream ends."""
    with http.stream(
        "GET", f"{app.url}/gradio_api/queue/data", params={"session_hash": session}, headers=headers or {}
    ) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                yield json.loads(line[5:])


def page_call(
    http: httpx.Client, app: App, api_name: str, data: list, headers: dict | None = None, session: str | None = None
) -> dict:
    """One job of a page session (default: a fresh one), read to its end: its last message ({} if it was refused)."""
    session = session or uuid.uuid4().hex
    if not join(http, app, api_name, data, session, headers):
        return {}
    for message in messages(http, app, session, headers):
        if message.get("msg") == "process_completed":
            return message
    return {}


def call_run(http: httpx.Client, app: App, data: list) -> bool:
    """One ``/gradio_api/call/run`` post, its result stream read to its end; False when it was refused."""
    r = http.post(f"{app.url}/gradio_api/call/run", json={"data": data})
    if r.status_code != 200:
        return False
    with http.stream("GET", f"{app.url}/gradio_api/call/run/{r.json()['event_id']}") as stream:
        for _ in stream.iter_lines():
            pass
    return True


def heartbeat(http: httpx.Client, app: App) -> None:
    """Open a heartbeat connection of a fresh session, read its first line, close it."""
    with http.stream("GET", f"{app.url}/gradio_api/heartbeat/{uuid.uuid4().hex}", timeout=30) as r:
        next(r.iter_lines())


VICTIM_TOKENS = [8]  # the victim's Generate, in new tokens (--victim-tokens)


def victim_runs(app: App, n: int) -> list[float]:
    """Wall seconds of ``n`` Generate runs of VICTIM_TOKENS tokens from the victim's page (one session, as a visitor's
    tab; a failed run, or one stopped to give the device up, counts as inf)."""
    times = []
    data = list(GENERATE)
    data[6] = VICTIM_TOKENS[0]
    with client(VICTIM) as http:
        for _ in range(n):
            start = time.monotonic()
            done = page_call(http, app, "generate", data, session=app.victim)
            # a run stopped to give the device up (to a shorter job, or after its share) was not served
            texts = [d for d in (done.get("output") or {}).get("data", []) if isinstance(d, str)]
            stopped = any(t.startswith("Stopped after") for t in texts)
            times.append(time.monotonic() - start if done.get("success") and not stopped else float("inf"))
    return times


# ---- the floods: each a function (app, stopping event, clients list) run in threads until the event is set ----


def _forever(halt: threading.Event, step) -> None:
    while not halt.is_set():
        try:
            step()
        except Exception:  # noqa: BLE001 - a refused or cut connection: the flood goes on
            time.sleep(0.05)


def fresh_sessions(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
    http = client("127.0.0.2")
    clients.append(http)
    return [threading.Thread(target=_forever, args=(halt, lambda: join(http, app, "stop", [], uuid.uuid4().hex)))]


def heartbeats(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
    http = client("127.0.0.3")
    clients.append(http)
    return [threading.Thread(target=_forever, args=(halt, lambda: heartbeat(http, app)))]


def run_posts(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
    threads = []
    for k in range(3):
        for _ in range(2):
            http = client(f"127.0.0.{21 + k}")
            clients.append(http)

            def one(http=http):
                if not call_run(http, app, RUN):
                    time.sleep(0.2)

            threads.append(threading.Thread(target=_forever, args=(halt, one)))
    return threads


def uploads(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
    http = client("127.0.0.5")
    clients.append(http)
    blob = os.urandom(2**20)

    def one():
        r = http.post(f"{app.url}/gradio_api/upload", files={"files": ("flood.json", blob, "application/json")})
        if r.status_code != 200:
            time.sleep(0.05)

    return [threading.Thread(target=_forever, args=(halt, one))]


_WORDS = itertools.count(1)  # the prompt-length flood's next length, on across rounds: each round's lengths are new


def prompt_lengths(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
    """8-token ``/call/run`` posts whose prompts grow by a word each time: every length is a new row count
    for every layer of both models (the CPU's kernel caches keep a kernel per one)."""
    http = client("127.0.0.6")
    clients.append(http)

    def one():
        data = list(RUN)
        data[1], data[6] = "def parse(text):\n    " + " ".join(f"x{k} = {k}" for k in range(next(_WORDS))), 8
        if not call_run(http, app, data):
            time.sleep(0.2)

    return [threading.Thread(target=_forever, args=(halt, one))]


def heavy_batches(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
    http = client(VICTIM)  # the same peer as the victim: the proxy header alone tells them apart
    clients.append(http)
    headers = {"X-Forwarded-For": "10.9.9.9"}
    return [threading.Thread(target=_forever, args=(halt, lambda: page_call(http, app, "batch", HEAVY_BATCH, headers)))]


def auto_trees(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
    """Generate with the auto tree, 1 token, a new temperature each time (a calibration not cached yet each), from
    three addresses named by ``X-Forwarded-For``: priced at their calibration, they wait behind short runs."""
    from specviz.ui.tabs.tree import AUTO

    threads = []
    for k in range(3):
        http = client(f"127.0.0.{41 + k}")
        clients.append(http)
        headers, temperatures = {"X-Forwarded-For": f"10.8.8.{k + 1}"}, itertools.count()

        def one(http=http, headers=headers, temperatures=temperatures):
            data = list(GENERATE)
            data[3], data[6], data[14] = round(0.3 + 0.001 * next(temperatures), 3), 1, AUTO
            if not page_call(http, app, "generate", data, headers):
                time.sleep(0.2)

        threads.append(threading.Thread(target=_forever, args=(halt, one)))
    return threads


LAB = ["different", "none", 1.0, 5, 1.0, 3, 2000]  # the exactness lab at the page's defaults


def lab_runs(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
    """The exactness lab at the page's defaults (2,000 samples), re-run as soon as it ends, from three addresses
    named by ``X-Forwarded-For``: one runs at a time (its slot), its samples one device step each."""
    threads = []
    for k in range(3):
        http = client(f"127.0.0.{51 + k}")
        clients.append(http)
        headers = {"X-Forwarded-For": f"10.7.7.{k + 1}"}
        threads.append(
            threading.Thread(
                target=_forever,
                args=(
                    halt,
                    lambda http=http, headers=headers: page_call(http, app, "lab", LAB, headers) or time.sleep(0.2),
                ),
            )
        )
    return threads


def _one_address(api_name: str, data: list, address: str):
    """A flood from one address (named by ``X-Forwarded-For``) re-running one page job as soon as it ends."""

    def flood(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
        http = client("127.0.0.61")
        clients.append(http)
        headers, session = {"X-Forwarded-For": address}, uuid.uuid4().hex
        return [
            threading.Thread(
                target=_forever,
                args=(halt, lambda: page_call(http, app, api_name, data, headers, session) or time.sleep(0.2)),
            )
        ]

    return flood


def exports(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
    """One address loading a prepared recording (the next of them each time) and exporting it: every export builds
    its page (a page is kept for the recording object on screen, and each load makes a new one)."""
    from specviz.ui.tabs.files import examples

    http = client("127.0.0.61")
    clients.append(http)
    headers, session, names = {"X-Forwarded-For": "10.5.5.4"}, uuid.uuid4().hex, itertools.cycle(examples())

    def one():
        page_call(http, app, "load_prepared", [next(names)], headers, session)
        page_call(http, app, "export", [None], headers, session) or time.sleep(0.2)

    return [threading.Thread(target=_forever, args=(halt, one))]


def pair_switches(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
    """One address switching pairs: a 1-token Generate on the English pair, then on the cross-tokenizer pair, and
    again. The app keeps three pairs resident, so the victim's embedded pair is never evicted (its own reload would be
    counted as the flood's) and the victim's first runs meet the attacker's first two loads."""
    http = client("127.0.0.62")
    clients.append(http)
    headers, names = {"X-Forwarded-For": "10.6.6.1"}, itertools.cycle(["english", "cross"])

    def one():
        data = list(GENERATE)
        data[0], data[6] = next(names), 1
        if data[0] == "cross":
            data[11] = "cross-tokenizer"
        page_call(http, app, "generate", data, headers) or time.sleep(0.2)

    return [threading.Thread(target=_forever, args=(halt, one))]


def auto_tree_one(app: App, halt: threading.Event, clients: list) -> list[threading.Thread]:
    """One address's Generate with the auto tree, 16 tokens, a new temperature each time: a calibration each time."""
    from specviz.ui.tabs.tree import AUTO

    http = client("127.0.0.63")
    clients.append(http)
    headers, temperatures = {"X-Forwarded-For": "10.5.5.5"}, itertools.count()

    def one():
        data = list(GENERATE)
        data[3], data[6], data[14] = round(0.5 + 0.001 * next(temperatures), 3), 16, AUTO
        page_call(http, app, "generate", data, headers) or time.sleep(0.2)

    return [threading.Thread(target=_forever, args=(halt, one))]


FLOODS = {
    "fresh session hashes": fresh_sessions,
    "heartbeats": heartbeats,
    "/run posts (3 addresses x 2)": run_posts,
    "uploads (1 MB)": uploads,
    "prompts of ever more tokens (/run, 8 tokens each)": prompt_lengths,
    "heavy batch (X-Forwarded-For)": heavy_batches,
    "auto trees, 1 token, a new temperature each (3 addresses)": auto_trees,
    "exactness lab at the page's defaults (3 addresses)": lab_runs,
    # One address each (issue 59's bar: the victim within 1.5x its time alone beside any one visitor's job)
    "one address: the exactness lab at the page's defaults": _one_address("lab", LAB, "10.5.5.1"),
    "one address: Compare drafters": _one_address("compare", COMPARE, "10.5.5.2"),
    "one address: Batch, 8 rows": _one_address("batch", HEAVY_BATCH, "10.5.5.3"),
    "one address: exports of prepared recordings, each loaded again first (a page built each time)": exports,
    "one address: the auto tree, 16 tokens, a new temperature (a calibration) each time": auto_tree_one,
    "one address: pair switches (English <-> cross, 1 token)": pair_switches,
}


def under_flood(app: App, flood, victims: int, ramp_s: float, flood_s: float) -> list[float]:
    halt, clients = threading.Event(), []
    threads = flood(app, halt, clients)
    for t in threads:
        t.daemon = True
        t.start()
    time.sleep(ramp_s)
    end = time.monotonic() + flood_s
    times = []
    while len(times) < victims and time.monotonic() < end:
        times += victim_runs(app, 1)
    halt.set()
    for http in clients:
        http.close()  # streams cut: their jobs see their client gone and stop within a round
    for t in threads:
        t.join(30)
    time.sleep(3)  # the cut jobs end
    return times


# ---- Stop and hang-up ------------------------------------------------------------------------------------


def stop_to_halt(app: App, under_way_s: float = 1.0) -> float:
    """Seconds from a Stop request to the last message of a heavy batch, stopped once it has streamed for
    ``under_way_s``; NaN when the batch ended before the Stop was sent (it was not stopped: nothing measured).

    The stream is read all the while (a pause would let a batch that ends on its own within it look as if it
    had halted at once)."""
    headers = {"X-Forwarded-For": "10.8.8.8"}
    session = uuid.uuid4().hex
    stopper = None
    with client(VICTIM) as http, client(VICTIM) as other:
        event, first, pressed = join(http, app, "batch", HEAVY_BATCH, session, headers), None, None
        for message in messages(http, app, session, headers):
            if message.get("event_id") != event:
                continue  # the Stop button's own messages come on the same stream
            now = time.monotonic()
            if message.get("msg") == "process_generating":
                first = first if first is not None else now
                if pressed is None and now - first >= under_way_s:
                    pressed = now
                    stopper = threading.Thread(
                        target=join, args=(other, app, "stop", [], session, headers), daemon=True
                    )
                    stopper.start()
            if message.get("msg") == "process_completed":
                if stopper is not None:
                    stopper.join(30)  # its request done before the client closes
                return now - pressed if pressed is not None else float("nan")
    return float("nan")


def hangup_to_next(app: App) -> float:
    """Seconds from a comparison's client hanging up to the start of the next long job (from another address)."""
    session = uuid.uuid4().hex
    headers = {"X-Forwarded-For": "10.7.7.7"}
    with client(VICTIM) as http:
        if not join(http, app, "compare", COMPARE, session, headers):
            return float("nan")
        seen = 0
        for message in messages(http, app, session, headers):
            seen += message.get("msg") == "process_generating"
            if seen >= 1:
                time.sleep(3)
                break  # hang up: the stream closes here
    left = time.monotonic()
    nxt = {"X-Forwarded-For": "10.6.6.6"}
    with client(VICTIM) as http:
        session = uuid.uuid4().hex
        if not join(http, app, "batch", SMALL_BATCH, session, nxt):
            return float("nan")
        for message in messages(http, app, session, nxt):
            if message.get("msg") in ("process_starts", "process_generating"):
                return time.monotonic() - left
    return float("nan")


def warm_up(app: App) -> None:
    """One visitor's use of each job kind the attack floods with, once and from one address each: a session joining,
    a heartbeat, a ``/call/run`` read to its end, a 1 MB upload, a heavy batch, a stopped batch and a comparison hung
    up on. The first use of a kind leaves what any first visitor leaves (imported code, compiled kernels, caches);
    the "start" figure is taken after this, so that what the floods leave is told apart from it."""
    with client("127.0.0.31") as http:
        join(http, app, "stop", [], uuid.uuid4().hex)
        heartbeat(http, app)
        call_run(http, app, RUN)
        http.post(f"{app.url}/gradio_api/upload", files={"files": ("warm.json", os.urandom(2**20), "application/json")})
        page_call(http, app, "batch", HEAVY_BATCH)
    stop_to_halt(app)
    hangup_to_next(app)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--victims", type=int, default=3, help="victim runs per measurement (default 3)")
    parser.add_argument(
        "--flood-s", type=float, default=60.0, help="most seconds of victim runs under one flood (default 60)"
    )
    parser.add_argument(
        "--ramp-s", type=float, default=3.0, help="seconds a flood runs before the victim's first run (default 3)"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="times the whole attack is repeated on the same app (default 1)"
    )
    parser.add_argument(
        "--warm-up",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="before the start figure, use each job kind once as one visitor would, then (with --ttl-s) "
        "wait for its session and files to expire (default: on)",
    )
    parser.add_argument(
        "--ttl-s",
        type=int,
        default=None,
        help="the app's session and cached-file time to live, seconds (at least 10); then wait for both "
        "after the attack and measure again (default: the app's own, no wait)",
    )
    parser.add_argument("--victim-tokens", type=int, default=8, help="the victim's Generate, in new tokens (default 8)")
    parser.add_argument(
        "--floods",
        default="",
        help="comma-separated words; only the floods whose names hold one (e.g. 'auto,heartbeats'; default: all)",
    )
    parser.add_argument(
        "--watch-s",
        type=int,
        default=0,
        help="after the last round's wait, go on sampling RSS every 15 s for this long, idle (default 0)",
    )
    args = parser.parse_args(argv)
    if args.ttl_s is not None and args.ttl_s < 10:
        parser.error("--ttl-s must be at least 10 seconds")
    VICTIM_TOKENS[0] = args.victim_tokens
    root = Path(__file__).resolve().parents[2]
    settled, ends = [], []
    rows = []
    with tempfile.TemporaryDirectory(prefix="specviz-attack-") as tmp:
        temp = Path(tmp) / "gradio"
        temp.mkdir()
        app = App(root, temp, Path(tmp) / "server.log", args.ttl_s)
        try:
            disk0, rss0 = app.disk(), app.rss()
            print(f"app up: disk {disk0[0]:.1f} MB in {disk0[1]} files, RSS {rss0:.0f} MB", flush=True)
            victim_runs(app, 1)  # warm-up
            start = ("app up", rss0)
            if args.warm_up:
                warm_up(app)
                if args.ttl_s is not None:
                    time.sleep(2 * args.ttl_s + 15)
                start = ("after one use of each job kind" + (", expired" if args.ttl_s is not None else ""), app.rss())
                print(
                    f"{start[0]}: disk {app.disk()[0]:.1f} MB in {app.disk()[1]} files, RSS {start[1]:.0f} MB",
                    flush=True,
                )
            base = victim_runs(app, args.victims)
            b = statistics.median(base)
            print(f"victim baseline: {' '.join(f'{t:.2f}' for t in base)} s (median {b:.2f} s)", flush=True)
            for attack in range(1, args.rounds + 1):
                label = f" (round {attack})" if args.rounds > 1 else ""
                words = [w.strip() for w in args.floods.split(",") if w.strip()]
                for name, flood in FLOODS.items():
                    if words and not any(w in name for w in words):
                        continue
                    d0, r0 = app.disk(), app.rss()
                    c0, a0, w0 = cpu_s(), cpu_s(app.proc.pid), time.monotonic()
                    times = under_flood(app, flood, args.victims, args.ramp_s, args.flood_s)
                    wall, mine, theirs = time.monotonic() - w0, cpu_s() - c0, cpu_s(app.proc.pid) - a0
                    d1, r1 = app.disk(), app.rss()
                    m = statistics.median(times) if times else float("inf")
                    worst = max(times) if times else float("inf")
                    rows.append((name + label, b, m, m / b, worst / b, d0, d1, r0, r1, theirs / wall, mine / wall))
                    print(
                        f"{name}{label}: victim {' '.join(f'{t:.2f}' for t in times)} s; CPU cores busy: app "
                        f"{theirs / wall:.2f}, "
                        f"attack client {mine / wall:.2f} (of {os.cpu_count()})",
                        flush=True,
                    )
                halted = stop_to_halt(app)
                print(
                    f"Stop -> heavy batch's last message: {halted:.2f} s"
                    if not math.isnan(halted)
                    else "Stop -> heavy batch's last message: not measured (the batch ended before Stop was sent)",
                    flush=True,
                )
                hung = hangup_to_next(app)
                print(f"hang-up of a comparison -> next long job starts: {hung:.2f} s", flush=True)
                disk1, rss1 = app.disk(), app.rss()
                ends.append((label, halted, hung, disk1, rss1))
                if args.ttl_s is not None:
                    wait = 2 * args.ttl_s + 15
                    print(f"waiting {wait} s with no requests, for the sessions and cached files to expire", flush=True)
                    time.sleep(wait)
                    settled.append((label, app.disk(), app.rss()))
                    print(
                        f"then: disk {settled[-1][1][0]:.1f} MB in {settled[-1][1][1]} files, RSS {settled[-1][2]:.0f} "
                        "MB",
                        flush=True,
                    )
            watched = []
            for _ in range(args.watch_s // 15):
                time.sleep(15)
                watched.append(app.rss())
            if watched:
                print("RSS every 15 s after that, idle: " + " ".join(f"{r:.0f}" for r in watched) + " MB", flush=True)
            warm = rows[0][7] if rows else rss0
        finally:
            app.stop()
        left = sum(1 for p in temp.rglob("*") if p.is_file())
    print()
    print(
        "| flood | victim baseline s | under flood s | ratio (median) | worst ratio | disk MB (files) before -> after "
        "| RSS MB before -> after "
        f"| cores busy: app, attack client (of {os.cpu_count()}) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, b, m, ratio, worst, d0, d1, r0, r1, app_cores, client_cores in rows:
        print(
            f"| {name} | {b:.2f} | {m:.2f} | {ratio:.2f}x | {worst:.2f}x | {d0[0]:.1f} ({d0[1]}) -> {d1[0]:.1f} "
            f"({d1[1]}) | {r0:.0f} "
            f"-> {r1:.0f} "
            f"| {app_cores:.2f}, {client_cores:.2f} |"
        )
    print()
    for label, halted, hung, disk1, rss1 in ends:
        print(
            f"| Stop -> last message of a heavy batch{label} | "
            + (f"{halted:.2f} s |" if not math.isnan(halted) else "not measured: the batch ended first |")
        )
        print(f"| hang-up of a comparison -> next long job starts{label} | {hung:.2f} s |")
        print(f"| whole attack{label}: disk MB (files) | {disk0[0]:.1f} ({disk0[1]}) -> {disk1[0]:.1f} ({disk1[1]}) |")
        print(
            f"| whole attack{label}: RSS MB | {rss0:.0f} (app up), {start[1]:.0f} ({start[0]}), {warm:.0f} (after the "
            "victim's "
            f"baseline runs) -> {rss1:.0f} |"
        )
    for label, (mb, files), rss2 in settled:
        print(
            f"| {2 * args.ttl_s + 15} s later{label}, idle (time to live {args.ttl_s} s): disk MB (files), RSS MB | "
            f"{mb:.1f} ({files}), {rss2:.0f} |"
        )
    print(f"| after the app stopped: files left | {left} |")


if __name__ == "__main__":
    main()
