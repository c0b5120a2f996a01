"""One thread for every model pass (specviz.serving.device_thread): where work runs, in what order, and what
crosses back to the caller."""

from __future__ import annotations

import contextvars
import threading

import pytest

from specviz.serving import device_thread

WHO = contextvars.ContextVar("who", default=None)


def test_a_call_runs_on_one_thread_with_its_callers_context_and_its_error_comes_back():
    WHO.set("visitor")
    seen = device_thread.run(lambda: (threading.get_ident(), WHO.get(), device_thread.on_device_thread()))
    assert seen[1:] == ("visitor", True) and seen[0] != threading.get_ident()
    assert device_thread.run(threading.get_ident) == seen[0]  # the same thread every time
    assert device_thread.run(lambda: device_thread.run(lambda: 7)) == 7  # a call from the device thread runs inline
    with pytest.raises(ZeroDivisionError):
        device_thread.run(lambda: 1 / 0)


def test_two_streams_take_turns_step_by_step_and_a_closed_stream_is_closed_on_the_device_thread():
    order, closed_on = [], []

    def job(name):
        try:
            for i in range(3):
                order.append((name, i, device_thread.on_device_thread()))
                yield i
        finally:
            closed_on.append(device_thread.on_device_thread())

    a, b = device_thread.stepped(job("a")), device_thread.stepped(job("b"))
    assert [next(a), next(b), next(a), next(b)] == [0, 0, 1, 1]
    a.close()
    assert list(b) == [2]
    assert order == [("a", 0, True), ("b", 0, True), ("a", 1, True), ("b", 1, True), ("b", 2, True)]
    assert closed_on == [True, True]


def test_an_error_inside_a_stream_reaches_the_caller():
    def broken():
        yield 1
        raise ValueError("step two")

    steps = device_thread.stepped(broken())
    assert next(steps) == 1
    with pytest.raises(ValueError, match="step two"):
        next(steps)

