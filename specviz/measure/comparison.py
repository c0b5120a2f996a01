"""Compare drafters: one prompt, seed and sampling, decoded with each drafter kind.

Each kind's speculative run is interleaved with its own autoregressive baseline
(``specviz.measure.baseline.with_baseline``), so each speedup compares runs that met the same machine noise;
the baselines repeat the same tokens (same seed), only their timings differ.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from specviz.measure.baseline import with_baseline_steps
from specviz.drafters import KINDS as ALL_KINDS, make_drafter
from specviz.engine.schedules import make_schedule
from specviz.engine.stopping import STOPPED, StopCheck
from specviz.trace import Trace

# the kinds that draft from the pair's own drafter and target
KINDS = tuple(k for k in ALL_KINDS if k != "cross-tokenizer")


@dataclass
class Comparison:
    """Runs so far: ``runs[kind] = (speculative trace, its baseline)``, in the order of ``kinds``, the
    kinds the comparison runs. ``stopped``: the caller's stop check ended the comparison; the kind under
    way then is in ``runs`` with its unfinished traces marked "stopped" (its baseline None if it had not
    started), and the kinds after it are not."""

    runs: dict[str, tuple[Trace, Trace | None]] = field(default_factory=dict)
    kinds: tuple[str, ...] = KINDS
    stopped: bool = False


def compare_stream(input_ids: list[int], drafter_model, target, kinds: Sequence[str] = KINDS, gamma: int = 4,
                   schedule: str = "constant", ngram_max: int = 3, exit_layer: int | None = None, tree=None,
                   stop: StopCheck | None = None, drafter_tokenizer=None, **common) -> Iterator[Comparison | None]:
    """Run each drafter kind on the same prompt; yield the growing Comparison after each, and None after every step
    of its runs (each round of the speculative run, each token of the baseline: nothing new to show, but a server's
    device thread may take another visitor's step there, ``specviz.serving.device_thread``).

    Args:
        input_ids, target: as ``speculative_stream``; drafter_model: the pair's drafter (kind "model").
        kinds: drafter kinds to run, of ``specviz.drafters.KINDS``.
        gamma, schedule: every kind's gamma and schedule name (a fresh schedule per run).
        tree: a ``specviz.engine.tree.spec.TreeSpec``: also run the drafter model with this token tree,
            under the key "tree", beside the chain.
        drafter_tokenizer: the drafter's own tokenizer where it has one (kind "cross-tokenizer"; the
            target's is ``common["tokenizer"]``), else None.
        stop: asked before each step of every run (``specviz.engine.stopping``); when it answers True the
            comparison yields once more, ``stopped`` set, and ends.
        common: sampling, max_new_tokens, eos_token_id, seed, tokenizer, shared by every run.

    Raises:
        ValueError: as ``speculative_stream`` and ``make_drafter``.
    """
    comparison = Comparison(kinds=(*kinds, *(["tree"] if tree is not None else [])))
    for kind in [*kinds, *(["tree"] if tree is not None else [])]:
        drafter = make_drafter(
            "model" if kind == "tree" else kind,
            drafter_model=drafter_model,
            target=target,
            ngram_max=ngram_max,
            exit_layer=exit_layer,
            drafter_tokenizer=drafter_tokenizer or common.get("tokenizer"),
            target_tokenizer=common.get("tokenizer"),
        )
        spec, base = yield from with_baseline_steps(
            input_ids, drafter, target, gamma=gamma, schedule=make_schedule(schedule, gamma),
            tree=tree if kind == "tree" else None, stop=stop, **common,
        )
        if spec is not None:
            comparison.runs[kind] = (spec, base)
        comparison.stopped = spec is None or STOPPED in (
            spec.stop_reason,
            base.stop_reason if base is not None else None,
        )
        yield comparison
        if comparison.stopped:
            return
