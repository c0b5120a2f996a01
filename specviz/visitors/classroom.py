"""``python -m specviz.visitors.classroom``: a class of students behind one school address, beside two hostile
addresses.

Launches the app as ``specviz.visitors.attack`` does (its own process, a fresh temporary folder, one trusted proxy, so
``X-Forwarded-For`` names each visitor's address as a Space's proxy would), then:

1. **Alone.** One student's Generate (``--tokens`` tokens, greedy, the chain, ``--pair``), ``--solo`` times, nobody
   else on the server: the median wall time S of one run, from its join to its last message.
2. **The class.** ``--students`` students, all behind one address (``SCHOOL``), arrive at even intervals over
   ``--span-s`` seconds; each loads the page (``/config``, as a browser does, and a page session of its own) and
   runs one Generate. Meanwhile two hostile addresses (``HOSTILE``) flood without pause (``--flood mixed``): Generate
   with the auto tree, 1 token, a new temperature each time (each an uncached calibration), and prepared-recording
   loads from fresh session hashes; or (``--flood lab``) the exactness lab at the page's defaults, again as soon as
   it ends. ``--no-hostile --span-s 10`` is a burst: a class pressing Generate together.
3. **Printed:** each student's wait (join to the job's start), its run, its total, and its ratio to the total it would
   have had **alone in a queue of that class**: the class's own arrivals served first come, first served, each in S
   (``alone_totals``: a one-server queue replayed from the measured arrival times), so the ratio counts only what the
   hostile addresses and the server's overhead added. Also: refusals by reason, the device's share by address (the
   seconds each address's Generate jobs held the device, from each job's start to its end, over the sum of all),
   each address's fair share (1 / the addresses that used the device; an address that asks for less leaves the rest
   to the others), the hostile jobs' device seconds while a student waited, the app's RSS and its temporary folder's
   bytes at the start, at the end and after ``--ttl-s`` once the floods stopped.

The figures depend on the machine; nothing here asserts them. Linux only. Takes ``--span-s`` plus a minute or two.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from specviz.visitors.attack import App, messages
from specviz.visitors.sessions import client, fn_index
from specviz.ui.tabs.tree import AUTO

SCHOOL = "198.51.100.7"  # the one public address a school's students reach the Space from
HOSTILE = ("203.0.113.66", "203.0.113.67")
LOOPBACK = "127.0.0.1"  # every request leaves from here; X-Forwarded-For names the visitor


def generate(pair: str, tokens: int, temperature: float = 0.0, tree: str = "chain") -> list:
    """The Generate endpoint's values: pair, prompt, gamma, T, top-k, top-p, tokens, seed, chat, drafter, target,
    drafter kind, schedule, repetition penalty, tree."""
    prompt = "def is_prime(n):" if pair == "embedded" else "Explain speculative decoding to a class."
    return [pair, prompt, 4, temperature, 0, 1.0, tokens, 0, True, "", "", "model", "constant", 1.0, tree]


def timed_job(http: httpx.Client, app: App, api_name: str, data: list, address: str) -> dict:
    """One page job from ``address`` in a fresh session, read to its end. Returns its join time, start and end
    (time.monotonic), whether it succeeded, and the refusal's status and text when it was refused."""
    headers = {"X-Forwarded-For": address}
    session = uuid.uuid4().hex
    joined = time.monotonic()
    body = {"data": data, "fn_index": app.fn[api_name], "session_hash": session, "event_data": None, "trigger_id": None}
    r = http.post(f"{app.url}/gradio_api/queue/join", json=body, headers=headers)
    if r.status_code != 200:
        return {"joined": joined, "refused": r.status_code, "why": r.text[:300]}
    started = None
    for message in messages(http, app, session, headers):
        if message.get("msg") == "process_starts" and started is None:
            started = time.monotonic()
        if message.get("msg") == "process_completed":
            job = {
                "joined": joined,
                "started": started or joined,
                "ended": time.monotonic(),
                "success": bool(message.get("success")),
            }
            said = [
                v
                for v in (message.get("output") or {}).get("data", [])
                if isinstance(v, str) and any(w in v for w in ("Done", "Stopped", "alibrat", "efused", "rror"))
            ]
            return job | {"status": said[0][:200] if said else str(message.get("output"))[:200]}
    return {"joined": joined, "started": started or joined, "ended": time.monotonic(), "success": False}


