"""Tiny causal LMs built from a config, and the embedded pair, for the tests."""

from __future__ import annotations

import os
import socket

import pytest
import torch
from transformers import GPT2LMHeadModel

torch.set_num_threads(1)  # tiny models: threads only add overhead
# The tests build and launch the page often (and app.py in subprocesses, which inherit this): none pays for warming
# the default pair up before it serves (specviz.ui.running.pairs.warm_up) unless it sets SPECVIZ_WARM_UP=1 itself.
os.environ.setdefault("SPECVIZ_WARM_UP", "0")


# The tiny models are the exactness lab's: one implementation for the page and the tests.
from specviz.lab.models import MaskedLM, masked_lm, noisy_copy, tiny_lm  # noqa: E402,F401


# Files of independent statistical tests (each builds its own tiny models, or cheap module fixtures): spread over
# the workers one test at a time. Every other file's tests run together on one worker, in order.
SPREAD = {
    "test_exactness",
    "test_exactness_reference",
    "test_drafters",
    "test_eagle",
    "test_argmax_drafts",
    "test_cross_tokenizer",
    "test_kernels",
    "test_precision",
    "test_tree_exactness",
    "test_batch",
    "test_repetition",
}


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's file-by-file scheduling, but each test of a file in SPREAD is a unit of its own."""
    from pathlib import PurePath

    from xdist.scheduler import LoadFileScheduling

    class FilesAndSpreadTests(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return nodeid if PurePath(file).stem in SPREAD else file

    return FilesAndSpreadTests(config, log)


@pytest.fixture(scope="session")
def embedded():
    """The embedded pair from assets/, loaded once on the CPU."""
    from specviz.pair import load_pair

    return load_pair("embedded", device="cpu")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app():
    """The page served on a free port of 127.0.0.1, once per test module: (demo, base URL)."""
    from specviz.ui import build_demo, launch_kwargs

    demo = build_demo()
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, **launch_kwargs(free_port()))
    try:
        yield demo, url.rstrip("/")
    finally:
        demo.close()


def download_index() -> int:
    """Where the run's JSON download sits among the Generate endpoint's API outputs (the page's
    state holding the recording is not one of them)."""
    from specviz.ui.page.outputs import RUN_OUTPUTS

    return [name for name in RUN_OUTPUTS if name != "recording"].index("download")


class ConstantLM(GPT2LMHeadModel):
    """A GPT-2 whose logits are the same vector at every position, whatever the context.

    Its cache and positions work as a real model's; only the output is fixed, so a drafter and
    a target of this kind give the same beta = sum_x min(p(x), q(x)) at every position and
    every draft is accepted independently with that probability.
    """

    fixed: torch.Tensor = torch.zeros(1)

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = self.fixed.to(out.logits.dtype).expand_as(out.logits).clone()
        return out


def constant_lm(logits: list[float], seed: int = 0):
    """A ConstantLM over a vocabulary of len(logits) tokens emitting ``logits`` at every position."""
    base = tiny_lm(vocab=len(logits), seed=seed, n_positions=1024)
    model = ConstantLM(base.config).eval()
    model.load_state_dict(base.state_dict())
    model.fixed = torch.tensor(logits, dtype=torch.float32)
    return model


# fp32 logits of one position differ in the last bits with the pass's shape (one token, a
# verify pass over several, a whole re-fed sequence), by CPU and thread count: a few 1e-6
# relative. Two candidates closer than this are a near-tie, where greedy may pick either.
NEAR_TIE = 1e-4


def assert_same_greedy(target, prompt: list[int], got: list[int], want: list[int], vocab: int | None = None) -> None:
    """``got`` equals the greedy decoding ``want``, or the first divergence is an fp32 near-tie.

    At the first position where they differ, the target's own cache-free logits (cut to
    ``vocab`` columns) must rank the two chosen tokens first and second, less than NEAR_TIE
    apart (relative to the larger logit, at least 1): a tie broken differently by another pass
    shape, not a bug. Anything else fails, with the logits in the message.
    """
    if got == want:
        return
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert i < min(len(got), len(want)), f"one output is a prefix of the other: {got} vs {want}"
    with torch.inference_mode():
        logits = target(torch.tensor([list(prompt) + list(want[:i])])).logits[0, -1].float()
    if vocab is not None:
        logits = logits[:vocab]
    top = logits.topk(2)
    gap = float(top.values[0] - top.values[1])
    scale = max(1.0, abs(float(top.values[0])))
    assert {got[i], want[i]} == set(top.indices.tolist()) and gap < NEAR_TIE * scale, (
        f"greedy outputs diverge at token {i}: {got[i]} vs {want[i]}, top-2 {top.indices.tolist()} "
        f"with logits {top.values.tolist()} (gap {gap:.3g}): not a near-tie"
    )
    print(f"greedy outputs diverge at token {i} on an fp32 near-tie (logit gap {gap:.2g}); equal before it")


@pytest.fixture(autouse=True)
def fresh_request_budgets():
    """Each test starts with the per-address, per-minute request budgets unspent: every test's client is
    127.0.0.1, and one worker's tests together send more jobs a minute than one visitor may."""
    import sys

    server = sys.modules.get("specviz.ui.guard.server")
    if server is not None:
        for name in ("JOINS", "HEARTBEATS"):
            old = getattr(server, name)
            setattr(server, name, server.LogBudget(per_client=old.per_client, total=old.total, window_s=old.window_s))
    yield


@pytest.fixture(autouse=True)
def nothing_stays_frozen():
    """A server freezes the objects it keeps for good out of the collector (``specviz.pair.settle``); a test's servers
    and pairs do not live on, so what a test froze goes back under the collector when it ends."""
    import gc

    yield
    gc.unfreeze()
