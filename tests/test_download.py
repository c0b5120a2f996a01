"""Hub downloads run in the background within a time and a size limit (``specviz.pair.download``).

Every test but one runs as the web page's loads do (inside ``in_background()``).

The hub is never reached: every test passes a fake ``fetch`` (the download) and ``sizes`` (the hub's
file list). Waits are bounded by events, never by assertions on wall-clock time.
"""

from __future__ import annotations

import threading
import time

import pytest

from specviz.pair import download
from specviz.pair.download import DOWNLOAD_GB_ENV, DOWNLOAD_S_ENV, Downloads, Stopped
from specviz.pair.errors import PairError


@pytest.fixture(autouse=True)
def answered_at_once():
    """As the web page's loads are: a download under way is left to run in the background."""
    with download.in_background():
        yield


def wait_for(condition, cap_s: float = 30.0) -> bool:
    end = time.monotonic() + cap_s
    while time.monotonic() < end and not condition():
        time.sleep(0.01)
    return condition()


def test_a_model_over_the_size_limit_is_refused_before_any_download(monkeypatch):
    monkeypatch.setenv(DOWNLOAD_GB_ENV, "2")
    fetched = []
    hub = Downloads(fetch=lambda *a: fetched.append(a) or "/nowhere", sizes=lambda repo, rev: int(15e9), wait_s=0.01)
    with pytest.raises(PairError, match=f"15.0 GB of files.*limit of 2 GB \\({DOWNLOAD_GB_ENV}\\)"):
        hub.folder("someone/huge", "abc")
    assert not fetched


def test_the_caller_is_answered_while_the_download_goes_on(tmp_path):
    release, started = threading.Event(), threading.Event()

    def fetch(repo, rev, stop):
        started.set()
        release.wait(30)
        return str(tmp_path)

    hub = Downloads(fetch=fetch, sizes=lambda repo, rev: 1000, wait_s=0.01)
    with pytest.raises(PairError, match="downloading in the background"):
        hub.folder("someone/model", "abc")
    assert started.is_set() and not release.is_set()  # answered before the download ended
    with pytest.raises(PairError, match="one download at a time"):
        hub.folder("someone/other", None)
    release.set()
    assert wait_for(lambda: hub._jobs[("someone/model", "abc")].done.is_set())
    assert hub.folder("someone/model", "abc") == str(tmp_path)


def test_outside_the_web_page_a_load_waits_for_its_download(tmp_path):
    release = threading.Event()

    def fetch(repo, rev, stop):
        release.wait(30)
        return str(tmp_path)

    hub = Downloads(fetch=fetch, sizes=lambda repo, rev: 1000, wait_s=0.01)
    threading.Timer(0.2, release.set).start()
    answers = []
    # a thread outside in_background()
    worker = threading.Thread(target=lambda: answers.append(hub.folder("someone/model", None)))
    worker.start()
    worker.join(60)
    assert answers == [str(tmp_path)] and release.is_set()


def test_a_download_past_its_time_limit_is_stopped_with_a_message_naming_the_limit(monkeypatch, tmp_path):
    monkeypatch.setenv(DOWNLOAD_S_ENV, "0.2")
    ended = threading.Event()

    def fetch(repo, rev, stop):
        try:
            for _ in range(3000):  # bytes keep arriving, slowly
                stop(100)
                time.sleep(0.01)
        except Stopped:
            ended.set()
            raise
        return str(tmp_path)

    hub = Downloads(fetch=fetch, sizes=lambda repo, rev: 10**6, wait_s=0.01)
    with pytest.raises(PairError, match="background"):
        hub.folder("someone/slow", None)
    assert ended.wait(30)  # the download itself was told to stop
    with pytest.raises(PairError, match=f"longer than this server's limit of 0.2 s \\({DOWNLOAD_S_ENV}\\)"):
        hub.folder("someone/slow", None)


