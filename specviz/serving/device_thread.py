"""One thread for every model pass of a serving process.

A web server runs each visitor's job in a thread of its pool. On a CPU, torch's products run in parallel
regions of OpenMP (GNU's libgomp in torch's Linux wheels), and libgomp keeps a team of worker threads for
every thread that ever entered a parallel region. Once a process holds more such threads than cores,
libgomp stops spinning between regions and puts its workers to sleep after each one: a decoding step is
hundreds of short regions, each then paying a wake-up. Measured on a 2-core CPU with AVX-512 BF16, the
English pair at the page's defaults (128 tokens, T 0.7): 52 speculative and 45 plain tokens/s when one
thread ran every pass, 35 and 31 once the main thread had run a pass before a second thread ran them
(OMP_WAIT_POLICY=passive gives the same 34 and 30). The server's /run was at 0.66x bench's rate for that
reason.

So the app hands every model pass to one long-lived thread, the device thread: a job's steps
(``steps``: each ``next`` of a streaming job) and single calls (``run``: the start-up warm-up) run there one
at a time, each in a copy of its caller's context variables (so a web framework's per-request state, such
as its progress bar, is still found). Jobs streaming at once take turns step by step instead of splitting
the cores between two teams. A call made on the device thread itself runs inline. On a GPU the same thread
keeps one CUDA stream and one set of captured graphs busy.

**Which step goes next** (short jobs first, the shorter first; then least attained service between addresses; first come
first served within one): every step is for an ``Owner`` (a job of a visitor's address and page session; a job names it,
``stepped(..., owner=)``). A job known to be short (``Owner.size_s``: its expected device seconds, set for a Generate or
/run job of at most a job's share, ``specviz.ui.running.share.short_size``) of an address that has used at most
SHORT_FIRST_USED_S over the last few seconds goes before every job not known to be short, and before longer short jobs:
a visitor's 16-token run of the embedded pair beside another's 1-token run of the English pair (its prefills: 0.21 s of
passes against the victim's 0.17 s) took 1.7-2.1x its time alone when the switcher went first for having used the device
less, as least attained service would have it. Then the thread remembers the device seconds each address used, decaying
with a half-life of HALF_LIFE_S, and of the steps left it runs the one whose address used least, then the one of the job
that came first (``Owner.arrival``). So a visitor who just arrived goes ahead of every step of a visitor who has held
the device for a while, and addresses share the device equally whatever the count of sessions behind each. Within one
address (a class behind a school's router) the jobs go in the order they came, as a queue of their own would serve them,
whatever their sizes (an address is ranked by its first job waiting): least-used session first there let each new
student's run go ahead of the run under way, which then waited for every newcomer in turn (with two runs at once, a
16-token run took 4.2 s instead of 0.4 s in a class of 40; ``python -m specviz.visitors.classroom``). A step is never
interrupted: a newcomer waits at most for the step under way, which is why long jobs (the exactness lab) cut their work
into short steps. Each owner counts the seconds its steps waited and whose steps ran meanwhile (``Owner.waited_s``,
``Owner.behind``), so a run can say "waited 3.2 s behind 4 other jobs".

**Python work beside the steps defers to them** (``deferring``): a step's passes give up the interpreter lock at
every torch operation and must take it back when the operation ends, so any other thread running Python meanwhile
(a pair's load, an export's page) holds the step up at each of its hundreds of operations, whatever the thread's
scheduling priority: beside one thread looping in pure Python at the lowest priority, a 16-token Generate of the
embedded pair took 8.2 s instead of 0.2 s (Python's default switch interval), and beside a load of the English pair
4.1x its time alone at the server's 0.05 ms (2-core CPU, AVX-512 BF16, ``python -m specviz.visitors.beside_load``).
Code run inside ``deferring(owner)`` checks at each of its Python calls whether the device thread has a step; if it
has (or a job streams: its next step comes within a moment), the code asks for a turn of its own, a step for
``owner`` that goes after every visitor's step until it has waited DEFER_OVERDUE_S, and runs DEFER_SLICE_S in it while
the device thread waits. So it runs where the device is idle, or a slice a second beside a stream of steps, never
beside another's step but for the C call under way when one starts. Beside the English pair's load a victim's
back-to-back 16-token runs took 1.4-1.7x their time alone (median; worst 2.6-2.8x, 4.1x and 4.7-5.0x before), and
the load 6.3-6.8 s instead of 1.4-1.6 s.

Errors raised on the device thread are raised again in the caller's thread. This module imports nothing
of torch.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import inspect
import itertools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

HALF_LIFE_S = 30.0  # device seconds used count half after this long
# A short job goes first only while its address has used at most SHORT_FIRST_USED_S device seconds lately (decayed with
# a half-life of SHORT_FIRST_HALF_LIFE_S): shorter jobs arriving without a pause would otherwise hold the device from a
# short job for as long as they come. 8-token /run posts with ever longer prompts from one address, each shorter than a
# victim's 16-token run, went before it on every step: 18.8x its time alone. Such a flood keeps the device busy most
# of the time and passes the bound within about 2 s; a visitor's own runs, three back to back, stay under it (about
# 0.9 s). Against HALF_LIFE_S's memory the bound caught the victims themselves: after a few minutes of runs a visitor
# had used 2 s over the last half minute, and a pair switcher's fresh steps went first again.
SHORT_FIRST_USED_S = 1.5
SHORT_FIRST_HALF_LIFE_S = 3.0
# A streaming job asks for its next step only once its caller has handled the last (a page's views drawn and sent):
# for this long after its step the device keeps its turn for it, when it is the one that would go next.
ANTICIPATE_S = 0.2
# Python work off the device thread, inside ``deferring``: while the device thread has steps, it runs in turns of
# this long (a step of its own, the device thread waiting meanwhile)
DEFER_SLICE_S = 0.05
# the longest the device thread waits in a deferring thread's turn (its slice, and the C call under way at the
# slice's end)
DEFER_TURN_MAX_S = 2.0
# A deferring thread's turn goes after every other waiting step until it has waited this long (then in its owner's
# place): beside a stream of steps such work runs a slice a second at least, and a step beside it loses a twentieth.
DEFER_OVERDUE_S = 1.0
# the longest a deferring thread waits for its turn before it runs a slice anyway: the device's step under way may be
# waiting for a lock the deferring thread holds
DEFER_WAIT_MAX_S = 2.0


_arrivals = itertools.count()


class Owner:
    """Whom device steps are for: a job of a visitor's ``address`` and page ``session`` ("" when unknown: the server
    itself); one per job.

    ``arrival``: the job's place among all owners made (an address's jobs go in this order); ``size_s``: the job's
    expected device seconds when it is known to be short (its steps go before those of jobs not known to be short, the
    shorter first; None: long or unknown); ``waited_s``: seconds this owner's steps spent queued behind other owners'
    steps; ``behind``: the sessions (or addresses) of the other owners whose steps ran meanwhile.
    """

    def __init__(self, address: str = "", session: str = "", size_s: float | None = None):
        self.address, self.session = address or "", session or ""
        self.size_s = size_s
        self.arrival = next(_arrivals)
        self.waited_s = 0.0
        self.behind: set[str] = set()

    @property
    def key(self) -> str:
        return f"{self.address}|{self.session}"

    def waited(self, at_least_s: float = 0.5) -> str:
        """"waited 3.2 s for the device behind 4 other jobs" once the waits add up to ``at_least_s``, else ""."""
        if self.waited_s < at_least_s:
            return ""
        n = len(self.behind)
        return f"waited {self.waited_s:.1f} s for the device behind {n} other job{'s' if n != 1 else ''}"


SERVER = Owner()  # steps no visitor asked for (the start-up warm-up), and any caller that names no owner


class _Step:
    __slots__ = ("call", "future", "owner", "seq", "queued", "background")

    def __init__(self, call: Callable, owner: Owner, seq: int, background: bool = False):
        self.call, self.owner, self.seq, self.background = call, owner, seq, background
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.queued = time.monotonic()


def _who(owner: Owner) -> str:
    return owner.session or owner.address or "the server"


class _Device:
    """The device thread and its queue of steps (see the module docstring for the order)."""

    def __init__(self, half_life_s: float = HALF_LIFE_S):
        self.half_life_s = half_life_s
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._streams: dict[str, int] = {}  # owner key -> its streaming jobs under way (``stepped``)
        self._last: Owner | None = None  # whose step ran last
        self._waiting: list[_Step] = []
        self._used: dict[str, tuple[float, float]] = {}  # address -> (seconds, when), half-life ``half_life_s``
        self._lately: dict[str, tuple[float, float]] = {}  # the same, half-life SHORT_FIRST_HALF_LIFE_S
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._running: _Step | None = None
        self.ident: int | None = None
        self.busy = False  # a step runs or waits, or a job streams (``_mark_busy``); read without the lock

    def _level(self, key: str, now: float, lately: bool = False) -> float:
        """The device seconds ``key`` (an address) used, decayed to ``now``: with a half-life of ``half_life_s``, or of
        SHORT_FIRST_HALF_LIFE_S (``lately``)."""
        seconds, when = (self._lately if lately else self._used).get(key, (0.0, now))
        return seconds * 0.5 ** ((now - when) / (SHORT_FIRST_HALF_LIFE_S if lately else self.half_life_s))

    def _charge(self, owner: Owner, seconds: float, now: float) -> None:
        self._used[owner.address] = (self._level(owner.address, now) + seconds, now)
        self._lately[owner.address] = (self._level(owner.address, now, lately=True) + seconds, now)
        if len(self._used) > 4096:  # forget those whose use has decayed away
            self._used = {k: v for k, v in self._used.items() if self._level(k, now) > 1e-3}
            self._lately = {k: v for k, v in self._lately.items() if k in self._used}

    def submit(self, call: Callable, owner: Owner, background: bool = False) -> concurrent.futures.Future:
        step = _Step(call, owner, next(self._seq), background)
        with self._lock:
            if self._thread is None:
                # The device thread: it runs the step that goes next as long as steps wait. Not a thread pool's
                # worker: a pool's ``submit`` takes a lock global to every pool (``concurrent.futures.thread``), and a
                # deferring thread asks for its turn here from inside whatever it runs, another pool's ``submit``
                # included (transformers' loading starts threads there): it waited for that lock, held by itself, and
                # every visitor's run with it.
                self._thread = threading.Thread(target=self._serve, name="specviz-device", daemon=True)
                self._thread.start()
            self._waiting.append(step)
            self._mark_busy()
            self._arrived.notify_all()
            if self._running is not None and self._running.owner.key != owner.key:
                owner.behind.add(_who(self._running.owner))  # it waits for the step under way
        return step.future

    def _serve(self) -> None:
        self.ident = threading.get_ident()
        while True:
            self._turn()

    def _rank(self, head: Owner, now: float) -> tuple:
        """An address's place, lowest first, by ``head``, its first job waiting: a short job (``Owner.size_s``) of an
        address that used at most SHORT_FIRST_USED_S lately before any other, the shorter first; then the address that
        used the device least; then the job that came first."""
        short = head.size_s is not None and self._level(head.address, now, lately=True) <= SHORT_FIRST_USED_S
        return (0 if short else 1, head.size_s if short else 0.0, self._level(head.address, now), head.arrival)

    def _keys(self, now: float, also: Owner | None = None) -> Callable[[_Step], tuple]:
        """The waiting steps' order (held: the lock), as a key, lowest first: a background step (a deferring thread's
        turn) after every other until it has waited DEFER_OVERDUE_S; then by its address's place (``_rank``), an
        address's jobs in the order they came; then the oldest step. ``also``: an owner ranked as if it had a step
        waiting (``_anticipate``)."""
        heads: dict[str, Owner] = {}
        for owner in [s.owner for s in self._waiting] + ([also] if also is not None else []):
            head = heads.get(owner.address)
            if head is None or owner.arrival < head.arrival:
                heads[owner.address] = owner
        ranks = {address: self._rank(head, now) for address, head in heads.items()}

        def key(step: _Step) -> tuple:
            later = step.background and now - step.queued < DEFER_OVERDUE_S
            return (int(later), *ranks[step.owner.address], step.owner.arrival, step.seq)

        return key

    def streaming(self, owner: Owner, delta: int) -> None:
        """A streaming job of ``owner`` began (+1) or ended (-1)."""
        with self._lock:
            left = self._streams.get(owner.key, 0) + delta
            if left > 0:
                self._streams[owner.key] = left
            else:
                self._streams.pop(owner.key, None)
            self._mark_busy()

    def _mark_busy(self) -> None:
        """``busy`` as the queue stands (held: the lock): while a step runs or waits, and while a job streams (between
        its steps too: its next comes within a moment, ``_anticipate``)."""
        self.busy = bool(self._waiting or self._running is not None or self._streams)

    def _anticipate(self) -> None:
        """Hold the turn up to ANTICIPATE_S for the next step of the owner whose step ran last, when it streams, has
        none waiting yet and would go before every step waiting (held: the lock)."""
        last = self._last
        if last is None or not self._streams.get(last.key) or any(s.owner.key == last.key for s in self._waiting):
            return
        key = self._keys(time.monotonic(), also=last)
        mine = key(_Step(None, last, -1))
        if all(mine < key(s) for s in self._waiting):
            self._arrived.wait_for(lambda: any(s.owner.key == last.key for s in self._waiting), timeout=ANTICIPATE_S)

    def _next(self) -> _Step:
        with self._lock:
            self._arrived.wait_for(lambda: self._waiting)
            self._anticipate()
            step = min(self._waiting, key=self._keys(time.monotonic()))
            self._waiting.remove(step)
            self._running = step
            for other in self._waiting:  # they wait behind this step
                if other.owner.key != step.owner.key:
                    other.owner.behind.add(_who(step.owner))
            return step

    def _turn(self) -> None:
        step = self._next()
        start = time.monotonic()
        step.owner.waited_s += start - step.queued
        if step.future.set_running_or_notify_cancel():
            try:
                step.future.set_result(step.call())
            except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
                step.future.set_exception(err)
        end = time.monotonic()
        with self._lock:
            self._running = None
            self._last = step.owner
            self._charge(step.owner, end - start, end)
            self._mark_busy()

    def used(self, owner: Owner) -> float:
        """The device seconds of ``owner``'s address, decayed to now."""
        with self._lock:
            return self._level(owner.address, time.monotonic())