def alone_totals(arrivals: list[float], service_s: float) -> list[float]:
    """Each job's total time (wait and run) in a first-come-first-served queue of one server holding only these
    arrivals (seconds, any origin), each served in ``service_s``; in arrival order."""
    free_at, totals = float("-inf"), []
    for t in sorted(arrivals):
        start = max(t, free_at)
        free_at = start + service_s
        totals.append(free_at - t)
    return totals


def hostile(app: App, address: str, pair: str, halt: threading.Event, log: list, lock: threading.Lock) -> None:
    """Loop: an auto-tree Generate of 1 token at a new temperature, then a prepared recording loaded in a fresh
    session."""
    rng = random.Random(address)
    example = app.example
    with client(LOOPBACK) as http:
        while not halt.is_set():
            for api, data in (
                ("generate", generate(pair, 1, round(rng.uniform(0.3, 1.2), 3), AUTO)),
                ("load_prepared", [example]),
            ):
                try:
                    job = timed_job(http, app, api, data, address)
                except httpx.HTTPError:
                    time.sleep(0.1)
                    continue
                with lock:
                    log.append((address, api, job))
                if "refused" in job:
                    time.sleep(0.2)


def lab_hostile(app: App, address: str, pair: str, halt: threading.Event, log: list, lock: threading.Lock) -> None:
    """Loop: the exactness lab at the page's defaults (2,000 samples), again as soon as it ends."""
    from specviz.visitors.attack import LAB

    with client(LOOPBACK) as http:
        while not halt.is_set():
            try:
                job = timed_job(http, app, "lab", LAB, address)
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            with lock:
                log.append((address, "lab", job))
            if "refused" in job:
                time.sleep(0.2)


FLOODS = {"mixed": hostile, "lab": lab_hostile}


def student(app: App, pair: str, tokens: int, at: float, log: list, lock: threading.Lock) -> None:
    time.sleep(max(0.0, at - time.monotonic()))
    with client(LOOPBACK) as http:
        http.get(f"{app.url}/config", headers={"X-Forwarded-For": SCHOOL})  # the page loads
        job = timed_job(http, app, "generate", generate(pair, tokens), SCHOOL)
    with lock:
        log.append((SCHOOL, "generate", job))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specviz.visitors.classroom", description=__doc__.split("\n\n")[0])
    ap.add_argument("--students", type=int, default=40)
    ap.add_argument("--span-s", type=float, default=600.0, help="the students arrive evenly over this many seconds")
    ap.add_argument("--tokens", type=int, default=32, help="each student's Generate, in new tokens")
    ap.add_argument("--pair", default="embedded")
    ap.add_argument("--solo", type=int, default=3, help="runs of one student alone, for S")
    ap.add_argument("--no-hostile", action="store_true", help="the class alone (a burst: --span-s 10)")
    ap.add_argument(
        "--flood",
        choices=sorted(FLOODS),
        default="mixed",
        help="what the hostile addresses send: mixed (auto-tree Generates and prepared loads) or lab "
        "(the exactness lab at the page's defaults, again and again)",
    )
    ap.add_argument("--ttl-s", type=int, default=60, help="sessions' and files' time to live; waited out at the end")
    ap.add_argument("--json", help="write every job's times here")
    args = ap.parse_args(argv)

    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        app = App(root, Path(tmp) / "gradio", Path(tmp) / "app.log", ttl_s=args.ttl_s)
        try:
            app.fn["load_prepared"] = fn_index(app.url, "load_prepared")
            config = httpx.get(f"{app.url}/config", timeout=60).json()
            app.example = next(
                c["props"]["value"]
                for c in config["components"]
                if c.get("props", {}).get("label", "").startswith("Prepared recordings")
            )
            with client(LOOPBACK) as http:  # the first run of a kind leaves what any first visitor leaves
                timed_job(http, app, "generate", generate(args.pair, args.tokens), "192.0.2.1")
                solo = [
                    timed_job(http, app, "generate", generate(args.pair, args.tokens), "192.0.2.1")
                    for _ in range(args.solo)
                ]
            service_s = statistics.median(j["ended"] - j["joined"] for j in solo)
            rss0, disk0 = app.rss(), app.disk()
            print(
                f"alone: one {args.tokens}-token Generate on {args.pair}: S = {service_s:.2f} s (median of "
                f"{args.solo}); "
                f"RSS {rss0:.0f} MB, temporary folder {disk0[0]:.1f} MB in {disk0[1]} files",
                flush=True,
            )

            log, lock, halt = [], threading.Lock(), threading.Event()
            floods = (
                []
                if args.no_hostile
                else [
                    threading.Thread(target=FLOODS[args.flood], args=(app, a, args.pair, halt, log, lock), daemon=True)
                    for a in HOSTILE
                ]
            )
            for t in floods:
                t.start()
            begin = time.monotonic() + 2.0
            arrivals = [begin + i * args.span_s / max(1, args.students) for i in range(args.students)]
            students = [
                threading.Thread(target=student, args=(app, args.pair, args.tokens, at, log, lock), daemon=True)
                for at in arrivals
            ]
            for t in students:
                t.start()
            for t in students:
                t.join()
            halt.set()
            for t in floods:
                t.join(timeout=600)
            rss1, disk1 = app.rss(), app.disk()

            report(log, service_s, args)
            print(
                f"RSS: {rss0:.0f} MB at the start, {rss1:.0f} MB at the end; temporary folder {disk1[0]:.1f} MB "
                f"in {disk1[1]} files",
                flush=True,
            )
            time.sleep(2 * args.ttl_s + 15)
            rss2, disk2 = app.rss(), app.disk()
            print(
                f"after {2 * args.ttl_s + 15} s quiet (sessions and files expired): RSS {rss2:.0f} MB "
                f"({rss2 - rss0:+.0f} MB), temporary folder {disk2[0]:.1f} MB in {disk2[1]} files",
                flush=True,
            )
            if args.json:
                Path(args.json).write_text(json.dumps({"service_s": service_s, "jobs": log}, indent=1))
        finally:
            app.stop()


