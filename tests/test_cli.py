"""The command line on the embedded pair (named explicitly: the default is the English pair where it is installed).

Most commands run in this process (``specviz.cli.main``, what ``python -m specviz`` calls), their output and exit code
caught as a process's would be: a new interpreter for each cost 5-10 s of imports and loads on a 2-core CPU. Two run as
``python -m specviz`` in a process of their own, for what only a process shows: the usage's command name (argv[0]) and a
quiet terminal (no library warning or loading bar from any logger, whenever its handler was made).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from types import SimpleNamespace

import pytest


def run(*args, process: bool = False):
    """``python -m specviz`` with ``args`` (``process``: in a new interpreter; else ``specviz.cli.main`` here, its
    output and exit status caught as the process's would be); generate, record and bench run on the embedded pair unless
    told
    otherwise. Returns an object with returncode, stdout and stderr."""
    if args and args[0] in ("generate", "record", "bench") and "--pair" not in args and "--help" not in args:
        args = (args[0], "--pair", "embedded", *args[1:])
    if process:
        return subprocess.run([sys.executable, "-m", "specviz", *args], capture_output=True, text=True, timeout=300)
    from specviz.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as end:  # as the interpreter ends: None is 0, a number itself, a message printed and 1
            if isinstance(end.code, str):
                print(end.code, file=sys.stderr)
            code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_generate_json_has_the_trace():
    out = run("generate", "--pair", "embedded", "--prompt", "def add(a, b):", "--gamma", "4", "--temperature", "0",
              "--top-k", "0", "--top-p", "1", "--max-new-tokens", "24", "--seed", "0", "--json")
    assert out.returncode == 0, out.stderr
    trace = json.loads(out.stdout)
    assert len(trace["output_ids"]) <= 24 and trace["output_text"]
    for key in ("rounds", "acceptance_rate", "alpha", "tokens_per_second"):
        assert key in trace
    draft = trace["rounds"][0]["drafts"][0]
    assert {"token_id", "q", "p", "accept_prob", "u", "accepted", "beta"} <= set(draft)
    assert 0 <= draft["beta"] <= 1


def test_generate_autoregressive_and_terminal_colours():
    out = run("generate", "--prompt", "import os\n", "--mode", "autoregressive", "--max-new-tokens", "8")
    assert out.returncode == 0, out.stderr
    assert "tokens/s" in out.stdout
    assert "bonus" not in out.stdout and "alpha" not in out.stdout  # the baseline has no drafts to colour or count
    out = run("generate", "--prompt", "import os\n", "--max-new-tokens", "8", process=True)
    assert "\x1b[" in out.stdout and "alpha" in out.stdout and "draft acceptance rate" in out.stdout
    # quiet by default: no loading bars or library warnings on the terminal
    assert "Loading weights" not in out.stderr and "warn" not in out.stderr.lower(), out.stderr


def test_help_shows_defaults_and_they_match_the_page():
    from specviz.cli import build_parser
    from specviz.engine.sampling import DEFAULT_SAMPLING

    gen = build_parser().parse_args(["generate", "--prompt", "x"])
    assert (gen.temperature, gen.top_k, gen.top_p) == (
        DEFAULT_SAMPLING.temperature,
        DEFAULT_SAMPLING.top_k,
        DEFAULT_SAMPLING.top_p,
    )
    assert build_parser().parse_args(["bench"]).temperature == 0.0  # bench compares greedy runs, and says so
    from specviz.pair import default_pair

    # the English pair where it loads offline
    assert gen.pair == build_parser().parse_args(["bench"]).pair == default_pair()
    out = run("generate", "--help")
    assert "(default: 0.7)" in out.stdout and "(default: 40)" in out.stdout
    assert " ".join(out.stdout.split()).count("(default: english") <= 1  # said once, not twice


def test_bad_input_exits_with_a_message():
    out = run("generate", "--prompt", "x", "--gamma", "0")
    assert out.returncode == 2 and "gamma" in out.stderr
    out = run("generate", "--prompt", "x", "--temperature", "-1")
    assert out.returncode == 2 and "temperature" in out.stderr


@pytest.mark.parametrize(
    "args, field",
    [
        (("--temperature", "5"), "temperature"),
        (("--top-k", "5000"), "top-k"),
        (("--top-p", "0"), "top-p"),
        (("--repetition-penalty", "3"), "repetition penalty"),
        (("--gamma", "17"), "gamma"),
    ],
)
def test_the_command_line_refuses_what_the_page_refuses(args, field):
    """One set of limits (specviz.limits): the page caps temperature at 2, so does the command line."""
    from specviz.limits import sampling_problem

    out = run("generate", "--prompt", "x", *args)
    assert out.returncode == 2 and f"{field} must be" in out.stderr, out.stderr
    sampling = dict(temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.0, gamma=4)
    assert sampling_problem(**sampling) is None


def test_bench_runs_and_reports_every_method():
    out = run(
        "bench",
        "--pair",
        "embedded",
        "--gamma",
        "2",
        "--max-new-tokens",
        "6",
        "--repeats",
        "1",
        "--prompts",
        "2",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    for key in ("autoregressive", "speculative", "hf_generate", "hf_assisted"):
        assert report[key]["tokens_per_second"]["median"] > 0
    for key in (
        "speedup",
        "speedup_vs_hf_assisted",
        "predicted_speedup",
        "efficiency",
        "cost_coefficient",
        "acceptance_rate",
        "alpha",
        "draft_acceptance_rate",
        "mean_beta",
        "verify_cost",
        "predicted_speedup_verify",
    ):
        assert key in report
    assert 0 <= report["draft_acceptance_rate"] <= report["alpha"] <= 1  # discarded drafts only enlarge the denominator


def test_record_writes_a_recording_the_demo_can_load(tmp_path, capsys):
    from specviz.cli import main
    from specviz.recording import Recording

    out = tmp_path / "run.json"
    with pytest.raises(SystemExit) as done:
        main(
            [
                "record",
                "--pair",
                "embedded",
                "--prompt",
                "def f(x):",
                "--gamma",
                "3",
                "--temperature",
                "0.7",
                "--max-new-tokens",
                "12",
                "--sweep",
                "--out",
                str(out),
            ]
        )
    assert done.value.code == 0
    rec = Recording.load(out)
    assert len(rec.speculative.output_ids) == 12 and rec.baseline is not None
    assert [p.gamma for p in rec.sweep.points] == list(range(1, 9))
    assert "gamma sweep" in capsys.readouterr().err  # a long command shows a progress bar on stderr


@pytest.mark.parametrize(
    "kind, schedule", [("ngram", "heuristic"), ("early-exit", "confidence"), ("quantized", "constant")]
)
def test_generate_with_each_drafter_kind_and_schedule(kind, schedule):
    out = run(
        "generate",
        "--prompt",
        "x = 1\ny = 2\nx = 1\ny =",
        "--drafter-kind",
        kind,
        "--gamma-schedule",
        schedule,
        "--temperature",
        "0",
        "--max-new-tokens",
        "16",
        "--repetition-penalty",
        "1.2",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    trace = json.loads(out.stdout)
    assert trace["settings"]["drafter"]["kind"] == kind and trace["settings"]["gamma_schedule"]["name"] == schedule
    assert trace["settings"]["sampling"]["repetition_penalty"] == 1.2
    out = run(
        "generate", "--prompt", "x", "--drafter-kind", "early-exit", "--exit-layer", "99", "--max-new-tokens", "4"
    )
    assert out.returncode == 2 and "exit_layer" in out.stderr


def test_generate_a_batch_from_a_prompts_file(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def is_prime(n):\nclass Stack:\\n    def __init__(self):\n\n", encoding="utf-8")
    out = run("generate", "--prompts-file", str(prompts), "--temperature", "0", "--max-new-tokens", "12", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["batch"]["rows"] == 2 and len(report["traces"]) == 2
    assert report["traces"][1]["prompt_text"] == "class Stack:\n    def __init__(self):"  # \n in a line is a newline
    assert all(t["settings"]["batch"]["row"] == b for b, t in enumerate(report["traces"]))
    out = run("generate", "--prompts-file", str(prompts), "--mode", "autoregressive", "--max-new-tokens", "4")
    assert out.returncode == 0 and "row 1:" in out.stdout and "tokens/s over the batch" in out.stdout, out.stderr


@pytest.mark.parametrize(
    "content, message",
    [
        ('["a", 3]', "must hold a list of prompt strings"),
        ('[1, 2]', "must hold a list of prompt strings"),
        ('["a", ', "not valid JSON"),
        ("\n".join(["x = 1"] * 65), "give 1 to 64"),
        ("   \n\n", "give 1 to 64"),
        (b"\xff\xfe\x00", "cannot be read as UTF-8"),
    ],
)
def test_a_bad_prompts_file_gets_a_message(tmp_path, content, message):
    path = tmp_path / "prompts.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = run("generate", "--prompts-file", str(path), "--max-new-tokens", "4")
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_record_with_nothing_tested_writes_and_reports(tmp_path, capsys):
    """Prompt lookup on a prompt with nothing to copy, one token: no draft is tested, alpha is None."""
    from specviz.cli import main
    from specviz.recording import Recording

    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as done:
        main(
            [
                "record",
                "--pair",
                "embedded",
                "--drafter-kind",
                "ngram",
                "--prompt",
                "abc",
                "--max-new-tokens",
                "1",
                "--out",
                str(out),
            ]
        )
    assert done.value.code == 0, capsys.readouterr().err
    rec = Recording.load(out)
    assert rec.speculative.alpha is None and len(rec.speculative.output_ids) == 1
    assert "wrote" in capsys.readouterr().out


def test_a_batch_honours_the_confidence_threshold(tmp_path, capsys):
    from specviz.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def is_prime(n):\nimport os\n", encoding="utf-8")
    with pytest.raises(SystemExit) as done:
        main(
            [
                "generate",
                "--prompts-file",
                str(prompts),
                "--gamma-schedule",
                "confidence",
                "--confidence",
                "0.99",
                "--max-new-tokens",
                "6",
                "--json",
            ]
        )
    assert done.value.code == 0
    report = json.loads(capsys.readouterr().out)
    assert [t["settings"]["gamma_schedule"]["threshold"] for t in report["traces"]] == [0.99, 0.99]


def test_bench_batch_sizes_take_the_confidence_threshold(capsys):
    from specviz.cli import main

    with pytest.raises(SystemExit) as done:
        main(
            [
                "bench",
                "--batch-sizes",
                "1,2",
                "--gamma-schedule",
                "confidence",
                "--confidence",
                "0.9",
                "--max-new-tokens",
                "4",
                "--repeats",
                "1",
                "--json",
            ]
        )
    assert done.value.code == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # the progress bar goes to stderr, never into the JSON
    assert "batch bench runs" in captured.err
    assert report["settings"]["confidence"] == 0.9 and [r["batch_size"] for r in report["rows"]] == [1, 2]
    # a confidence schedule drafts fewer than gamma
    assert all(r["predicted_speedup_verify"] is None for r in report["rows"])


def test_a_failure_inside_a_model_is_an_error_message(monkeypatch, capsys):
    import specviz
    from specviz.cli import main

    def broken(*args, **kwargs):
        raise RuntimeError("the cache could not be cropped")

    monkeypatch.setattr(specviz, "speculative_generate", broken)
    with pytest.raises(SystemExit) as done:
        main(["generate", "--prompt", "x", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert (
        done.value.code == 1
        and "error: the run failed: the cache could not be cropped" in err
        and "Traceback" not in err
    )


def test_usage_names_the_command_as_typed():
    """`specviz --help` (the installed script) says `usage: specviz`; `python -m specviz --help` says that."""
    from specviz.cli import build_parser, program_name

    assert program_name("/home/u/.local/bin/specviz") == "specviz"
    assert program_name("/site-packages/specviz/__main__.py") == "python -m specviz"
    assert build_parser(program_name("/usr/bin/specviz")).format_usage().startswith("usage: specviz ")
    out = run("--help", process=True)
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m specviz ")


def test_generate_runs_the_engine_asked_for_and_says_which():
    """``--cache``: auto (the page's engine: the dynamic cache on a CPU) or one named for comparison; graphs need
    CUDA."""
    auto = run("generate", "--prompt", "def f(x):", "--max-new-tokens", "6", "--json")
    static = run("generate", "--prompt", "def f(x):", "--max-new-tokens", "6", "--json", "--cache", "static")
    assert auto.returncode == static.returncode == 0, auto.stderr + static.stderr
    assert (
        json.loads(auto.stdout)["settings"]["engine"] == "dynamic"
        and json.loads(static.stdout)["settings"]["engine"] == "static"
    )
    graphs = run("generate", "--prompt", "def f(x):", "--max-new-tokens", "6", "--cache", "graphs")
    assert graphs.returncode == 2 and "CUDA graphs need a model on a CUDA device" in graphs.stderr, graphs.stderr
