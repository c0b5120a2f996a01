"""Stop, a client that hung up and the time caps end a batch, a comparison and a sweep within the round
under way, and the page then says how far each got and what stopped it (issues 38 and 39).

A slow stub pair stands in for the models: tiny GPT-2s from a config whose every forward pass is
counted (and, for the caps, advances a fake clock by one second), so a test says how many passes ran
after the stop without timing anything.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2LMHeadModel

from specviz import Sampling
from specviz.drafters import make_drafter
from specviz.engine.batch import autoregressive_generate_batch, speculative_generate_batch
from specviz.engine.stopping import STOPPED
from tests.conftest import tiny_lm

SESSION = "halting-test-session"
ROWS, TOKENS, GAMMA = 8, 256, 4


class Passes:
    """Forward passes of both stub models, and a hook run before each (a Stop press, a clock tick)."""

    def __init__(self):
        self.n = 0
        self.hook = lambda n: None


class SlowLM(GPT2LMHeadModel):
    """A tiny GPT-2 that counts its forward passes in ``passes`` and calls its hook first."""

    passes: Passes

    def forward(self, *args, **kwargs):
        self.passes.n += 1
        self.passes.hook(self.passes.n)
        return super().forward(*args, **kwargs)


def slow_lm(passes: Passes, seed: int):
    base = tiny_lm(vocab=32, seed=seed, n_positions=1024, eos=31)
    model = SlowLM(base.config).eval()
    model.load_state_dict(base.state_dict())
    model.passes = passes
    return model


@pytest.fixture
def stub(monkeypatch):
    """A stub pair behind the page's device halves: (passes, pair). It has no eos token, so every
    row runs to its token budget unless it is stopped."""
    import specviz.ui.tabs.batch as batch_page
    import specviz.ui.tabs.compare as compare_page
    import specviz.ui.running.device as device
    import specviz.ui.tabs.sweep as sweep_page

    passes = Passes()
    pair = SimpleNamespace(
        name="stub",
        drafter=slow_lm(passes, 1),
        target=slow_lm(passes, 2),
        tokenizer=None,
        eos_token_ids=[],
        target_source=None,
        device=torch.device("cpu"),
        form=None,
        own_tokenizer=False,
        drafter_tokenizer=None,
    )
    monkeypatch.setattr(device, "_pair_of", lambda req: pair)
    monkeypatch.setattr(device, "encode", lambda pair, prompt, chat: [1 + len(prompt) % 7, 2, 3])
    monkeypatch.setattr(device, "usable_kinds", lambda target, cross_tokenizer=False: ("model", "ngram"))
    for page in (batch_page, compare_page, sweep_page):
        monkeypatch.setattr(page, "ensure_pair", lambda *a, **k: None)
        monkeypatch.setattr(page, "free_memory", lambda *a, **k: None, raising=False)
    return passes, pair


def press_stop_at(passes: Passes, at: int) -> dict:
    """Press Stop in SESSION once the ``at``-th forward pass starts; returns where the passes stood then."""
    import specviz.ui.page.state as state

    seen = {}

    def hook(n):
        if n == at:
            state.stop_asked.add(SESSION)
            seen["at"] = n

    passes.hook = hook
    return seen


def fake_clock(monkeypatch, passes: Passes) -> None:
    """Every forward pass takes one second of the jobs' clock."""
    import specviz.ui.running.halting as halting

    monkeypatch.setattr(halting, "_now", lambda: float(passes.n))


REQUEST = SimpleNamespace(session_hash=SESSION)
BATCH_ARGS = ("embedded", "one\ntwo\nthree", ROWS, GAMMA, 1.0, 0, 1.0, TOKENS, 0)


# --- the engine ----------------------------------------------------------------------------------


