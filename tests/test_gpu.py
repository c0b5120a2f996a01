"""The ZeroGPU decorator: a no-op off ZeroGPU, spaces.GPU with a fitting duration on it."""

from __future__ import annotations

import importlib.machinery
import inspect
import sys
import types

import pytest
import torch

from specviz.engine import zerogpu
from specviz.serving import device_thread, gpu, gpu_duration as duration
from specviz.pair import EMBEDDED, PRESETS, default_device

QWEN_7B = "Qwen2.5-0.5B-Instruct -> Qwen2.5-7B-Instruct"


@pytest.fixture(autouse=True)
def no_space(monkeypatch):
    monkeypatch.delenv(gpu.ZEROGPU_ENV, raising=False)
    monkeypatch.delenv(gpu.MAX_DURATION_ENV, raising=False)


@pytest.fixture
def fake_spaces(monkeypatch):
    """A stand-in for the ``spaces`` package that records what GPU() was asked for."""
    module = types.ModuleType("spaces")
    module.__spec__ = importlib.machinery.ModuleSpec("spaces", None)
    module.requests = []

    def GPU(task=None, *, duration=None):
        def decorate(fn):
            module.requests.append(("decorated", fn, duration))

            def run(*args, **kwargs):
                seconds = duration(*args, **kwargs) if callable(duration) else duration
                module.requests.append(("called", args, seconds))
                return fn(*args, **kwargs)

            return run

        return decorate(task) if task is not None else decorate

    module.GPU = GPU
    monkeypatch.setitem(sys.modules, "spaces", module)
    return module


def handler(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed):
    return f"{pair_name}:{gamma}:{max_new_tokens}"


def streaming(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed):
    yield from range(3)


ARGS = (EMBEDDED, "def f():", 4, 0.7, 40, 0.95, 128, 0)


def test_off_zerogpu_the_decorator_runs_the_function_on_the_device_thread():
    assert not gpu.on_zerogpu()
    threads = []

    def where(pair_name, *rest):
        threads.append(device_thread.on_device_thread())
        return pair_name

    def steps(pair_name, *rest):
        for i in range(3):
            threads.append(device_thread.on_device_thread())
            yield i

    assert gpu.gpu_task(duration=60)(where)(*ARGS) == EMBEDDED
    assert list(gpu.gpu_task(duration=duration.generate_duration)(steps)(*ARGS)) == [0, 1, 2]
    assert inspect.isgeneratorfunction(gpu.gpu_task(streaming))
    assert threads == [True] * 4 and not device_thread.on_device_thread()


def test_the_flag_without_the_package_is_not_zerogpu(monkeypatch):
    monkeypatch.setenv(gpu.ZEROGPU_ENV, "true")
    monkeypatch.setattr(zerogpu.importlib.util, "find_spec", lambda name: None)
    assert not gpu.on_zerogpu()
    assert gpu.gpu_task(handler)(*ARGS) == handler(*ARGS)


def test_on_zerogpu_spaces_gpu_gets_a_duration_fitted_to_the_call(monkeypatch, fake_spaces):
    monkeypatch.setenv(gpu.ZEROGPU_ENV, "true")
    assert gpu.on_zerogpu()
    run = gpu.gpu_task(duration=duration.generate_duration)(handler)
    assert run is not handler
    assert run(*ARGS) == "embedded:4:128"
    (_, fn, _), (_, args, seconds) = fake_spaces.requests
    assert fn is handler and args == ARGS
    assert seconds == duration.generate_duration(*ARGS) and gpu.MIN_DURATION_S <= seconds <= gpu.max_duration()
    fake_spaces.requests.clear()
    run = gpu.gpu_task(duration=1000)(handler)  # a fixed duration is clamped too
    run(*ARGS)
    assert fake_spaces.requests[-1][2] == gpu.DEFAULT_MAX_DURATION_S
    stream = gpu.gpu_task(streaming)
    assert list(stream(*ARGS)) == [0, 1, 2]


def test_models_go_to_cuda_on_zerogpu_before_any_gpu_is_attached(monkeypatch, fake_spaces):
    assert default_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv(gpu.ZEROGPU_ENV, "1")
    assert default_device() == torch.device("cuda")


def test_duration_grows_with_the_work_and_stays_within_bounds(monkeypatch):
    small = duration.generate_duration(EMBEDDED, "x", 4, 0.7, 40, 0.95, 128, 0)
    assert gpu.MIN_DURATION_S <= small <= 30
    seconds = [duration.estimate_seconds(QWEN_7B, n, g) for g, n in [(1, 16), (4, 16), (4, 64), (16, 64), (16, 256)]]
    assert seconds == sorted(seconds) and len(set(seconds)) == len(seconds)
    bigger_pair = [
        duration.estimate_seconds(name, 128, 4) for name in (EMBEDDED, "gpt2 -> gpt2-large", "gpt2 -> gpt2-xl", QWEN_7B)
    ]
    assert bigger_pair == sorted(bigger_pair)
    # The worst case (every draft rejected) is covered: gamma drafter passes and one target pass per token, plus the
    # baseline.
    d, t = PRESETS[QWEN_7B].drafter_params, PRESETS[QWEN_7B].target_params
    worst = 64 * (4 * duration.forward_seconds(d) + duration.forward_seconds(t)) + 64 * duration.forward_seconds(t)
    assert duration.estimate_seconds(QWEN_7B, 64, 4) >= worst
    # Clamped: the longest request asks for the ceiling, which the operator can change.
    assert duration.generate_duration(QWEN_7B, "x", 16, 1.0, 0, 1.0, 256, 0) == gpu.DEFAULT_MAX_DURATION_S
    monkeypatch.setenv(gpu.MAX_DURATION_ENV, "300")
    assert gpu.DEFAULT_MAX_DURATION_S < duration.generate_duration(QWEN_7B, "x", 16, 1.0, 0, 1.0, 256, 0) <= 300
    monkeypatch.setenv(gpu.MAX_DURATION_ENV, "not a number")
    assert gpu.max_duration() == gpu.DEFAULT_MAX_DURATION_S


