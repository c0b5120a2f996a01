"""The device shared between visitors: a job gives the device up after its share while another visitor
waits, and the queue serves the visitors who used it least first.

Fair order per address alone let one heavy run hold the device for 121 s (two runs of RUN_SECONDS_MAX)
and two attacker addresses make a victim wait 245 s. So:

- ``must_yield``: a device job (Generate, /run) that has run SHARE_S seconds while a job of another
  address waits for the device stops at its next round, so a visitor who joins waits at most about
  SHARE_S plus a round for each job ahead of it (alone on the device a job keeps its full time limit);
- ``charge`` / ``used``: the device seconds each address used over the last WINDOW_S seconds; the
  admission order (``specviz.ui.guard.admission``) puts the waiting jobs of the addresses that used least first,
  so a visitor who has used nothing goes ahead of every flooding address's waiting jobs.

The long jobs (Compare, Batch, the gamma sweep) run beside Generate, in a queue of their own, on the same
device: a heavy batch from one address slowed every other address's short run for its whole 180 s. So
they share the device too (``LongTurn``):

- a long job starts only once no Generate or /run job of another address runs or waits (those are short,
  and come first); while it waits for that turn it counts as waiting for the device, so a Generate or /run
  job beside it gives the device up after its share as it would for a waiting run;
- once started it keeps the device SHARE_S seconds while a job of another address runs or waits (a
  Generate or /run job, or another long job), then stops at its next round and says why; alone it keeps
  its own time limit. A short run that comes while a long job runs waits at most about SHARE_S and a round;
- its seconds are charged to its address like a run's.

Under a flood of /run posts from three fresh addresses, the least-used-first order put a visitor who had used a
few seconds behind each of them, each keeping the device its share: an 8-token Generate took 35.75 s against 1.12 s
alone. So a short run's wait is bounded by size, not by who used what:

- ``job_seconds``: a Generate or /run job's expected device time, read from its inputs before it starts (max new
  tokens, gamma, the token tree; ``specviz.ui.running.sizing.run_seconds``), the auto tree's calibration in it (its cap,
  as ZeroGPU is asked for: three addresses looping a 1-token auto job with a new temperature each time were sized by
  their one token, went ahead of an 8-token Generate and made it take 6.6x its time alone). The queue
  (``specviz.ui.guard.admission``) orders waiting jobs by ``place``: arrival time plus expected seconds, so a short job
  goes ahead of long ones that came at most about the long one's size earlier, and a long job is never starved: every
  job that arrives more than its own size after it goes behind it (aging, with a wait of one second worth one second of
  size);
- ``Held.over``: a running Generate or /run job also stops at its next round when a job of another address waits
  (or runs beside it) that is expected to take at most 1/YIELD_RATIO of its own time, so a short run waits about one
  round of a long one. A run no longer than SHORT_TOKENS tokens never gives way so (it ends soon anyway), and each
  address may make others' jobs give way at most YIELDS_PER_MINUTE times a minute (``SPECVIZ_YIELDS_PER_MINUTE``):
  past it, its short jobs still go first in the queue but wait for the running job (at most SHARE_S). Many short
  jobs from one address are bounded as before: one running and one waiting.

A job that gives way is stopped, not paused: the Gradio slot stays held until its handler returns, and on ZeroGPU
the run lives in a GPU worker sized for one uninterrupted call, so a paused run would keep the device it gave up.
It says why and keeps its rounds so far (Generate shows them).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from specviz.ui.guard.address import client_address
from specviz.ui.guard.checks import number
from specviz.ui.guard.limits import GAMMA_RANGE, MAX_NEW_TOKENS_RANGE, whole_number
from specviz.ui.running.sizing import pair_scale, run_seconds


SHARE_S = float(os.environ.get("SPECVIZ_SHARE_SECONDS", "10"))  # device seconds a job keeps while another visitor waits
WINDOW_S = 600.0  # device time is remembered this long
DEVICE = "device"  # the concurrency id of Generate and /run (specviz.ui.page.layout)
LONG = "long"  # the concurrency id of Compare, Batch and the sweep
TURN_POLL_S = 0.1  # how often a long job waiting for its turn looks again
YIELD_RATIO = 2.0  # a running job gives way to a waiting one expected to take at most 1/YIELD_RATIO of its time
# a run no longer than a chain of this many tokens never gives way to a shorter one: it ends soon anyway
SHORT_TOKENS = 8
# times one address may make others' jobs give way (0: never)
YIELDS_PER_MINUTE = whole_number("SPECVIZ_YIELDS_PER_MINUTE", 6, 0)
# The inputs of a device job that size it, by endpoint: (gamma, max new tokens, token tree) positions in its data.
SIZED_FIELDS = {"generate": (2, 6, 14), "run": (2, 6, 12)}
# ... and those that name its pair: (pair name, custom drafter, custom target) positions (/run takes presets only).
PAIR_FIELDS = {"generate": (0, 9, 10), "run": (0,)}
# a job whose size cannot be read counts as this
LARGEST_S = run_seconds(MAX_NEW_TOKENS_RANGE[1], GAMMA_RANGE[1], "chain")
SHORT_S = run_seconds(SHORT_TOKENS)

_lock = threading.Lock()
_log: deque[tuple[float, str, float]] = deque()  # (when, address, device seconds)
_used: dict[str, float] = {}
_turns: dict[str, int] = {}  # long jobs waiting for their turn on the device, per address
_yields: dict[str, deque[float]] = {}  # per address, when its waiting jobs made a running job give way (last minute)


def _expire(now: float) -> None:
    while _log and now - _log[0][0] > WINDOW_S:
        _, address, seconds = _log.popleft()
        _used[address] -= seconds
        if _used[address] <= 1e-9:
            del _used[address]


def charge(address: str, seconds: float) -> None:
    """Count ``seconds`` of device time against ``address``."""
    now = time.monotonic()
    with _lock:
        _expire(now)
        _log.append((now, address, seconds))
        _used[address] = _used.get(address, 0.0) + seconds


def used(address: str) -> float:
    """Device seconds ``address`` used over the last WINDOW_S seconds."""
    with _lock:
        _expire(time.monotonic())
        return _used.get(address, 0.0)


def sized(gamma, max_new_tokens, tree="chain", pair: tuple = ()) -> float | None:
    """A Generate or /run job's expected device seconds from its controls as sent (None when one is not a
    gamma, a token count or a token tree the page offers: such a job is refused at its start); ``pair``: its
    (pair name, custom drafter, custom target) as sent, which price its steps (``specviz.ui.running.sizing.pair_scale``;
    none: the English pair's price)."""
    from specviz.ui.tabs.tree import TREES

    if not (number(gamma) and number(max_new_tokens) and gamma == int(gamma) and max_new_tokens == int(max_new_tokens)):
        return None
    if not (
        GAMMA_RANGE[0] <= gamma <= GAMMA_RANGE[1]
        and MAX_NEW_TOKENS_RANGE[0] <= max_new_tokens <= MAX_NEW_TOKENS_RANGE[1]
    ):
        return None
    tree = "chain" if tree in (None, "") else tree
    if not isinstance(tree, str) or tree not in TREES:
        return None
    return run_seconds(int(max_new_tokens), int(gamma), tree, pair_scale(*pair))


def short_size(expected_s: float | None) -> float | None:
    """A job's ``expected_s`` (``sized``) when it is short, at most a job's share (SHARE_S): what its device steps are
    ordered by (``specviz.serving.device_thread.Owner.size_s``, before those of longer jobs); None for a longer job or
    one whose size is unknown."""
    return expected_s if expected_s is not None and expected_s <= SHARE_S else None


def job_size(req, owner) -> float | None:
    """A checked Generate or /run request's expected device seconds (``sized``), kept on its device ``owner`` when the
    job is short (``short_size``: its steps then go before longer jobs')."""
    expected = sized(req.gamma, req.max_new_tokens, req.tree, req.sized_pair)
    owner.size_s = short_size(expected)
    return expected


def job_seconds(event) -> float | None:
    """The expected device seconds of a queued Generate or /run job (a Gradio queue event), read from its inputs;
    None for another endpoint or inputs that do not say."""
    api = getattr(getattr(event, "fn", None), "api_name", None)
    fields = SIZED_FIELDS.get(api)
    data = getattr(getattr(event, "data", None), "data", None)
    if fields is None or not isinstance(data, list) or len(data) <= max(fields + PAIR_FIELDS[api]):
        return None
    return sized(*(data[i] for i in fields), pair=tuple(data[i] for i in PAIR_FIELDS[api]))


def place(event) -> float:
    """Where a waiting device job goes in the queue, lowest first: its arrival (``enqueue_time``, monotonic
    seconds) plus its expected device seconds (LARGEST_S when they cannot be read). Fixed once it has joined, so
    the order between two jobs never changes while they wait: a job is passed only by jobs that arrive less than
    its own size after it."""
    expected = job_seconds(event)
    return getattr(event, "enqueue_time", 0.0) + (LARGEST_S if expected is None else expected)


def _may_make_way(address: str, now: float) -> bool:
    log = _yields.get(address)
    while log and now - log[0] > 60.0:
        log.popleft()
    return len(log or ()) < YIELDS_PER_MINUTE


def shorter_other_job(request, mine_s: float | None) -> str | None:
    """The address of a job of another address than ``request``'s, waiting for the device or running beside this
    one (``specviz.ui.guard.admission.dispatching`` starts a short one there), expected to take at most ``mine_s`` /
    YIELD_RATIO seconds, whose address may still make a job give way this minute; None when there is none, outside a
    served app, or when ``mine_s`` is None or at most SHORT_S (an 8-token run is never stopped this way: many 1-token
    jobs cannot end every short run). A short run beside a long one shares the device's steps with it (0.36-1.30 s
    beside the auto tree's calibrations against 0.33 s alone): the long one gives way, as it would to the run
    waiting."""
    if mine_s is None or mine_s <= SHORT_S:
        return None
    inner = getattr(request, "request", request)
    queue = _queue_of(inner)
    events = queue.event_queue_per_concurrency_id.get(DEVICE) if queue is not None else None
    if events is None:
        return None
    mine, now = client_address(inner), time.monotonic()
    for event in list(events.queue) + running_jobs(queue, (DEVICE,)):
        address = client_address(event.request)
        expected = job_seconds(event)
        if address != mine and expected is not None and expected * YIELD_RATIO <= mine_s:
            with _lock:
                if _may_make_way(address, now):
                    return address
    return None


def made_way(address: str) -> None:
    """Count that a job of ``address`` made a running job give way."""
    with _lock:
        _yields.setdefault(address, deque()).append(time.monotonic())


def _queue_of(inner):
    get_blocks = getattr(getattr(inner, "app", None), "get_blocks", None)
    return getattr(get_blocks() if callable(get_blocks) else None, "_queue", None)


def others_waiting(request, waiting: tuple[str, ...] = (DEVICE,), running: tuple[str, ...] = ()) -> bool:
    """Whether a job of another address than ``request``'s waits in one of the ``waiting`` queues (or for its
    turn as a long job), or runs in one of the ``running`` ones (False outside a served app)."""
    inner = getattr(request, "request", request)
    queue = _queue_of(inner)
    if queue is None:
        return False
    mine = client_address(inner)
    with _lock:
        if any(address != mine for address in _turns):
            return True
    for concurrency_id in waiting:
        events = queue.event_queue_per_concurrency_id.get(concurrency_id)
        if events is not None and any(client_address(e.request) != mine for e in list(events.queue)):
            return True
    return any(client_address(e.request) != mine for e in running_jobs(queue, running))


def running_jobs(queue, kinds: tuple[str, ...]) -> list:
    """The jobs of the ``kinds`` (Gradio concurrency ids) that ``queue`` (Gradio's) runs now, their clients still
    there."""
    return [e for jobs in list(queue.active_jobs) if jobs for e in list(jobs) if e.concurrency_id in kinds and e.alive]


def must_yield(
    request,
    started: float,
    share_s: float | None = None,
    waiting: tuple[str, ...] = (DEVICE,),
    running: tuple[str, ...] = (),
) -> bool:
    """Whether a device job that started at ``started`` (time.monotonic) has had its share while others wait
    (``others_waiting`` with ``waiting`` and ``running``)."""
    share_s = SHARE_S if share_s is None else share_s
    return time.monotonic() - started > share_s and others_waiting(request, waiting, running)


def yielded_note(seconds: float) -> str:
    """What a job that gave the device up says."""
    return (
        f"Stopped after {seconds:.0f} s on the device so that another visitor waiting could run: while others wait, "
        "each "
        f"job keeps the device at most {SHARE_S:.0f} s. Ask for fewer tokens, or try again when the queue is empty."
    )


class Held:
    """One device job's hold, for the handlers that run jobs: ``over()`` once it has had its share while
    another address waits (in the ``waiting`` queues) or runs (in the ``running`` ones), or, for a job of
    ``expected_s`` seconds, as soon as a job of another address waits (or runs beside it) that is expected to take at
    most 1/YIELD_RATIO of that (``shorter_other_job``); ``note()`` what it then says, and on leaving the ``with``
    block its seconds are charged to its address.

    Usage: ``with Held(request, expected_s) as held: ... if held.over(): ...``.
    """

    def __init__(
        self,
        request,
        expected_s: float | None = None,
        waiting: tuple[str, ...] = (DEVICE,),
        running: tuple[str, ...] = (),
    ):
        self.request, self.started = request, time.monotonic()
        self.expected_s, self.waiting, self.running = expected_s, waiting, running
        self.for_shorter = False  # it gave way to a shorter job (not its share)

    def over(self) -> bool:
        if must_yield(self.request, self.started, waiting=self.waiting, running=self.running):
            return True
        address = shorter_other_job(self.request, self.expected_s)
        if address is None:
            return False
        made_way(address)
        self.for_shorter = True
        return True

    def note(self) -> str:
        seconds = time.monotonic() - self.started
        if self.for_shorter:
            return (
                f"Stopped after {seconds:.0f} s on the device so that a shorter job of another visitor, waiting, could "
                "run: a run gives "
                f"the device up at its next round to a job expected to take at most 1/{YIELD_RATIO:.0f} of its time. "
                "Ask for fewer tokens, or try again in a moment."
            )
        return yielded_note(seconds)

    def __enter__(self) -> "Held":
        return self

    def __exit__(self, *exc) -> None:
        charge(client_address(self.request), time.monotonic() - self.started)


class LongTurn:
    """A long job's turn on the device (see the module docstring): entering waits, asking ``stop`` every
    TURN_POLL_S seconds, until no Generate or /run job of another address runs or waits; then the job holds
    the device (``held``: over once it has had SHARE_S seconds while any job of another address runs or waits)
    and its seconds are charged on leaving. ``started`` says whether the turn came (False: ``stop`` ended the wait)."""

    def __init__(self, request, stop):
        self.request, self.stop = getattr(request, "request", request), stop
        self.held: Held | None = None
        self.started = False

    def __enter__(self) -> "LongTurn":
        address = client_address(self.request)
        with _lock:
            _turns[address] = _turns.get(address, 0) + 1
        try:
            while others_waiting(self.request, (DEVICE,), (DEVICE,)):
                if self.stop():
                    return self
                time.sleep(TURN_POLL_S)
        finally:
            with _lock:
                _turns[address] -= 1
                if not _turns[address]:
                    del _turns[address]
        self.held = Held(self.request, waiting=(DEVICE, LONG), running=(DEVICE,))
        self.started = True
        return self

    def over(self) -> bool:
        return self.held is not None and self.held.over()

    def __exit__(self, *exc) -> None:
        if self.held is not None:
            self.held.__exit__(*exc)