def test_a_batch_asks_its_stop_check_before_every_round_and_keeps_the_rounds_done():
    """8 rows x 256 tokens: a stop check that answers True at its 4th asking ends the batch after 3
    rounds, every row marked stopped with its tokens so far. Control: without the check it runs to its budget."""
    target, drafter = (
        tiny_lm(vocab=32, seed=2, n_positions=1024, eos=31),
        tiny_lm(vocab=32, seed=1, n_positions=1024, eos=31),
    )
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [1], [2], [3], [4]]
    asked = []

    def stop():
        asked.append(1)
        return len(asked) >= 4

    kw = dict(sampling=Sampling(1.0), max_new_tokens=TOKENS, eos_token_id=[], seed=0)
    res = speculative_generate_batch(
        prompts, make_drafter("model", drafter_model=drafter), target, gamma=GAMMA, stop=stop, **kw
    )
    assert res.stopped and len(res.rounds) == 3 and len(asked) == 4
    assert all(
        t.stop_reason == STOPPED and len(t.rounds) == 3 and 3 <= len(t.output_ids) <= 3 * (GAMMA + 1)
        for t in res.traces
    )
    asked.clear()
    base = autoregressive_generate_batch(prompts, target, stop=stop, **kw)
    assert (
        base.stopped
        and len(base.rounds) == 3
        and all(len(t.output_ids) == 3 and t.stop_reason == STOPPED for t in base.traces)
    )
    full = autoregressive_generate_batch(prompts[:2], target, stop=lambda: False, **{**kw, "max_new_tokens": 16})
    assert not full.stopped and all(t.stop_reason == "max_new_tokens" and len(t.output_ids) == 16 for t in full.traces)


# --- the Batch tab -------------------------------------------------------------------------------


def test_stop_ends_a_batch_of_8_rows_by_256_tokens_within_one_round(stub):
    """Stop pressed during the first batch's 10th forward pass: at most the rest of that round runs
    (gamma drafter passes and one target pass), the status says it was stopped by you and how many
    batches were measured, and every row of the lanes says how far it got. Before the fix the
    check ran only after a whole batch (about 2 x 256 passes more)."""
    import specviz.ui.tabs.batch as page
    import specviz.ui.page.state as state

    passes, _ = stub
    press_stop_at(passes, 10)
    try:
        outputs = list(page.run_batch(*BATCH_ARGS, request=REQUEST))
    finally:
        state.stop_asked.discard(SESSION)
    assert passes.n - 10 <= GAMMA + 1, passes.n
    last = outputs[-1]
    assert last["batch_status"].startswith("Stopped by you after measuring 0 of 8 batches.")
    assert "each row shows the tokens it had by then" in last["batch_status"]
    assert last["batch_view"].count("stopped by you") == ROWS


def test_a_batch_at_its_time_limit_ends_within_a_round_and_says_so(stub, monkeypatch):
    """The cap (a fake clock: one second per forward pass) ends the batch within the round that
    crossed it; the status names the limit (issue 38: "Measured 1 of 6 batches" stayed forever)."""
    import specviz.ui.tabs.batch as page

    passes, _ = stub
    fake_clock(monkeypatch, passes)
    monkeypatch.setattr(page, "BATCH_SECONDS_MAX", 40.0)
    outputs = list(page.run_batch(*BATCH_ARGS, request=REQUEST))
    assert 40 <= passes.n <= 40 + GAMMA + 1, passes.n
    status = outputs[-1]["batch_status"]
    assert status.startswith("Stopped at its time limit of 40 s after measuring 0 of 8 batches."), status
    assert outputs[-1]["batch_view"].count("stopped at its time limit of 40 s") == ROWS


def test_a_batch_whose_client_hung_up_stops_within_a_round_and_sends_nothing_more(stub, monkeypatch):
    import specviz.ui.tabs.batch as page
    import specviz.ui.page.state as state

    passes, _ = stub
    monkeypatch.setattr(state, "client_gone", lambda request: passes.n >= 10)
    outputs = list(page.run_batch(*BATCH_ARGS, request=REQUEST))
    assert passes.n - 10 <= GAMMA + 1, passes.n
    assert outputs == [dict(batch_status=outputs[0]["batch_status"])]  # only the first "what runs" line


# --- the device shared with other visitors (issue 39) --------------------------------------------


def _served(me: str = "10.0.0.1"):
    """A request served from ``me`` and the queue it sees: (request, device queue, long queue, running jobs)."""
    device, long, running = SimpleNamespace(queue=[]), SimpleNamespace(queue=[]), []
    queue = SimpleNamespace(event_queue_per_concurrency_id={"device": device, "long": long}, active_jobs=[running])
    app = SimpleNamespace(get_blocks=lambda: SimpleNamespace(_queue=queue))
    inner = SimpleNamespace(app=app, client=SimpleNamespace(host=me), headers={})
    return SimpleNamespace(session_hash=SESSION, request=inner), device, long, running


def _job(address: str, concurrency_id: str = "device"):
    return SimpleNamespace(
        request=SimpleNamespace(client=SimpleNamespace(host=address), headers={}),
        concurrency_id=concurrency_id,
        alive=True,
        session_hash=address,
        _id=address,
    )


