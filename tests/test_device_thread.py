"""One thread for every model pass (specviz.serving.device_thread): where work runs, in what order, and what
crosses back to the caller."""

from __future__ import annotations

import contextvars
import sys
import threading
import time

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



# ---- whose step goes next --------------------------------------------------------------------------------


def _queue_behind_a_held_step(steps: list[tuple[device_thread.Owner, str]]) -> list[str]:
    """Hold the device thread with one step, queue ``steps`` (owner, name) from threads in that order, let go;
    the order the device ran them in."""
    import time

    held, order, threads = threading.Event(), [], []
    started = threading.Event()

    def hold():
        started.set()
        held.wait(5)

    first = threading.Thread(target=device_thread.run, args=(hold,))
    first.start()
    started.wait(5)
    for owner, name in steps:
        t = threading.Thread(target=device_thread.run, args=(order.append, name), kwargs={"owner": owner})
        t.start()
        threads.append(t)
        time.sleep(0.02)  # queued in this order
    held.set()
    for t in [first, *threads]:
        t.join(5)
    return order


def _use(owner: device_thread.Owner, seconds: float) -> None:
    import time

    device_thread.run(time.sleep, seconds, owner=owner)


def test_a_newcomer_goes_ahead_of_the_queued_steps_of_an_address_that_used_the_device():
    """Least attained service first: the lab's address used the device, so a fresh address's step runs before
    the lab's steps that were queued before it; then the lab's in their own order."""
    lab, visitor = device_thread.Owner("192.0.2.10", "lab"), device_thread.Owner("192.0.2.20", "visitor")
    _use(lab, 0.2)
    order = _queue_behind_a_held_step([(lab, "lab 1"), (lab, "lab 2"), (visitor, "visitor")])
    assert order == ["visitor", "lab 1", "lab 2"]
    assert visitor.behind == {"the server"} and visitor.waited_s > 0  # the held step, under way when it came
    assert "visitor" in lab.behind


def test_addresses_share_the_device_whatever_their_count_of_sessions_and_an_addresss_jobs_go_in_their_order():
    """A school's address with three sessions gets the device as often as a lone address (least attained service by
    address); among its jobs the one that came first goes first, although it used the device and the later one did
    not (least-used session first made each new student's run pass the run under way, which waited for every
    newcomer in turn)."""
    school = [device_thread.Owner("198.51.100.7", f"student {i}") for i in range(3)]
    lone = device_thread.Owner("203.0.113.5", "lone")
    _use(school[0], 0.15)
    _use(lone, 0.1)
    order = _queue_behind_a_held_step([(school[1], "s1"), (lone, "lone"), (school[0], "s0")])
    # the lone address used less than the school's: first; then the school's jobs in the order they came
    assert order == ["lone", "s0", "s1"]
    # and a newcomer of the school, whatever it used, after both
    newcomer = device_thread.Owner("198.51.100.7", "student 3")
    assert _queue_behind_a_held_step([(newcomer, "new"), (school[1], "s1")]) == ["s1", "new"]


def test_a_short_job_goes_first_the_shorter_first_whoever_used_less_and_an_address_keeps_its_order():
    """Short jobs (``Owner.size_s``) go before jobs not known to be short, and the shorter first, although their
    addresses used the device more (least attained service put a pair switcher's 1-token run of the English pair,
    0.21 s of passes, before a victim's 16-token run, 0.17 s: 1.7-2.1x its time alone). Within one address the jobs
    still go in the order they came, a longer one first when it came first."""
    victim = device_thread.Owner("192.0.2.30", "victim", size_s=2.9)
    switcher = device_thread.Owner("192.0.2.31", "switcher", size_s=3.1)
    lab = device_thread.Owner("192.0.2.32", "lab")  # size unknown: after every short job
    _use(victim, 0.3)
    order = _queue_behind_a_held_step([(lab, "lab"), (switcher, "switcher"), (victim, "victim")])
    assert order == ["victim", "switcher", "lab"]
    # without sizes the one that used less goes first (the fault the sizes mend)
    plain = [device_thread.Owner("192.0.2.30", "victim"), device_thread.Owner("192.0.2.33", "switcher")]
    assert _queue_behind_a_held_step([(plain[1], "switcher"), (plain[0], "victim")]) == ["switcher", "victim"]
    # a short job of an address that used more than SHORT_FIRST_USED_S lately goes by its use: shorter jobs coming
    # without a pause held the device from a short one (8-token runs with ever longer prompts: a victim 18.8x slower)
    flooder = device_thread.Owner("192.0.2.34", "flooder", size_s=1.0)
    device_thread._device._charge(flooder, device_thread.SHORT_FIRST_USED_S + 0.5, time.monotonic())
    assert _queue_behind_a_held_step([(flooder, "flooder"), (victim, "victim")]) == ["victim", "flooder"]
    # ... lately: a visitor whose use is some seconds old (more than the bound over the last half minute) still goes
    # first with the shorter job (a bound on the half minute caught the victims' own runs)
    earlier = device_thread.Owner("192.0.2.35", "earlier", size_s=1.0)
    device_thread._device._charge(earlier, 3.0, time.monotonic() - 4 * device_thread.SHORT_FIRST_HALF_LIFE_S)
    assert device_thread._device.used(earlier) > device_thread.SHORT_FIRST_USED_S
    fresh = device_thread.Owner("192.0.2.36", "fresh", size_s=2.0)
    assert _queue_behind_a_held_step([(fresh, "fresh"), (earlier, "earlier")]) == ["earlier", "fresh"]
    # one address: the first job first, whatever its size; the address ranks by it
    first, second = device_thread.Owner("198.51.100.9", "a", size_s=8.0), device_thread.Owner("198.51.100.9", "b", 0.5)
    other = device_thread.Owner("203.0.113.9", "c", size_s=4.0)
    assert _queue_behind_a_held_step([(first, "a"), (second, "b"), (other, "c")]) == ["c", "a", "b"]