_device = _Device()


# C functions that may block (a sleep, a lock's or a condition's wait): a deferring thread does not hold a turn across
# them, and does not ask for one to make them
_BLOCKING = frozenset({"sleep", "acquire", "wait", "select", "poll"})


class _Deferral:
    """A thread's profile function inside ``deferring``: at each Python call while the device thread has a step,
    the thread asks the device for a turn of its own (a step for its ``owner``, in the queue's order) and waits for it;
    in that turn the device thread waits while this thread runs DEFER_SLICE_S, then the turn ends, and the next is
    asked when needed. So this thread's Python never runs beside a step's passes (module docstring)."""

    __slots__ = ("owner", "previous", "slice_end", "held", "paused")

    def __init__(self, owner: Owner, previous):
        self.owner, self.previous = owner, previous
        self.slice_end = 0.0
        self.held: threading.Event | None = None  # set to end the turn held now
        self.paused = False

    def __call__(self, frame, event, arg):
        if _device.busy and not self.paused:
            blocking = event == "c_call" and getattr(arg, "__name__", "") in _BLOCKING
            if blocking or time.monotonic() >= self.slice_end:
                self.end_turn()  # its slice is over, or it is about to sleep or wait: the device does not wait for it
                if not blocking:
                    self._take_turn()
        if self.previous is not None:
            self.previous(frame, event, arg)

    def _take_turn(self) -> None:
        started, held = threading.Event(), threading.Event()

        def turn():  # on the device thread: this thread's slice (none when it has given up waiting)
            started.set()
            held.wait(DEFER_TURN_MAX_S)

        self.held = held
        _device.submit(turn, self.owner, background=True)
        if not started.wait(DEFER_WAIT_MAX_S):
            # The step under way may be waiting for something this thread holds (a lock, a module being imported):
            # this slice runs beside it instead, and its turn, when it comes, ends at once.
            self.end_turn()
        self.slice_end = time.monotonic() + DEFER_SLICE_S

    def end_turn(self) -> None:
        if self.held is not None:
            self.held.set()
            self.held = None