def test_a_batch_gives_the_device_up_within_a_round_once_another_visitor_waits(stub, monkeypatch):
    """Issue 39: the device share served Generate and /run only; a heavy batch (or comparison, or sweep) from
    one address held the device beside every other visitor's runs for its whole time limit. Now once it has had
    its share (SHARE_S, 0 here: the rule is the same) and another address's run waits, it ends within the round
    under way and says why; its device time is charged to its address."""
    import specviz.ui.tabs.batch as page
    from specviz.ui.running import share

    passes, _ = stub
    monkeypatch.setattr(share, "SHARE_S", 0.0)
    request, device, _, _ = _served()
    passes.hook = lambda n: device.queue.append(_job("10.0.0.2")) if n == 12 else None
    before = share.used("10.0.0.1")
    outputs = list(page.run_batch(*BATCH_ARGS, request=request))
    assert passes.n - 12 <= GAMMA + 1, passes.n
    status = outputs[-1]["batch_status"]
    assert status.startswith("Stopped to give the device to another visitor's job"), status
    assert share.used("10.0.0.1") > before


def test_compare_and_the_sweep_give_the_device_up_too(stub, monkeypatch):
    import specviz.ui.tabs.compare as compare_page
    import specviz.ui.tabs.sweep as sweep_page
    from specviz.ui.running import share

    passes, _ = stub
    monkeypatch.setattr(share, "SHARE_S", 0.0)
    request, _, long, running = _served()
    passes.hook = lambda n: running.append(_job("10.0.0.3")) if n == 12 else None  # a run of another address, beside it
    outputs = list(compare_page.run_compare("embedded", "one", GAMMA, 1.0, 0, 1.0, TOKENS, 0, request=request))
    assert passes.n - 12 <= GAMMA + 1, passes.n
    assert "to give the device to another visitor" in outputs[-1]["compare_view"]
    running.clear()
    start = passes.n
    # another's long job waits
    passes.hook = lambda n: long.queue.append(_job("10.0.0.4", "long")) if n == start + 12 else None
    outputs = list(sweep_page.run_sweep("embedded", "one", 1.0, 0, 1.0, 64, 0, None, request=request))
    assert passes.n - start - 12 <= 8 + 1, passes.n
    assert "stopped to give the device to another visitor" in outputs[-1]["sweep_status"], outputs[-1]["sweep_status"]


def test_a_batch_waits_for_its_turn_while_another_visitors_run_is_on_the_device(stub, monkeypatch):
    """A long job does not start beside another address's Generate or /run job: it waits (no forward pass),
    counted as waiting for the device, so the run beside it would give the device up after its share; it starts
    once that run is gone. Stop ends the wait."""
    import threading

    import specviz.ui.tabs.batch as page
    from specviz.ui.running import share

    passes, _ = stub
    monkeypatch.setattr(share, "SHARE_S", 0.0)
    monkeypatch.setattr(share, "TURN_POLL_S", 0.01)
    request, _, _, running = _served()
    victim, _, _, _ = _served("10.0.0.5")
    victim.request.app = request.request.app  # the same queue, seen from the run's address
    running.append(_job("10.0.0.5"))
    outputs = []
    short = ("embedded", "one", 2, GAMMA, 1.0, 0, 1.0, 8, 0)
    worker = threading.Thread(target=lambda: outputs.extend(page.run_batch(*short, request=request)))
    worker.start()
    waited = False
    for _ in range(50000):
        if share._turns.get("10.0.0.1"):
            waited = share.Held(victim).over()  # the run beside it sees a visitor waiting for the device
            break
        worker.join(0.001)
    assert waited and passes.n == 0
    running.clear()
    worker.join(120)
    assert not worker.is_alive() and passes.n > 0
    assert outputs[-1]["batch_status"].startswith("Done"), outputs[-1]["batch_status"]
    import specviz.ui.page.state as state

    running.append(_job("10.0.0.5"))
    done = passes.n
    state.stop_asked.add(SESSION)  # Stop pressed while it waits for its turn
    try:
        outputs = list(page.run_batch(*short, request=request))
    finally:
        state.stop_asked.discard(SESSION)
    assert passes.n == done and outputs[-1]["batch_status"].startswith("Stopped by you"), outputs[-1]["batch_status"]


