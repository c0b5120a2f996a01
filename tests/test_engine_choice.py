"""The loops' default engine ("auto", ``specviz.engine.runner.choose_cache``): CUDA graphs over the static cache
on a GPU, the dynamic cache elsewhere, and what happens when graphs are held, refused or fail.

Without a GPU the graphed path runs with a stand-in: ``graphs.supported`` answers True for the tiny CPU models
and a "capture" records each bucket's eager pass over the captured buffers (``tests/test_graphs.py::_EagerGraph``),
so everything but the graph itself runs: the buffers, the padding rows, the write index, holding and releasing.
Token ids are compared exactly: the tiny models' greedy choices are not near ties (static and dynamic passes
differ in the last bits of fp32 at most).
"""

from __future__ import annotations

import pytest
import torch

from specviz import Sampling, autoregressive_generate, autoregressive_stream, speculative_generate, speculative_stream
from specviz.engine import graphs
from specviz.engine.runner import choose_cache, make_runner
from specviz.lab import PROMPT, models
from tests.test_graphs import _EagerGraph


def _stand_in_capture(self):
    if self.capture_ms is not None:
        return self.capture_ms
    kv = self._kv(torch.empty(0))
    with torch.inference_mode():
        for b in self.buckets:
            zeros = torch.zeros(b, dtype=torch.long)
            buf = {
                "ids": torch.zeros(1, b, dtype=torch.long),
                "positions": zeros.clone(),
                "mask": kv.causal_mask(zeros),
            }
            kv.set_length(0)
            buf["logits"] = self._model_pass(buf).clone()
            self.graphs[b] = (_EagerGraph(self, buf), buf)
        kv.set_length(0)
    self.capture_ms = 1234.0
    return self.capture_ms


@pytest.fixture
def gpu_like(monkeypatch):
    """The CPU's models treated as a GPU's: graphs 'captured' by the stand-in; a fresh registry of runners."""
    monkeypatch.setattr(graphs, "supported", lambda model: True)
    monkeypatch.setattr(graphs.GraphedRunner, "capture", _stand_in_capture)
    monkeypatch.setattr(graphs, "_RUNNERS", {})
    monkeypatch.setattr(graphs, "_SPARES", {})
    monkeypatch.setattr(graphs, "_FAILED", {})
    monkeypatch.setattr(graphs, "HELD_PER_MODEL", 2)  # the page keeps more; two make the cases below short


def test_auto_is_the_dynamic_cache_on_a_cpu_and_says_nothing():
    drafter, target = models("similar")
    assert choose_cache(target) == ("dynamic", "")
    trace = speculative_generate(PROMPT, drafter, target, gamma=3, max_new_tokens=8)
    assert trace.settings["engine"] == "dynamic" and "engine_note" not in trace.settings
    assert autoregressive_generate(PROMPT, target, max_new_tokens=4).settings["engine"] == "dynamic"
    assert (
        speculative_generate(PROMPT, drafter, target, max_new_tokens=4, cached="re-fed").settings["engine"] == "re-fed"
    )


def test_on_a_gpu_auto_replays_graphs_says_once_that_it_captured_them_and_gives_the_targets_greedy_output(gpu_like):
    drafter, target = models("unlike")
    first = speculative_generate(PROMPT, drafter, target, gamma=4, max_new_tokens=20)
    assert first.settings["engine"] == "graphs"
    assert first.settings["engine_note"] == "CUDA graphs captured in 1.2 s; drafter: CUDA graphs captured in 1.2 s"
    again = speculative_generate(PROMPT, drafter, target, gamma=4, max_new_tokens=20, seed=1)
    assert again.settings["engine"] == "graphs" and "engine_note" not in again.settings
    reference = autoregressive_generate(PROMPT, target, max_new_tokens=20, cached="dynamic").output_ids
    assert first.output_ids == again.output_ids == reference
    assert autoregressive_generate(PROMPT, target, max_new_tokens=20).output_ids == reference
    runner = graphs._RUNNERS[(id(target), str(target.device), "target")]
    assert runner.replays > 0 and not runner.held