def test_a_download_sending_more_than_the_size_limit_is_stopped(monkeypatch, tmp_path):
    monkeypatch.setenv(DOWNLOAD_GB_ENV, "0.000001")  # 1,000 bytes

    def fetch(repo, rev, stop):
        for _ in range(100):
            stop(100)  # the hub said 10 bytes; 10,000 arrive
        return str(tmp_path)

    # the fake is quick: the first answer is the last
    hub = Downloads(fetch=fetch, sizes=lambda repo, rev: 10, wait_s=30)
    with pytest.raises(PairError, match=f"more than this server's limit of 1e-06 GB \\({DOWNLOAD_GB_ENV}\\)"):
        hub.folder("someone/liar", None)


def test_hub_fetch_counts_every_files_bytes_and_stops_when_told(monkeypatch):
    import huggingface_hub

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None, tqdm_class=None):
        assert "*.safetensors" in allow_patterns and not any(p.endswith((".bin", ".py")) for p in allow_patterns)
        bar = tqdm_class(total=10, disable=True)
        bar.update(4)
        bar.update(6)
        return "/cache/snapshot"

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    seen = []
    assert download.hub_fetch("someone/model", "abc", seen.append) == "/cache/snapshot"
    assert seen == [4, 6]

    def refuse(n):
        raise Stopped("over")

    with pytest.raises(Stopped):
        download.hub_fetch("someone/model", "abc", refuse)


def test_a_hub_pair_loads_once_downloaded_and_the_load_does_not_wait_for_the_download(monkeypatch):
    import torch

    from specviz.pair import loading
    from specviz.pair.catalogue import PRESETS, ModelRef
    from tests.test_pair import FakeHub

    hub = FakeHub(monkeypatch)  # the hub's answers and from_pretrained, faked: nothing reaches the network
    hub.add("someone/drafter", PRESETS["embedded"].drafter)
    hub.add("someone/target", PRESETS["embedded"].target)
    release = threading.Event()

    def fetch(repo, rev, stop):
        release.wait(30)
        return hub.fetch(repo, rev, stop)

    monkeypatch.setattr(download, "HUB", Downloads(fetch=fetch, sizes=lambda repo, rev: 1000, wait_s=0.01))
    refs = (ModelRef("someone/drafter"), ModelRef("someone/target"))
    with pytest.raises(PairError, match="someone/drafter' is downloading in the background"):
        loading.load("custom", refs, torch.device("cpu"), None, lambda f, m: None)
    assert not release.is_set() and not hub.loads()  # answered while the download waits; nothing loaded
    release.set()
    pair = None
    for _ in range(200):  # the drafter's download, then the target's: each answered at once until done
        try:
            pair = loading.load("custom", refs, torch.device("cpu"), None, lambda f, m: None)
            break
        except PairError as err:
            assert "background" in str(err), err
            time.sleep(0.05)
    assert pair is not None and pair.drafter_id == "someone/drafter" and pair.target_id == "someone/target"
    assert [c[1] for c in hub.calls if c[0] == "download"] == ["someone/drafter", "someone/target"]
    assert all(c[2]["local_files_only"] for c in hub.loads())  # loaded from what was downloaded


def test_the_pages_load_is_answered_while_the_download_goes_on(monkeypatch):
    import gradio as gr

    from specviz.pair import cache
    from specviz.pair.catalogue import PRESETS
    from specviz.ui.running.pairs import ensure_pair
    from tests.test_pair import FakeHub

    monkeypatch.setenv("SPECVIZ_ALLOW_CUSTOM_MODELS", "1")
    hub = FakeHub(monkeypatch)
    hub.add("someone/drafter", PRESETS["embedded"].drafter)
    hub.add("someone/target", PRESETS["embedded"].target)
    release = threading.Event()
    monkeypatch.setattr(
        download,
        "HUB",
        Downloads(
            fetch=lambda repo, rev, stop: release.wait(30) and hub.fetch(repo, rev, stop), sizes=lambda repo, rev: 1000
        ),
    )
    before = cache.resident_pairs()
    answers = []

    def page():  # a thread of its own: only ensure_pair's own in_background() applies
        try:
            ensure_pair("", "someone/drafter", "someone/target", lambda f, desc=None: None)
        except gr.Error as err:
            answers.append(err.message)

    worker = threading.Thread(target=page)
    worker.start()
    worker.join(60)
    release.set()
    assert answers and "downloading in the background" in answers[0], answers
    assert cache.resident_pairs() == before  # nothing unloaded for a pair still downloading