# --- Compare drafters ----------------------------------------------------------------------------


def test_compare_at_its_time_limit_says_in_every_column_how_far_it_got(stub, monkeypatch):
    """Issue 38: at its cap, Compare left "running…" in the columns it had not reached. Now the kind
    it stopped says how far its run got and why, the kinds after it that they were not run, and it
    ends within the round that crossed the cap."""
    import specviz.ui.tabs.compare as page

    passes, _ = stub
    fake_clock(monkeypatch, passes)
    monkeypatch.setattr(page, "COMPARE_SECONDS_MAX", 30.0)
    outputs = list(page.run_compare("embedded", "one", GAMMA, 1.0, 0, 1.0, TOKENS, 0, request=REQUEST))
    assert 30 <= passes.n <= 30 + GAMMA + 1, passes.n
    view = outputs[-1]["compare_view"]
    assert "running…" not in view
    assert "Stopped at its time limit of 30 s after" in view and f"of {TOKENS} tokens in" in view
    assert "prompt lookup: not run: the comparison was stopped at its time limit of 30 s" in view


def test_stop_ends_compare_within_a_round(stub):
    import specviz.ui.tabs.compare as page
    import specviz.ui.page.state as state

    passes, _ = stub
    press_stop_at(passes, 12)
    try:
        outputs = list(page.run_compare("embedded", "one", GAMMA, 1.0, 0, 1.0, TOKENS, 0, request=REQUEST))
    finally:
        state.stop_asked.discard(SESSION)
    assert passes.n - 12 <= GAMMA + 1, passes.n
    assert "Stopped by you after" in outputs[-1]["compare_view"] and "running…" not in outputs[-1]["compare_view"]


# --- the gamma sweep -----------------------------------------------------------------------------


def test_a_sweep_at_its_time_limit_ends_within_a_round(stub, monkeypatch):
    """The sweep's cap is asked every round (before: after each whole gamma), the gamma under way is
    left out and the status names the limit."""
    import specviz.ui.tabs.sweep as page

    passes, _ = stub
    fake_clock(monkeypatch, passes)
    monkeypatch.setattr(page, "SWEEP_SECONDS_MAX", 300.0)
    outputs = list(page.run_sweep("embedded", "one", 1.0, 0, 1.0, 64, 0, None, request=REQUEST))
    assert 300 <= passes.n <= 300 + 8 + 1, passes.n
    status = outputs[-1]["sweep_status"]
    assert "stopped at its time limit of 300 s after gamma" in status and "were not measured" in status, status


# --- the exactness lab and the stream check ------------------------------------------------------


def test_the_lab_stops_between_chunks_once_nobody_listens(monkeypatch):
    """Issue 39: a /call/lab never read ran its full 120 s; the lab never asked whether its client
    listened. Now it ends at the chunk after the client is gone. Control: a listened-to lab runs on."""
    import specviz.ui.tabs.lab as page
    import specviz.ui.page.state as state

    chunks = []
    real = page.lab_stream

    def counted(*args, **kwargs):
        for result in real(*args, **kwargs):
            chunks.append(result.runs)
            yield result

    monkeypatch.setattr(page, "lab_stream", counted)
    monkeypatch.setattr(state, "client_gone", lambda request: len(chunks) >= 2)
    list(page.run_lab("identical", "none", 1.0, 0, 1.0, 2, 1000, request=REQUEST))
    assert len(chunks) == 2  # 1000 samples are 20 chunks of 50
    chunks.clear()
    monkeypatch.setattr(state, "client_gone", lambda request: False)
    list(page.run_lab("identical", "none", 1.0, 0, 1.0, 2, 200, request=REQUEST))
    assert chunks[-1] == 200


def _counted_lab_runs(monkeypatch, at: int, press) -> list[int]:
    """Count the lab's speculative runs (one per sample); ``press()`` is called as run ``at`` starts."""
    import specviz.lab.experiment as experiment

    runs = []
    real = experiment.speculative_stream

    def counted(*args, **kwargs):
        runs.append(len(runs) + 1)
        if len(runs) == at:
            press()
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "speculative_stream", counted)
    return runs