def test_a_generate_and_its_baseline_run_at_once_on_two_captured_caches_and_a_third_run_takes_the_dynamic_one(gpu_like):
    drafter, target = models("similar")
    sampling = Sampling(temperature=1.0)
    spec = speculative_stream(PROMPT, drafter, target, gamma=3, sampling=sampling, max_new_tokens=12, seed=4)
    base = autoregressive_stream(PROMPT, target, sampling=sampling, max_new_tokens=12, seed=4)
    third = autoregressive_stream(PROMPT, target, sampling=sampling, max_new_tokens=12, seed=4)
    firsts = [next(spec), next(base), next(third)]
    assert [t.settings["engine"] for t in firsts] == ["graphs", "graphs", "dynamic"]
    assert "other runs hold this model's 2 captured caches" in firsts[2].settings["engine_note"]
    # in turns to the end, as the page's Generate runs them: each equals its run alone on the dynamic cache
    ends = [list(stream)[-1] for stream in (spec, base, third)]
    assert (
        ends[0].output_ids
        == speculative_generate(
            PROMPT, drafter, target, gamma=3, sampling=sampling, max_new_tokens=12, seed=4, cached="dynamic"
        ).output_ids
    )
    assert (
        ends[1].output_ids
        == ends[2].output_ids
        == autoregressive_generate(
            PROMPT, target, sampling=sampling, max_new_tokens=12, seed=4, cached="dynamic"
        ).output_ids
    )
    pool = [
        graphs._RUNNERS[(id(target), str(target.device), "target")],
        *graphs._SPARES[(id(target), str(target.device), "target")],
    ]
    assert len(pool) == 2 and not any(r.held for r in pool)


def test_a_run_stopped_early_gives_its_graphs_back(gpu_like):
    drafter, target = models("similar")
    stream = speculative_stream(PROMPT, drafter, target, gamma=2, max_new_tokens=24)
    next(stream)
    runner = graphs._RUNNERS[(id(target), str(target.device), "target")]
    assert runner.held
    stream.close()  # the page's Stop, or a visitor who left
    assert not runner.held and not graphs._RUNNERS[(id(drafter), str(drafter.device), "drafter")].held


def test_a_failed_capture_is_said_once_and_the_models_runs_take_the_dynamic_cache(gpu_like, monkeypatch, caplog):
    drafter, target = models("similar")
    tries = []

    def failing(self):
        tries.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs.GraphedRunner, "capture", failing)
    for _ in range(3):
        trace = autoregressive_generate(PROMPT, target, max_new_tokens=4)
        assert trace.settings["engine"] == "dynamic"
        assert trace.settings["engine_note"].startswith(
            "eager passes over the dynamic cache: capturing CUDA graphs failed (RuntimeError"
        )
    assert len(tries) == 1 and sum("capturing CUDA graphs failed" in r.message for r in caplog.records) == 1


def test_auto_keeps_the_dynamic_cache_where_graphs_cannot_serve_and_says_why(gpu_like):
    _, target = models("similar")
    choice = choose_cache(target, keep_features=True)
    assert choice.cached == "dynamic" and "EAGLE drafter reads the target's features" in choice.reason
    runner = make_runner(target, 8, "auto", keep_features=True)
    assert runner.engine == "dynamic" and runner.note == choice.reason


def test_the_status_names_the_engine_on_a_gpu_and_nothing_on_a_cpu():
    from specviz.trace import Trace
    from specviz.views.verdict import engine_sentence

    def run(**settings):
        return Trace(mode="speculative", prompt_ids=[1], settings=settings)

    assert engine_sentence(run(engine="dynamic"), run(engine="dynamic")) == ""
    assert engine_sentence(run(engine="graphs", engine_note="CUDA graphs captured in 1.6 s"), run(engine="graphs")) == (
        "Passes: CUDA graphs over a static cache, both runs (speculative: CUDA graphs captured in 1.6 s)."
    )
    assert (
        engine_sentence(run(engine="graphs"), run(engine="graphs"))
        == "Passes: CUDA graphs over a static cache, both runs."
    )
    busy = "eager passes over the dynamic cache: other runs hold this model's 2 captured caches"
    assert engine_sentence(run(engine="dynamic", engine_note=busy), run(engine="dynamic", engine_note=busy)) == (
        f"Passes: speculative dynamic, baseline dynamic (speculative: {busy}; baseline: {busy})."
    )


