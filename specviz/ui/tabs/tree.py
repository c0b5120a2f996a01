"""The page's token tree control: which tree a run drafts, checked, and the replay's tree figure."""

from __future__ import annotations

from specviz.recording import Recording
from specviz.engine.stopping import Deadline, ProgressReport, StopCheck, Stopped, either, run_steps
from specviz.engine.tree.spec import TreeSpec
from specviz.ui.guard.checks import mistake
from specviz.ui.guard.limits import CALIBRATION_SECONDS_MAX

# The choices the page offers (label -> spec builder); "chain" drafts gamma tokens in a row.
TREES = {
    "chain": None,
    "tree 3-2-2-1 (33 nodes)": lambda: TreeSpec.static((3, 2, 2, 1)),
    "tree 2-2-2-1 (22 nodes)": lambda: TreeSpec.static((2, 2, 2, 1)),
    "tree 3-2-2-1, sampled children": lambda: TreeSpec.static((3, 2, 2, 1), "sampled"),
    "dynamic tree, 16 nodes": lambda: TreeSpec.dynamic(16),
    "dynamic tree, 32 nodes": lambda: TreeSpec.dynamic(32),
    "auto: fastest for this device": None,  # chosen per pair by ``resolve_tree`` (a short calibration, then cached)
}
AUTO = "auto: fastest for this device"
TREE_CHOICES = list(TREES)


def check_tree(choice) -> str:
    """The choice as is, or gr.Error naming the field and the choices (the value is not echoed)."""
    if choice in (None, ""):
        return "chain"
    if choice not in TREES:
        raise mistake(f"token tree must be one of: {', '.join(TREE_CHOICES)}", "Token tree")
    return choice


def tree_spec(choice: str) -> TreeSpec | None:
    """The TreeSpec of a checked choice; None for the chain (and for auto: see ``resolve_tree``)."""
    build = TREES.get(choice)
    return build() if build else None


def resolve_tree(
    choice: str, pair, drafter, sampling, gamma: int, stop: StopCheck | None = None
) -> tuple[TreeSpec | None, int, str]:
    """(tree, gamma, sentence) a run drafts with: the choice's own and ``gamma``, or for auto the tree
    or chain ``specviz.engine.tree.auto`` predicts fastest for this pair, drafter, sampling and device,
    with the sentence that states it and its inputs ("" otherwise). Raises as ``resolve``."""
    return resolve(choice, pair, drafter, sampling, gamma, stop)[:3]


def resolve(
    choice: str,
    pair,
    drafter,
    sampling,
    gamma: int,
    stop: StopCheck | None = None,
    progress: ProgressReport | None = None,
) -> tuple[TreeSpec | None, int, str, dict | None]:
    """``resolve_tree``'s three, and for auto the choice's record (``AutoTree.record``: plain data a
    recording keeps and the Theory tab draws from; None otherwise).

    Auto's calibration (when this pair, device, drafter and sampling have none cached) runs inside the
    visitor's job: it asks ``stop`` (the job's check: Stop, a client gone, its device share) after every
    round, and ends at CALIBRATION_SECONDS_MAX of its own; it tells ``progress`` (parts done, parts in all) as it goes.

    Raises:
        specviz.engine.stopping.Stopped: ``stop`` asked to end during the calibration (its caller knows why).
        gr.Error: the calibration reached CALIBRATION_SECONDS_MAX (the message names the field and the choices left).
    """
    return run_steps(resolve_steps(choice, pair, drafter, sampling, gamma, stop), progress)


def resolve_steps(choice: str, pair, drafter, sampling, gamma: int, stop: StopCheck | None = None):
    """``resolve`` as steps (``specviz.engine.stopping.run_steps``): for auto, yields the calibration's (parts done,
    parts in all) between its pieces of work, so the device thread runs other visitors' steps between them
    (``specviz.serving.device_thread``); returns ``resolve``'s four. Raises as ``resolve``."""
    if choice != AUTO:
        return tree_spec(choice), gamma, "", None
    from specviz.pair.auto_tree import auto_for_pair_steps

    cap = Deadline.after(CALIBRATION_SECONDS_MAX)
    try:
        auto = yield from auto_for_pair_steps(
            pair, drafter, sampling, max_new_tokens=32, max_nodes=32, stop=either(stop, cap)
        )
    except Stopped:
        if not cap():
            raise
        raise mistake(
            f"token tree: measuring this pair on this device for auto takes longer than its limit of "
            f"{CALIBRATION_SECONDS_MAX:.0f} s here (a slow or busy machine); choose the chain or a hand-made tree",
            "Token tree",
        ) from None
    return auto.tree, auto.gamma, auto.choice.sentence(), auto.record()


def replay_tree(rec: Recording | None, index: int):
    """The tree figure of round ``index`` (1-based), or an empty figure for chain rounds."""
    import plotly.graph_objects as go

    from specviz.views.charts import style_figure
    from specviz.views.tree import tree_figure

    spec = rec.speculative if rec is not None else None
    if spec is None or not spec.rounds or spec.rounds[min(max(index, 1), len(spec.rounds)) - 1].tree is None:
        # Short: the title is one line in a phone's 370 px (the longer one was cut there).
        fig = style_figure(go.Figure(), "Token tree: none (a chain run)", None, None)
        fig.update_layout(height=140)
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return fig
    return tree_figure(spec, min(max(index, 1), len(spec.rounds)) - 1)
