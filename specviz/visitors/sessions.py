"""``python -m specviz.visitors.sessions``: the app's memory under many sessions and its disk under an upload flood.

Launches the app (``app.py``) in a process of its own, on 127.0.0.1 with a fresh Gradio temporary
folder, and drives it over HTTP as visitors would:

1. **Memory.** One maximum-size recording (as many 16-draft rounds as fit under the 8 MB upload cap,
   at most 4,096: the largest file the page loads) is uploaded once; then ``--sessions`` sessions (110
   by default), each with a session hash of its own, load it through the page's load endpoint
   (``/load_recording``), one after another. Each session's state then holds that recording, until
   Gradio drops the oldest sessions past ``SPECVIZ_MAX_SESSIONS``. Printed: the app's resident set
   size (RSS, from ``/proc/<pid>/status``) before the loads, after every tenth session and at the
   end, in MB (2^20 bytes).
2. **Disk.** Uploads of 8 MB of random bytes (``--upload-mb``), each address sending until it is
   refused, from one address after another on the loopback network (127.0.0.11, .12, ...), until a
   fresh address's first upload is refused (the total budget). Printed: uploads taken and refused per
   address, and the bytes under the Gradio temporary folder (the upload folder) afterwards.

The figures depend on the machine; nothing here asserts them. Linux only (RSS from /proc; loopback
addresses other than 127.0.0.1). Takes a few minutes (each load of the largest recording is seconds
of Python on a busy two-core machine).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROUNDS_MAX = 4096  # rounds a page-made run has at most (the largest recording the page writes)


def largest_recording() -> str:
    """A recording just under the upload cap (``specviz.recording.MAX_BYTES``): a prepared recording's
    rejected-first-draft round widened to MAX_GAMMA drafts, repeated as often as fits (at most ROUNDS_MAX)."""
    from specviz.assets import ASSETS
    from specviz.recording import MAX_BYTES
    from specviz.trace import MAX_GAMMA

    d = json.loads((ASSETS / "recordings" / "sampled-gamma8.json").read_text())
    spec = d["speculative"]
    r = next(r for r in spec["rounds"] if r["final_kind"] == "correction" and r["drafts"][0]["verdict"] == "rejected")
    one = copy.deepcopy(r)
    first = one["drafts"][0]
    one["drafts"] = [first] + [dict(first, verdict="discarded") for _ in range(MAX_GAMMA - 1)]
    one["gamma"] = MAX_GAMMA
    one["emitted_ids"] = [one["final_token_id"]]
    d["baseline"] = d["sweep"] = None
    n = min(ROUNDS_MAX, (MAX_BYTES - len(json.dumps(d)) - 4096) // (len(json.dumps(one)) + 2))
    spec["rounds"] = [one] * n
    spec["output_ids"] = [one["final_token_id"]] * n
    spec["settings"]["gamma"] = MAX_GAMMA
    spec["settings"]["max_new_tokens"] = n
    return json.dumps(d)


def rss_mb(pid: int) -> float:
    """A process's resident set size in MB (2^20 bytes), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise OSError(f"no VmRSS for process {pid}")


def folder_mb(root: Path) -> float:
    """Bytes of the files under ``root``, in MB."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 2**20


def client(address: str = "127.0.0.1") -> httpx.Client:
    """An HTTP client whose connections leave from ``address``."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=600)


def fn_index(url: str, api_name: str) -> int:
    deps = httpx.get(f"{url}/config", timeout=60).json()["dependencies"]
    return next(d["id"] for d in deps if d.get("api_name") == api_name)