def test_sweep_and_odd_inputs():
    one = duration.sweep_duration(EMBEDDED, [4], 128)
    sweep = duration.sweep_duration(EMBEDDED, range(1, 9), 128)
    assert one == duration.generate_duration(*ARGS) and sweep > one
    # Inputs the handler will reject count as the largest request; unknown (custom) pairs as a large one.
    assert duration.generate_duration(EMBEDDED, "x", None, 0.7, 40, 0.95, "lots", 0) >= duration.generate_duration(
        EMBEDDED, "x", 16, 0.7, 40, 0.95, 256, 0
    )
    assert duration.pair_params("someone/drafter -> someone/target") == duration.UNKNOWN_PARAMS
    assert duration.generate_duration(
        "someone/drafter -> someone/target", "x", 4, 0.7, 40, 0.95, 128, 0
    ) >= duration.generate_duration(QWEN_7B, "x", 4, 0.7, 40, 0.95, 128, 0)
    # The endpoint's later inputs (chat, custom drafter and target) and anything after them are accepted.
    assert duration.generate_duration(*ARGS, True, "", "", "session", request=None) == duration.generate_duration(*ARGS)


def test_the_batch_tab_is_sized_from_its_own_arguments():
    """run_batch's inputs put the prompts and the batch size before gamma: each reaches its slot."""
    from specviz.demo import _batch_duration

    args = ("gpt2 -> gpt2-large", "def f():", 4, 4, 0.7, 40, 0.95)
    one = duration.generate_duration("gpt2 -> gpt2-large", "x", 4, 0.7, 40, 0.95, 64, 0)
    # Batch 4 measures sizes 1, 2 and 4, twice each: six speculative batches with their baselines.
    assert _batch_duration(*args, 64, 0, True, "", "", "model", "constant", 1.0) == 6 * one
    assert _batch_duration(*args, 16, 0) < _batch_duration(*args, 256, 0)  # max new tokens is read where it stands
    # a bad size: the largest
    assert _batch_duration("gpt2 -> gpt2-large", "def f():", "eight", 4, 0.7, 40, 0.95, 64, 0) == 8 * one


def test_a_custom_pair_is_sized_by_its_loaded_models(tmp_path):
    from specviz import pair as pairs
    from tests.test_pair import WORDS, save_tiny

    d = save_tiny(tmp_path / "d", WORDS, 32, seed=1)
    t = save_tiny(tmp_path / "t", WORDS, 32, seed=2)
    not_loaded = duration.generate_duration(
        EMBEDDED, "x", 4, 0.7, 40, 0.95, 128, 0, True, "someone/drafter", "someone/target"
    )
    assert not_loaded == gpu.clamp_duration(duration.estimate_seconds(None, 128, 4, params=duration.UNKNOWN_PARAMS))
    try:
        pair = pairs.load_pair(drafter=d, target=t, allow_custom=True)
        assert duration.pair_params(EMBEDDED, d, t) == pair.param_counts
        assert duration.generate_duration(EMBEDDED, "x", 4, 0.7, 40, 0.95, 128, 0, True, d, t) < not_loaded
        assert duration.sweep_duration(
            EMBEDDED, range(1, 9), 128, custom_drafter=d, custom_target=t
        ) < duration.sweep_duration("x -> y", range(1, 9), 128)
    finally:
        pairs.unload_all()


def test_gpu_and_the_pair_package_import_each_other_in_neither_direction():
    """Both ask specviz.engine.zerogpu for the platform's flag; neither imports the other, at module or function
    level."""
    import ast
    from pathlib import Path

    root = Path(gpu.__file__).parent

    def imported(path: Path) -> set[str]:
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names |= {f"{node.module}.{a.name}" for a in node.names}
        return names

    gpu_side = imported(root / "gpu.py") | imported(Path(zerogpu.__file__))
    assert not {n for n in gpu_side if n == "specviz.pair" or n.startswith("specviz.pair.")}
    pair_files = sorted((root.parent / "pair").glob("*.py"))
    assert len(pair_files) >= 5
    for f in pair_files:
        assert not {
            n
            for n in imported(f)
            if n in ("specviz.serving.gpu", "specviz.serving.gpu_duration") or n.startswith("specviz.serving.gpu.")
        }, f.name