class deferring:
    """A context manager (and decorator): the Python work of the calling thread inside it runs only where the device
    thread has no step, or in turns of its own for ``owner`` (module docstring, "Python work beside the steps defers
    to them"). On the device thread itself it does nothing; nested, the outer one rules. A profiler already set on the
    thread keeps being called.

    The check at each Python call costs the deferring thread itself: view building (plotly figures, an export's page)
    takes about 2.6x as long inside it, the device idle (an export's page 0.17 s -> 0.45 s, 2-core CPU with AVX-512
    BF16). Deferring only when the device was busy at the block's start (full speed for a visitor alone) let a victim
    beside back-to-back exports reach 1.56x its time alone (1.18x deferring always): so it always defers."""

    def __init__(self, owner: Owner | None = None):
        self.owner = owner or SERVER

    def __enter__(self):
        self._previous = sys.getprofile()
        self._mine = None
        if not on_device_thread() and not isinstance(self._previous, _Deferral):
            self._mine = _Deferral(self.owner, self._previous)
            sys.setprofile(self._mine)
        return self

    def __exit__(self, *exc):
        if self._mine is not None:
            sys.setprofile(self._previous)
            self._mine.end_turn()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def deferred(*args, **kwargs):
            with deferring(self.owner):
                return fn(*args, **kwargs)

        return deferred