def call(http: httpx.Client, url: str, fn: int, data: list) -> dict:
    """Join the queue as a fresh session, read its event stream to the end; the last message."""
    session = uuid.uuid4().hex
    body = {"data": data, "fn_index": fn, "session_hash": session, "event_data": None, "trigger_id": None}
    r = http.post(f"{url}/gradio_api/queue/join", json=body)
    r.raise_for_status()
    last: dict = {}
    with http.stream("GET", f"{url}/gradio_api/queue/data", params={"session_hash": session}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                last = json.loads(line[5:])
                if last.get("msg") == "process_completed":
                    break
    return last


def upload(http: httpx.Client, url: str, name: str, blob: bytes) -> httpx.Response:
    return http.post(f"{url}/gradio_api/upload", files={"files": (name, blob, "application/json")})


def measure_sessions(url: str, pid: int, sessions: int, work: Path) -> None:
    big = work / "largest.json"
    big.write_text(largest_recording())
    with client() as http:
        r = upload(http, url, "largest.json", big.read_bytes())
        r.raise_for_status()
        path = r.json()[0]
        fn = fn_index(url, "load_recording")
        print(
            f"largest recording: {big.stat().st_size / 2**20:.2f} MB of JSON; RSS before any load: {rss_mb(pid):.0f} "
            "MB",
            flush=True,
        )
        start = time.monotonic()
        for i in range(1, sessions + 1):
            last = call(
                http, url, fn, [{"path": path, "orig_name": "largest.json", "meta": {"_type": "gradio.FileData"}}]
            )
            if not last.get("success"):
                print(f"session {i}: the load failed: {str(last.get('output'))[:300]}", flush=True)
            if i % 10 == 0 or i == sessions:
                print(f"after {i} sessions ({time.monotonic() - start:.0f} s): RSS {rss_mb(pid):.0f} MB", flush=True)
    time.sleep(5)
    print(f"5 s after the last load: RSS {rss_mb(pid):.0f} MB", flush=True)


def measure_uploads(url: str, temp: Path, upload_mb: float, addresses_max: int = 64) -> None:
    before = folder_mb(temp)
    size = int(upload_mb * 2**20) - 1024  # just under Gradio's max_file_size when 8 MB
    taken_all = 0
    for k in range(addresses_max):
        address = f"127.0.0.{11 + k}"
        taken = 0
        with client(address) as http:
            while True:
                r = upload(http, url, "flood.json", os.urandom(size))
                if r.status_code != 200:
                    refusal = f"{r.status_code} {r.text[:120]!r}"
                    break
                taken += 1
        taken_all += taken
        print(f"{address}: {taken} uploads of {size / 2**20:.2f} MB taken, then {refusal}", flush=True)
        if taken == 0:
            break
    print(
        f"upload flood: {taken_all} uploads ({taken_all * size / 2**20:.0f} MB) taken; the Gradio temporary folder "
        "holds "
        f"{folder_mb(temp):.0f} MB (it held {before:.0f} MB before the flood)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sessions", type=int, default=110, help="sessions loading the largest recording (default 110)"
    )
    parser.add_argument("--upload-mb", type=float, default=8.0, help="size of one flood upload in MB (default 8)")
    parser.add_argument("--skip", choices=("memory", "disk"), help="leave one measurement out")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="specviz-measure-") as tmp:
        temp, work = Path(tmp) / "gradio", Path(tmp) / "work"
        temp.mkdir()
        work.mkdir()
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = os.environ | {"GRADIO_TEMP_DIR": str(temp), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
        log = open(work / "server.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "app.py", "--port", str(port)], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            if not _wait_up(url, proc, 300):
                raise SystemExit(f"the app did not start: {(work / 'server.log').read_text()[-2000:]}")
            print(
                f"app up (SPECVIZ_MAX_SESSIONS={os.environ.get('SPECVIZ_MAX_SESSIONS', 'default')}); RSS "
                f"{rss_mb(proc.pid):.0f} MB",
                flush=True,
            )
            if args.skip != "memory":
                measure_sessions(url, proc.pid, args.sessions, work)
            if args.skip != "disk":
                measure_uploads(url, temp, args.upload_mb)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end and proc.poll() is None:
        try:
            if httpx.get(f"{url}/config", timeout=10).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(1)
    return False


if __name__ == "__main__":
    main()
