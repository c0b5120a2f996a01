"""The device keeps the turn a short while for a streaming job that would go next (specviz.serving.device_thread:
ANTICIPATE_S): a light visitor's run, whose next step is asked for only once the page has drawn the last, is not cut
into pieces by a heavy visitor's steps that are always waiting (a batch of 8 rows made a 16-token run 2.75x slower).

Control: with no anticipation the heavy steps run between the light job's steps."""

from __future__ import annotations

import threading
import time


from specviz.serving import device_thread
from specviz.serving.device_thread import Owner

LIGHT, HEAVY = Owner("10.0.0.1", "light"), Owner("10.0.0.2", "heavy")


def _order(monkeypatch, anticipate_s: float) -> list[str]:
    monkeypatch.setattr(device_thread, "_device", device_thread._Device())
    monkeypatch.setattr(device_thread, "ANTICIPATE_S", anticipate_s)
    device = device_thread._device
    device._charge(HEAVY, 100.0, time.monotonic())  # the heavy visitor has held the device a while
    ran: list[str] = []
    halt = threading.Event()

    def heavy():
        while not halt.is_set():
            device_thread.run(lambda: (ran.append("heavy"), time.sleep(0.005)), owner=HEAVY)

    def light_job():
        for _ in range(4):
            ran.append("light")
            yield

    worker = threading.Thread(target=heavy)
    worker.start()
    try:
        while "heavy" not in ran:
            time.sleep(0.001)
        for _ in device_thread.stepped(light_job(), owner=LIGHT):
            time.sleep(0.02)  # the page draws and sends the step before asking for the next
    finally:
        halt.set()
        worker.join(10)
    first = ran.index("light")
    last = len(ran) - 1 - ran[::-1].index("light")
    return ran[first : last + 1]


def test_a_light_streaming_job_keeps_its_turn_between_its_steps(monkeypatch):
    assert _order(monkeypatch, anticipate_s=2.0) == ["light"] * 4


def test_control_without_anticipation_heavy_steps_run_between_them(monkeypatch):
    assert _order(monkeypatch, anticipate_s=0.0).count("heavy") >= 2