def test_an_owner_counts_its_wait_and_whose_steps_ran_meanwhile():
    a, b = device_thread.Owner("192.0.2.1", "a"), device_thread.Owner("192.0.2.2", "b")
    _use(a, 0.3)  # a used more: b's queued step runs first, and a's waits behind it
    _queue_behind_a_held_step([(a, "a"), (b, "b")])
    assert "b" in a.behind and a.waited_s > b.waited_s
    assert device_thread.Owner().waited() == ""
    a.waited_s = 3.24
    assert a.waited() == f"waited 3.2 s for the device behind {len(a.behind)} other job" + (
        "s" if len(a.behind) != 1 else ""
    )


def test_a_wrapped_function_takes_its_owner_by_keyword_and_passes_the_rest():
    seen = []

    @device_thread.steps
    def streamed(x, y=0):
        seen.append((x, y, device_thread.on_device_thread()))
        yield x + y

    @device_thread.steps
    def called(x, y=0):
        return x * y

    owner = device_thread.Owner("192.0.2.9", "s")
    assert list(streamed(1, y=2, device_owner=owner)) == [3] and seen == [(1, 2, True)]
    assert called(3, y=4, device_owner=owner) == 12 and called(2, 5) == 10
    assert device_thread._device.used(owner) > 0  # its steps were charged to its address


def _python_beside_a_step(deferred: bool) -> tuple[int, int]:
    """(iterations of a pure-Python loop on another thread that ran while a device step of 0.3 s ran, iterations in
    all): the loop ``deferring`` for an owner of its own when ``deferred``; it goes on until it has run after the
    step too."""
    running, started, done, finish = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    counts = [0, 0]

    def step():  # releases the interpreter lock while it waits, as a model pass does between its operations
        running.set()
        started.set()
        done.wait(0.3)
        running.clear()

    def note():
        counts[0] += running.is_set()
        counts[1] += 1

    def loop():
        while not finish.is_set():
            note()

    def beside():
        if deferred:
            with device_thread.deferring(device_thread.Owner("10.9.9.9")):
                loop()
        else:
            loop()

    thread = threading.Thread(target=beside)
    thread.start()
    future = device_thread._device.submit(step, device_thread.Owner("10.8.8.8"))
    started.wait()
    threading.Timer(0.3, done.set).start()
    future.result()
    after = counts[1]
    deadline = time.monotonic() + 30
    while counts[1] <= after + 100 and time.monotonic() < deadline:  # it runs once the step is over
        time.sleep(0.01)
    finish.set()
    thread.join()
    return counts[0], counts[1]


def test_python_work_inside_deferring_does_not_run_beside_a_step_and_without_it_does():
    during, total = _python_beside_a_step(deferred=True)
    # at most the one call under way when the step began (its hook had found the device idle)
    assert during <= 1 and total > 0
    during, total = _python_beside_a_step(deferred=False)  # the control: the same loop, not deferring
    assert during > 100


def test_a_deferring_thread_takes_turns_charged_to_its_owner_and_may_call_the_device_itself():
    owner = device_thread.Owner("10.7.7.7", "s")
    stop = threading.Event()

    def stream():  # another visitor's steps, one after another
        while not stop.is_set():
            yield device_thread.run(time.sleep, 0.01)

    other = threading.Thread(target=lambda: list(device_thread.stepped(stream(), device_thread.Owner("10.6.6.6"))))
    other.start()
    try:
        with device_thread.deferring(owner):
            assert isinstance(sys.getprofile(), device_thread._Deferral)
            n = sum(len(str(i)) for i in range(200_000))  # Python work: its turns are steps of ``owner``
            assert device_thread.run(lambda: 41) + 1 == 42  # a device call from inside: its own turn ends first
    finally:
        stop.set()
        other.join()
    assert n > 0 and sys.getprofile() is None
    assert device_thread._device.used(owner) > 0
    assert device_thread.run(lambda: device_thread.deferring().__enter__()._mine) is None  # nothing on the device


