"""A pair's load runs on the load thread (specviz.serving.load_thread): the device thread takes other visitors' steps
while it runs, the load's tensor work uses one intra-op thread there (no second OpenMP team), the device thread keeps
its own count, the product kernels' timing is handed back to the device thread, and the load's Python defers to the
device thread's steps."""

from __future__ import annotations

import sys
import threading

import torch

from specviz.serving import device_thread, load_thread


def test_a_load_holds_the_visitor_who_asked_and_not_the_device_thread(monkeypatch):
    from specviz.ui.running import pairs

    before = device_thread.run(torch.get_num_threads)
    started, release, seen = threading.Event(), threading.Event(), {}

    def slow_load(**ids):
        seen["thread"] = threading.get_ident()
        seen["threads"] = torch.get_num_threads()
        seen["timing"] = ids.get("timing")
        seen["deferral"] = sys.getprofile()  # its Python waits for the device thread's steps, in turns for the visitor
        seen["timed_on"] = ids["timing"](threading.get_ident)  # what the kernels' timing would run on
        started.set()
        assert release.wait(30)
        return "pair"

    monkeypatch.setattr(pairs, "load_pair", slow_load)
    monkeypatch.setattr(pairs, "loaded_pair", lambda **ids: None)  # not resident: it loads
    got = {}
    visitor = threading.Thread(
        target=lambda: got.setdefault(
            "pair", pairs.ensure_pair("embedded", "", "", lambda *a, **k: None, owner=device_thread.Owner("10.1.1.1"))
        )
    )
    visitor.start()
    try:
        assert started.wait(30)
        # the load is under way: the device thread still takes another visitor's step, at once
        assert device_thread.run(lambda: 41 + 1) == 42
        assert not got
    finally:
        release.set()
        visitor.join(30)
    assert got["pair"] == "pair"
    assert seen["thread"] == load_thread._ident and seen["thread"] != device_thread._device.ident
    assert seen["threads"] == 1  # the load's tensor work runs inline on its thread: no OpenMP team of its own
    assert seen["timing"] is device_thread.run and seen["timed_on"] == device_thread._device.ident
    assert device_thread.run(torch.get_num_threads) == before  # the device thread's own count is as it was
    assert load_thread.run(threading.get_ident) == seen["thread"]  # one load thread, reused
    assert isinstance(seen["deferral"], device_thread._Deferral) and seen["deferral"].owner.address == "10.1.1.1"
    assert load_thread.run(sys.getprofile) is not seen["deferral"]  # each load defers for its own visitor


def test_a_resident_pair_is_not_queued_behind_another_pairs_load(monkeypatch):
    """A visitor whose pair is resident gets it at once while another visitor's load holds the load thread."""
    from specviz.ui.running import pairs

    started, release = threading.Event(), threading.Event()

    def slow():
        started.set()
        assert release.wait(30)

    monkeypatch.setattr(
        pairs, "loaded_pair", lambda **ids: "the resident pair" if ids == {"name": "embedded"} else None
    )
    other = threading.Thread(target=load_thread.run, args=(slow,))
    other.start()
    try:
        assert started.wait(30)
        assert pairs.ensure_pair("embedded", "", "", lambda *a, **k: None) == "the resident pair"
    finally:
        release.set()
        other.join(30)


def test_an_error_on_the_load_thread_is_raised_in_the_callers():
    def broken():
        raise ValueError("no such pair")

    try:
        load_thread.run(broken)
    except ValueError as err:
        assert "no such pair" in str(err)
    else:
        raise AssertionError("the load thread's error was lost")