def report(log: list, service_s: float, args) -> None:
    """Print the students' waits and ratios, the refusals and the device's share (module docstring)."""
    mine = sorted((job for address, api, job in log if address == SCHOOL), key=lambda j: j["joined"])
    served = [j for j in mine if j.get("success")]
    alone = alone_totals([j["joined"] for j in mine], service_s)
    print(
        f"class: {len(mine)} students behind {SCHOOL}, {len(served)} served, "
        f"{sum('refused' in j for j in mine)} refused, {len(mine) - len(served) - sum('refused' in j for j in mine)} "
        "failed"
    )
    ratios = []
    for k, (job, base) in enumerate(zip(mine, alone)):
        if "refused" in job:
            print(f"  student {k + 1:2d}: refused {job['refused']}: {job['why'][:160]}")
            continue
        wait, run, total = job["started"] - job["joined"], job["ended"] - job["started"], job["ended"] - job["joined"]
        ratios.append(total / base)
        print(
            f"  student {k + 1:2d}: wait {wait:6.2f} s, run {run:6.2f} s, total {total:6.2f} s; alone in the class's "
            f"queue {base:6.2f} s: {total / base:.2f}x"
        )
    if ratios:
        print(
            f"  ratio to alone in the class's queue: median {statistics.median(ratios):.2f}x, worst {max(ratios):.2f}x"
        )
    held: dict[str, float] = {}
    refusals: dict[tuple, int] = {}
    for address, api, job in log:
        if "refused" in job:
            refusals[(address, api, job["refused"], job["why"][:90])] = (
                refusals.get((address, api, job["refused"], job["why"][:90]), 0) + 1
            )
        elif api == "generate":
            held[address] = held.get(address, 0.0) + job["ended"] - job["started"]
    total = sum(held.values()) or 1.0
    print(f"device share (Generate jobs' start to end; fair share 1/{len(held)} = {1 / max(1, len(held)):.2f} each):")
    for address, seconds in sorted(held.items()):
        jobs = [j for a, api, j in log if a == address and api == "generate" and "refused" not in j]
        said = sorted({j.get("status", "")[:70] for j in jobs})[:3]
        print(
            f"  {address}: {seconds:.1f} s in {len(jobs)} jobs ({sum(not j.get('success') for j in jobs)} failed), "
            f"{seconds / total:.2f}; their status lines begin: {said}"
        )
    waits = [(j["joined"], j["started"]) for j in mine if "refused" not in j]
    hostile_in_waits = sum(
        max(0.0, min(j["ended"], b) - max(j["started"], a))
        for a, b in waits
        for address, api, j in log
        if address != SCHOOL and api == "generate" and "refused" not in j
    )
    print(
        f"while a student waited ({sum(b - a for a, b in waits):.1f} s in all): the hostile addresses' Generate jobs "
        "held "
        f"the device {hostile_in_waits:.1f} s"
    )
    print("refusals:" if refusals else "refusals: none")
    for (address, api, status, why), n in sorted(refusals.items()):
        print(f"  {address} {api}: {n} x {status} {why}")


if __name__ == "__main__":
    main()