def test_a_deferring_threads_turn_goes_after_the_visitors_steps_until_it_is_overdue(monkeypatch):
    """A turn of deferred work (a pair's load) waits behind every visitor's step queued with it, whoever used less,
    until it has waited DEFER_OVERDUE_S; then it goes in its owner's place like any step."""

    def order_of(overdue_s: float) -> list[str]:
        monkeypatch.setattr(device_thread, "DEFER_OVERDUE_S", overdue_s)
        release, order = threading.Event(), []
        blocker = device_thread._device.submit(lambda: release.wait(10), device_thread.Owner("10.4.4.4"))
        newcomer = device_thread.Owner(f"10.3.3.{int(overdue_s)}")  # has used nothing: it would go first
        background = device_thread._device.submit(lambda: order.append("deferred"), newcomer, background=True)
        visitor = device_thread.Owner("10.4.4.4")  # has used the device (the blocker's step)
        device_thread._device._charge(visitor, 5.0, time.monotonic())
        step = device_thread._device.submit(lambda: order.append("visitor"), visitor)
        time.sleep(0.05)
        release.set()
        for future in (blocker, background, step):
            future.result(10)
        return order

    assert order_of(10.0) == ["visitor", "deferred"]
    assert order_of(0.0) == ["deferred", "visitor"]  # overdue: its owner has used less


def test_the_device_counts_as_busy_while_a_job_streams_between_its_steps():
    gate, owner = threading.Event(), device_thread.Owner("10.2.2.2")

    def job():
        yield 1
        gate.wait(10)
        yield 2

    stream = device_thread.stepped(job(), owner)
    assert next(stream) == 1
    assert device_thread._device.busy and owner.key in device_thread._device._streams  # between its steps
    gate.set()
    assert list(stream) == [2]
    assert owner.key not in device_thread._device._streams  # ended: it no longer keeps the device busy


def test_a_step_waiting_for_a_lock_a_deferring_thread_holds_does_not_hang_the_device(monkeypatch):
    """The deferring thread, holding a lock, waits for a turn; the step under way waits for that lock: the thread gives
    up its wait after DEFER_WAIT_MAX_S and goes on, so both end."""
    monkeypatch.setattr(device_thread, "DEFER_WAIT_MAX_S", 0.2)
    lock, holding, done = threading.Lock(), threading.Event(), []

    def step():
        holding.wait(10)
        with lock:  # held by the deferring thread, which waits for the device
            done.append("step")

    def beside():
        with device_thread.deferring(device_thread.Owner("10.1.2.3")):
            with lock:
                holding.set()
                time.sleep(0.05)  # the step is under way and waits for the lock
                sum(range(10))  # a Python call: the thread asks for a turn, which the blocked step never grants
            done.append("beside")

    future = device_thread._device.submit(step, device_thread.Owner("10.3.2.1"))
    thread = threading.Thread(target=beside)
    thread.start()
    thread.join(10)
    future.result(10)
    assert sorted(done) == ["beside", "step"]


def test_a_deferring_thread_asking_for_a_turn_inside_another_pools_submit_does_not_hang(monkeypatch):
    """A thread pool's ``submit`` holds a lock global to every pool while it starts a worker thread; a deferring thread
    inside it (transformers' loading starts its own pool's threads) asks for its turn there while the device is busy
    (here at every Python call: a slice of 0 s). The device thread is no pool's worker, so asking takes no such lock
    (it did, and hung every run)."""
    import concurrent.futures

    monkeypatch.setattr(device_thread, "DEFER_SLICE_S", 0.0)

    gate, owner, done = threading.Event(), device_thread.Owner("10.4.4.4"), []

    def job():
        yield 1
        gate.wait(10)
        yield 2

    stream = device_thread.stepped(job(), owner)
    assert next(stream) == 1 and device_thread._device.busy  # a job streams: the device counts as busy

    def beside():
        with device_thread.deferring(device_thread.Owner("10.5.5.5")):
            for _ in range(3):  # each submit may start a worker thread inside the global lock
                with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
                    done.append(sum(pool.submit(sum, range(k)).result() for k in range(4)))

    thread = threading.Thread(target=beside, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and done == [4, 4, 4]  # (hung, it would hold the device's lock: checked first)
    gate.set()
    assert list(stream) == [2]