def test_on_zerogpu_each_worker_captures_its_own_graphs_once_and_keeps_them_while_it_lives(gpu_like, monkeypatch):
    """A stand-in for ZeroGPU: ``spaces.GPU`` runs each call in a worker process forked from the main one (its
    module state a copy of the main process's at the fork), reused while warm. The graphs are captured inside the
    call, counted in its duration, and kept by the worker, never by the main process."""
    import importlib.machinery
    import sys
    import types

    from specviz.serving import gpu, gpu_duration

    workers = []

    def fork():  # what a forked worker starts with: the main process's registries as they are now
        workers.append({name: dict(getattr(graphs, name)) for name in ("_RUNNERS", "_SPARES", "_FAILED")})

    def GPU(task=None, *, duration=None):
        def decorate(fn):
            def call(*args, **kwargs):
                main = {name: getattr(graphs, name) for name in workers[-1]}
                for name, registry in workers[-1].items():
                    setattr(graphs, name, registry)
                try:
                    return fn(*args, **kwargs)
                finally:
                    for name, registry in main.items():
                        setattr(graphs, name, registry)

            return call

        return decorate(task) if task is not None else decorate

    spaces = types.ModuleType("spaces")
    spaces.__spec__ = importlib.machinery.ModuleSpec("spaces", None)
    spaces.GPU = GPU
    monkeypatch.setitem(sys.modules, "spaces", spaces)
    monkeypatch.setenv(gpu.ZEROGPU_ENV, "1")
    drafter, target = models("similar")

    @gpu.gpu_task(duration=60)
    def generate(seed):
        return speculative_generate(PROMPT, drafter, target, gamma=3, max_new_tokens=8, seed=seed).settings

    fork()
    first, warm = generate(0), generate(1)
    assert first["engine"] == warm["engine"] == "graphs"
    assert first["engine_note"].startswith("CUDA graphs captured in") and "engine_note" not in warm
    assert graphs._RUNNERS == {}  # the main process captured nothing
    fork()  # a fresh worker captures again
    assert generate(2)["engine_note"].startswith("CUDA graphs captured in")
    assert gpu_duration.GRAPH_CAPTURE_S > 0  # and the call's requested duration allows for it


def test_fused_graphs_are_off_by_default_and_never_on_zerogpu(monkeypatch):
    from specviz.engine import zerogpu

    monkeypatch.delenv(graphs.FUSE_ENV, raising=False)
    assert not graphs.fuse_default()
    monkeypatch.setenv(graphs.FUSE_ENV, "1")
    assert graphs.fuse_default()
    monkeypatch.setattr(zerogpu, "on_zerogpu", lambda: True)
    assert not graphs.fuse_default()


def _can_compile_for_the_cpu() -> bool:
    """Inductor on a CPU builds C++ against Python's headers."""
    import shutil
    import sysconfig
    from pathlib import Path

    return (
        bool(shutil.which("g++") or shutil.which("c++"))
        and (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()
    )


@pytest.mark.slow
@pytest.mark.skipif(
    not _can_compile_for_the_cpu(), reason="inductor on a CPU needs a C++ compiler and Python's headers"
)
def test_the_compiled_pass_a_fused_graph_captures_gives_the_eager_passs_logits():
    """What ``fuse`` captures on a GPU, compiled for the CPU here: the same pass over the static cache's buffers.
    Tolerance 1e-5 absolute: fused kernels sum in another order (fp32, logits of order 1)."""
    from specviz.engine.cache import StaticKV
    from specviz.lab.models import tiny_lm

    model = tiny_lm(vocab=16, layers=2, n_positions=64, init=0.3)
    kv = StaticKV(model, 64)

    def model_pass(buf):
        return model(
            input_ids=buf["ids"],
            attention_mask=buf["mask"],
            position_ids=buf["positions"][None],
            past_key_values=kv.cache,
            use_cache=True,
        ).logits[0]

    fused = graphs.compiled_pass(model_pass)
    positions = torch.arange(3, 7)
    buf = {"ids": torch.tensor([[3, 1, 4, 1]]), "positions": positions, "mask": kv.causal_mask(positions)}
    with torch.inference_mode():
        kv.set_length(0)
        model_pass(
            {"ids": torch.tensor([[2, 7, 1]]), "positions": torch.arange(3), "mask": kv.causal_mask(torch.arange(3))}
        )
        kv.set_length(3)
        eager = model_pass(buf).clone()
        kv.set_length(3)
        compiled = fused(buf)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=0)


