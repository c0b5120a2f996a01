"""What a class reads first in the status: the verdict, with its kernel and number-format details ("oneDNN-packed
weights", "5 rows measured 1.22x one row's cost", "dequantized Q4_1") folded under "How this machine computes", plain
words first."""

from __future__ import annotations

from tests.test_one_speedup import _base, _spec


def test_the_status_folds_how_this_machine_computes_after_the_verdict():
    from specviz.ui.page.outputs import MACHINE_SUMMARY, everything, machine_folded
    from specviz.recording import Recording

    status = (
        "Done: 64 tokens in 20 rounds (max new tokens). Pair: English, on cpu. Faster than the target alone (speedup "
        "1.30×): why. Target: smollm2\\-135m\\-instruct\\-q4\\_1\\.gguf from the llm\\-smollm2 package (dequantized "
        "to fp32, converted once and cached). Form: fp32: this CPU reports no bf16 instructions; matrix products "
        "chosen per row count, timed at load (2\\-17 rows mostly with oneDNN\\-packed weights): 5 rows measured "
        "1\\.22x one row's cost. It waited 1.2 s for the device behind 1 other job."
    )
    folded = machine_folded(status)
    head, details = folded.split("<details", 1)
    assert head.startswith("Done: 64 tokens") and "Faster than the target alone" in head and "It waited 1.2 s" in head
    for jargon in ("oneDNN", "dequantized", "one row's cost", "Form:"):
        assert jargon not in head and jargon in details
    assert f"<summary>{MACHINE_SUMMARY}</summary>" in details and "32-bit numbers (fp32)" in details
    assert details.index("In plain words") < details.index("Target:") < details.index("Form:")
    assert machine_folded("Replaying a recording. No model was run.") == "Replaying a recording. No model was run."
    spec, base = _spec([(3, 1.0, 6.0, 0.2)] * 8), _base(32, 4.0)
    assert everything(Recording(spec, base), status, None)["status"] == folded
