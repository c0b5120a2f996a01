"""The page warms its default pair up before it serves (``specviz.ui.running.pairs.warm_up``): the pair is loaded and
one short Generate has run when ``build_demo`` returns, so the first visitor's Generate loads nothing. The tests'
conftest turns the warm-up off for every other server (``SPECVIZ_WARM_UP=0``); these turn it on, or check that off means
off.

The default pair here is the embedded one: the English pair's package is taken as absent, and no hub is reached."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from tests.conftest import free_port  # noqa: E402

pytestmark = pytest.mark.slow

GENERATE = ("embedded", "def is_prime(n):", 4, 0.7, 40, 0.95, 16, 0, True, "", "", "model", "constant", 1.0, "chain")


@pytest.fixture
def counted(monkeypatch):
    """The embedded pair as the default, nothing resident, and a count of what loads and what the warm-up runs:
    {"loads": [labels loaded], "runs": [the target of each speculative run (with its baseline) the warm-up made]}."""
    from specviz.pair import EMBEDDED, cache, catalogue, unload_all
    from specviz.ui.running import pairs

    monkeypatch.setattr(catalogue, "english_available", lambda: False)  # as where the English pair's package is absent
    monkeypatch.delenv("SPECVIZ_PRELOAD", raising=False)
    seen = {"loads": [], "runs": []}
    load, run = cache.load, pairs.with_baseline

    def counted_load(label, *args, **kwargs):
        seen["loads"].append(label)
        return load(label, *args, **kwargs)

    def counted_run(ids, drafter, target, *args, **kwargs):
        seen["runs"].append(target)
        return run(ids, drafter, target, *args, **kwargs)

    monkeypatch.setattr(cache, "load", counted_load)
    monkeypatch.setattr(pairs, "with_baseline", counted_run)
    unload_all()
    assert catalogue.default_pair() == EMBEDDED
    yield seen
    unload_all()


def _first_generate(demo) -> str:
    """Launch ``demo`` and press Generate once through its API: the status line."""
    from gradio_client import Client

    from specviz.ui import launch_kwargs

    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, **launch_kwargs(free_port()))
    try:
        return Client(url, verbose=False).predict(*GENERATE, api_name="/generate")[4]
    finally:
        demo.close()


def test_the_default_pair_is_loaded_and_run_before_the_page_serves(counted, monkeypatch):
    from specviz.pair import EMBEDDED, loaded_pair, resident_pairs
    from specviz.ui import build_demo

    monkeypatch.setenv("SPECVIZ_WARM_UP", "1")
    demo = build_demo()  # the server does not listen yet
    assert resident_pairs() == [EMBEDDED] and counted["loads"] == [EMBEDDED]
    # and one short Generate ran on it
    assert len(counted["runs"]) == 1 and counted["runs"][0] is loaded_pair(EMBEDDED).target
    status = _first_generate(demo)
    assert status.startswith("Done"), status
    assert counted["loads"] == [EMBEDDED]  # the first visitor's Generate loaded nothing


def test_the_warm_up_is_switched_off_by_its_environment_variable(counted, monkeypatch):
    from specviz.pair import EMBEDDED, resident_pairs
    from specviz.ui import build_demo
    from specviz.ui.running.pairs import warm_up_wanted

    for off in ("0", "false", " No ", "OFF"):
        monkeypatch.setenv("SPECVIZ_WARM_UP", off)
        assert not warm_up_wanted()
    for on in ("1", "yes", ""):
        monkeypatch.setenv("SPECVIZ_WARM_UP", on)
        assert warm_up_wanted()
    monkeypatch.setenv("SPECVIZ_WARM_UP", "0")
    demo = build_demo()
    assert resident_pairs() == [] and counted == {"loads": [], "runs": []}
    status = _first_generate(demo)
    assert status.startswith("Done"), status
    assert counted["loads"] == [EMBEDDED]  # loaded on its first use instead