def test_a_baseline_runs_on_the_engine_its_speculative_run_got(gpu_like):
    """Another visitor's runs hold both captured caches when this Generate starts, and one is given back between its
    speculative run's first round and its baseline's start: the baseline still runs eagerly, as its speculative run
    does, so the speedup compares drafting alone."""
    from specviz.measure.baseline import with_baseline_stream

    drafter, target = models("similar")
    others = [graphs.hold(target, 8, "target")[0] for _ in range(2)]
    steps = with_baseline_stream(
        PROMPT, drafter, target, gamma=3, max_new_tokens=10, sampling=Sampling(temperature=1.0)
    )
    spec, base = next(steps)
    assert spec.settings["engine"] == "dynamic" and base is None
    others[0].release()
    for spec, base in steps:
        pass
    assert base.settings["engine"] == "dynamic" and spec.stop_reason and base.stop_reason
    # one cache free: the speculative run takes it, its baseline finds none; the page then gives no speedup, and says
    # why
    from specviz.views.verdict import headline_html, verdict, weigh

    spec, base = list(with_baseline_stream(PROMPT, drafter, target, gamma=3, max_new_tokens=10))[-1]
    assert (spec.settings["engine"], base.settings["engine"]) == ("graphs", "dynamic")
    assert weigh(spec, base) is None
    assert "do not compare" in verdict(spec, base) and "do not compare" in headline_html(spec, base)


def test_bench_keeps_its_eager_baseline_eager_where_the_loops_default_replays_graphs(gpu_like):
    from types import SimpleNamespace

    from specviz.measure.bench import _runner

    _, target = models("similar")
    pair = SimpleNamespace(target=target, vocab_size=8)
    eager = _runner("autoregressive_eager", pair, Sampling(), 4, 4)(PROMPT, 0)
    graphed = _runner("autoregressive", pair, Sampling(), 4, 4, cached="auto")(PROMPT, 0)
    assert (eager.settings["engine"], graphed.settings["engine"]) == ("dynamic", "graphs")
    assert eager.output_ids == graphed.output_ids


def test_a_pair_let_go_takes_its_captured_graphs_with_it(gpu_like):
    from types import SimpleNamespace

    from specviz.pair.cache import _forget_graphs

    drafter, target = models("similar")
    speculative_generate(PROMPT, drafter, target, gamma=2, max_new_tokens=4)
    assert {k[0] for k in graphs._RUNNERS} == {id(target), id(drafter)}
    _forget_graphs([SimpleNamespace(target=target, drafter=drafter)])
    assert graphs._RUNNERS == {} and graphs._SPARES == {}


def test_a_capture_is_not_timed_as_the_runs_prefill(gpu_like, monkeypatch):
    """A capture planted to take 2 s (a real one takes about 1.6 s on an H100): the run that captured says so in its
    engine note, and neither its prefill nor its total holds those seconds (the runners are made before its clock)."""
    import time as clock_time

    def slow_capture(self):
        clock_time.sleep(2.0)
        return _stand_in_capture(self)

    monkeypatch.setattr(graphs.GraphedRunner, "capture", slow_capture)
    drafter, target = models("similar")
    trace = speculative_generate(PROMPT, drafter, target, gamma=2, max_new_tokens=4)
    assert "drafter: CUDA graphs captured" in trace.settings["engine_note"]
    assert trace.prefill_ms < 2000 and trace.total_ms < 2000