def test_stop_ends_the_lab_between_its_runs_and_it_says_so(monkeypatch):
    """Issue 39: the lab never heard the Stop button (it ran on to its 5,000 samples or 120 s); nor was it
    found by it. Now the Stop button finds it running in its session and it ends before its next sample's run,
    mid-chunk, saying how many samples it has."""
    import specviz.ui.tabs.lab as page
    import specviz.ui.page.state as state

    found = []

    def press():
        found.append(SESSION in state.running)  # what the Stop button's handler looks for
        state.stop_asked.add(SESSION)

    runs = _counted_lab_runs(monkeypatch, 70, press)
    monkeypatch.setattr(state, "client_gone", lambda request: False)
    try:
        outputs = list(page.run_lab("identical", "none", 1.0, 0, 1.0, 2, 1000, request=REQUEST))
    finally:
        state.stop_asked.discard(SESSION)
    assert found == [True]
    assert len(runs) == 70  # the run under way when Stop came finished; none after it
    assert "Stopped by you after 70 samples" in outputs[-1][1], outputs[-1][1]
    assert SESSION not in state.running


def test_the_lab_hears_its_listener_go_between_runs(monkeypatch):
    """A client that hangs up mid-chunk: the lab ends before its next run (before: at the chunk's end) and sends
    nothing more."""
    import specviz.ui.tabs.lab as page
    import specviz.ui.page.state as state

    gone = []
    runs = _counted_lab_runs(monkeypatch, 70, lambda: gone.append(True))
    monkeypatch.setattr(state, "client_gone", lambda request: bool(gone))
    outputs = list(page.run_lab("identical", "none", 1.0, 0, 1.0, 2, 1000, request=REQUEST))
    assert len(runs) == 70
    assert all("Stopped" not in str(o) for o in outputs)


# --- the long jobs' size on a CPU ----------------------------------------------------------------


def test_on_a_cpu_the_long_jobs_defaults_are_estimated_to_finish_within_their_caps():
    """Issue 38: at the page's defaults (128 tokens, gamma 4, batch size 4, the English pair's four or
    five drafter kinds) Compare, Batch and the sweep ran into their caps on a 2-core CPU. Their tokens
    per run on a CPU are sized from the per-step estimate (specviz.ui.running.sizing) to fill at most FILL of
    each cap; a GPU takes the tokens asked."""
    from specviz.ui.running import sizing
    from specviz.ui.guard.limits import BATCH_SECONDS_MAX, COMPARE_SECONDS_MAX, SWEEP_GAMMAS, SWEEP_SECONDS_MAX
    from specviz.ui.page.defaults import DEFAULTS

    asked = DEFAULTS["max_new_tokens"]
    jobs = [(sizing.compare_steps(k), COMPARE_SECONDS_MAX) for k in (4, 5)] + [
        (sizing.batch_steps(b), BATCH_SECONDS_MAX) for b in (1, 4, 8)
    ]
    jobs.append((sizing.sweep_steps(len(SWEEP_GAMMAS)), SWEEP_SECONDS_MAX))
    for steps, cap in jobs:
        tokens = sizing.cpu_tokens(steps, cap, asked)
        assert sizing.MIN_TOKENS <= tokens <= asked
        assert steps * tokens * sizing.CPU_STEP_S <= sizing.FILL * cap or tokens == sizing.MIN_TOKENS
    assert [sizing.cpu_tokens(sizing.batch_steps(b), BATCH_SECONDS_MAX, asked) for b in (1, 2, 4, 8)] == [
        125,
        50,
        25,
        13,
    ]
    gpu = SimpleNamespace(device=torch.device("meta"))
    req = SimpleNamespace(max_new_tokens=asked)
    assert sizing.sized(req, gpu, 100.0, 10.0) == (req, "")


def test_a_batch_on_a_cpu_decodes_the_tokens_that_fit_and_says_so(stub, monkeypatch):
    import specviz.ui.tabs.batch as page
    from specviz.ui.running import sizing
    from specviz.ui.guard.limits import BATCH_SECONDS_MAX

    passes, pair = stub
    monkeypatch.setattr(page, "ensure_pair", lambda *a, **k: pair)  # the stub pair is on the CPU
    outputs = list(page.run_batch(*BATCH_ARGS, request=REQUEST))
    tokens = sizing.cpu_tokens(sizing.batch_steps(ROWS), BATCH_SECONDS_MAX, TOKENS)
    assert tokens == 13
    assert f"On this CPU each run decodes {tokens} tokens (not {TOKENS})" in outputs[0]["batch_status"]
    assert (
        outputs[-1]["batch_status"].startswith("Done:") and outputs[-1]["batch_view"].count(f"{tokens} tokens,") == ROWS
    )