def on_device_thread() -> bool:
    """Whether the calling thread is the device thread."""
    return _device.ident is not None and threading.get_ident() == _device.ident


def run(fn: Callable[..., T], *args, owner: Owner | None = None, **kwargs) -> T:
    """``fn(*args, **kwargs)`` on the device thread in its turn (the module docstring's order) for ``owner``
    (default ``SERVER``); its result, or its error raised here. Called inside ``deferring``, the caller's turn (if it
    holds one) ends first, and none is asked until this returns."""
    if on_device_thread():
        return fn(*args, **kwargs)
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    deferral = sys.getprofile()
    if not isinstance(deferral, _Deferral):
        return _device.submit(call, owner or SERVER).result()
    deferral.paused = True
    deferral.end_turn()
    try:
        return _device.submit(call, owner or SERVER).result()
    finally:
        deferral.paused = False


_DONE = object()


def _next(iterator: Iterator):
    return next(iterator, _DONE)


def stepped(iterator: Iterator[T], owner: Owner | None = None) -> Iterator[T]:
    """``iterator``'s items, each computed on the device thread for ``owner`` (one ``next`` at a time, in its
    turn with the rest); closing the result closes ``iterator`` there too. While it streams, the device keeps the turn
    for its next step ANTICIPATE_S after each, when it would go next (``_Device._anticipate``)."""
    owner = owner or SERVER
    _device.streaming(owner, +1)
    try:
        while (item := run(_next, iterator, owner=owner)) is not _DONE:
            yield item
    finally:
        _device.streaming(owner, -1)
        close = getattr(iterator, "close", None)
        if close is not None:
            run(close, owner=owner)


def steps(fn: Callable) -> Callable:
    """``fn`` (a generator function or a plain one) with its work on the device thread: a generator's steps by
    ``stepped``, a plain function's call by ``run``. The wrapper takes one keyword more than ``fn``,
    ``device_owner`` (an ``Owner``; default ``SERVER``), and passes the rest to ``fn``."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def streamed(*args, device_owner: Owner | None = None, **kwargs):
            yield from stepped(fn(*args, **kwargs), owner=device_owner)

        return streamed

    @functools.wraps(fn)
    def called(*args, device_owner: Owner | None = None, **kwargs):
        return run(fn, *args, owner=device_owner, **kwargs)

    return called
