"""A recording or trace from outside is data: checked to its meaning, with the work of loading bounded by design.

``Recording.from_json`` and ``Trace.from_dict`` call these checks. Three layers, cheapest first:

1. ``check_structure`` on the parsed JSON, before any model object is built: nesting depth,
   the number of rounds, drafts per round, top tokens per round, ids and sweep points, and the
   length of every string. Each bound follows from what specviz itself can record (at most
   MAX_NEW_TOKENS tokens, MAX_GAMMA drafts a round, TOP_TOKENS top tokens), so loading the
   largest valid file costs a fixed, small amount of work whatever its bytes hold.
2. pydantic, field by field against the dataclasses (``specviz.trace.validate``).
3. ``check_trace`` on the built Trace: every probability finite and in [0, 1], u in [0, 1),
   times finite and >= 0, gamma a whole number in 1..MAX_GAMMA, an EAGLE round's features_from a
   position settled and scored before the round, verdicts in the engine's order
   (accepted, then at most one rejected, then discarded) and consistent with u and
   min(1, p/q), each round's emitted ids equal to its kept drafts and final token, and the
   output equal to the rounds' emitted ids in order.

Every failure is a ValueError naming the field (as a path like ``rounds.3.drafts.0.q``) and
what is allowed.
"""

from __future__ import annotations

import math
import re
from typing import Any

from specviz.limits import MAX_GAMMA, MAX_TREE_NODES
from specviz.trace.tree import check_tree

# A ``specviz.trace.Trace``. Not imported, even for annotations: the trace imports this module to
# load files, and the dependency runs one way (trace -> validation).
Trace = Any

# Bounds of what specviz records; a file beyond them was not written by specviz.
MAX_REASON_CHARS = 400  # settings.dtype_reason: one sentence
SEED_MAX = 2**63 - 1  # seeds and counts in settings: what the page's controls can take back
# A time is 0 or at least this (1 ns): a denormal such as 5e-324 ms makes tokens/s infinite.
MIN_TIME_MS = 1e-6
MAX_NEW_TOKENS = 4096  # the demo offers up to 256; the command line and API take more
MAX_PROMPT_TOKENS = 32768
MAX_TOP_TOKENS = 5  # specviz.engine.chain.TOP_TOKENS
MAX_TOKEN_ID = 1 << 20  # above every hub vocabulary (Gemma's 262,144 is the largest in use)
MAX_TEXT = 200_000  # characters of a prompt or output text
MAX_TOKEN_TEXT = 256  # characters of one token's text
MAX_TITLE = 300
MAX_DEPTH = 12  # a recording nests 7 levels: recording, trace, rounds, round, drafts, draft, value
MAX_SWEEP_POINTS = MAX_GAMMA
# The engine decides u * q < p in float32 and the trace keeps u, p, q and min(1, p/q) in
# float64 after that test, so a verdict within this much of the boundary may read either way.
VERDICT_TOLERANCE = 1e-5


def _fail(where: str, what: str) -> ValueError:
    """The refusal, naming the field and what it must be; never the value. A field's path may hold a
    file's own keys: anything but letters, digits, "_", "-" and "." in it is shown as "?"."""
    return ValueError(f"not a specviz recording: {re.sub(r'[^A-Za-z0-9_.-]', '?', where)[:120]}: {what}")


def check_schema_version(version, where: str, newest: int) -> None:
    """A file's schema version (``where``: its field): a whole number from 1 to ``newest``, the newest this code
    reads. A newer one is refused, naming the field and the versions allowed (a newer specviz wrote it: its fields
    may mean what this code does not know), and so is anything else; the value is not repeated."""
    whole = isinstance(version, int) and not isinstance(version, bool)
    if whole and version > newest:
        raise _fail(
            where,
            f"the file's schema version is newer than this specviz reads (schema versions 1 to {newest}); "
            "load it with a newer specviz",
        )
    if not whole or version < 1:
        raise _fail(where, f"must be a schema version: a whole number from 1 to {newest}")


def check_depth(obj, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON nested deeper than ``limit`` levels, a scalar value counting as a level.

    Level by level over the containers only (iterative: deep input cannot exhaust the stack;
    scalars, most of a file, are never pushed).
    """
    level, depth = [obj], 1
    while level:
        if depth >= limit and any(level):
            raise _fail("structure", f"nested more than {limit} levels deep; a recording nests about 7")
        following = []
        for node in level:
            children = node.values() if isinstance(node, dict) else node
            following.extend(v for v in children if isinstance(v, (dict, list)))
        level, depth = following, depth + 1


def _count(value, bound: int, where: str, what: str) -> None:
    if isinstance(value, (list, str)) and len(value) > bound:
        raise _fail(where, f"{len(value)} {what}; at most {bound} are allowed")


def check_structure(d, where: str = "trace") -> None:
    """Bound the counts and string lengths of a parsed trace dict before anything is built from it."""
    if not isinstance(d, dict):
        return  # pydantic names the type error
    _count(d.get("prompt_ids"), MAX_PROMPT_TOKENS, f"{where}.prompt_ids", "prompt tokens")
    _count(d.get("output_ids"), MAX_NEW_TOKENS, f"{where}.output_ids", "output tokens")
    _count(d.get("rounds"), MAX_NEW_TOKENS, f"{where}.rounds", "rounds")
    for key, bound in (("prompt_text", MAX_TEXT), ("output_text", MAX_TEXT)):
        _count(d.get(key), bound, f"{where}.{key}", "characters")
    for i, r in enumerate(d.get("rounds") or []):
        if not isinstance(r, dict):
            continue
        _count(r.get("drafts"), MAX_GAMMA, f"{where}.rounds.{i}.drafts", "drafts")
        tree = r.get("tree")
        if isinstance(tree, dict):
            _count(tree.get("nodes"), MAX_TREE_NODES, f"{where}.rounds.{i}.tree.nodes", "tree nodes")
            _count(tree.get("path"), MAX_GAMMA, f"{where}.rounds.{i}.tree.path", "path nodes")
            for x in tree.get("nodes") or []:
                if isinstance(x, dict):
                    _count(x.get("text"), MAX_TOKEN_TEXT, f"{where}.rounds.{i}.tree.text", "characters")
        _count(r.get("final_top"), MAX_TOP_TOKENS, f"{where}.rounds.{i}.final_top", "top tokens")
        _count(r.get("emitted_ids"), MAX_GAMMA + 1, f"{where}.rounds.{i}.emitted_ids", "emitted tokens")
        _count(r.get("final_text"), MAX_TOKEN_TEXT, f"{where}.rounds.{i}.final_text", "characters")
        for j, x in enumerate((r.get("drafts") or []) + (r.get("final_top") or [])):
            if isinstance(x, dict):
                _count(x.get("text"), MAX_TOKEN_TEXT, f"{where}.rounds.{i}.text", "characters")
    settings = d.get("settings")
    if isinstance(settings, dict):
        check_depth(settings, 3)
        _count(settings.get("models"), 2, f"{where}.settings.models", "models")
        _count(settings.get("eos_token_id"), 16, f"{where}.settings.eos_token_id", "end-of-sequence ids")


def _probability(x, where: str, upper_open: bool = False) -> None:
    if x is None:
        return
    if not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 or x > 1 or (upper_open and x >= 1):
        raise _fail(where, f"must be a finite number in [0, {'1)' if upper_open else '1]'}")


def _time(x, where: str) -> None:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x) or x < 0 or 0 < x < MIN_TIME_MS:
        raise _fail(where, f"must be a finite time in ms: 0, or from {MIN_TIME_MS} up")


def _token(x, where: str) -> None:
    if not isinstance(x, int) or not 0 <= x < MAX_TOKEN_ID:
        raise _fail(where, f"must be a token id from 0 to {MAX_TOKEN_ID - 1}")


def _whole(x, lo: int, hi: int, where: str) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
        raise _fail(where, f"must be a whole number from {lo} to {hi}")


def check_settings(trace: Trace, where: str) -> None:
    s = trace.settings
    gamma = s.get("gamma")
    # A chain's gamma; a token tree has a depth instead (settings.tree), and older tree traces a gamma.
    if (trace.mode == "speculative" and s.get("tree") is None) or gamma is not None:
        _whole(gamma, 1, MAX_GAMMA, f"{where}.settings.gamma")
    sampling = s.get("sampling", {})
    if not isinstance(sampling, dict):
        raise _fail(f"{where}.settings.sampling", "must be an object of temperature, top_k, top_p")
    for key, value in sampling.items():
        if not re.fullmatch(r"[a-z_]{1,40}", key):
            raise _fail(
                f"{where}.settings.sampling",
                "its keys must be names of lowercase letters and _ (temperature, top_k, ...)",
            )
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise _fail(f"{where}.settings.sampling.{key}", "must be a finite number")
    for key in ("seed", "max_new_tokens"):  # the range the page's controls take (a torch seed is 64-bit)
        if key in s:
            _whole(s[key], 0, SEED_MAX, f"{where}.settings.{key}")
    for key in ("mode", "device", "dtype"):
        if key in s and not isinstance(s[key], str):
            raise _fail(f"{where}.settings.{key}", "must be text")
    # Why the models ran in that dtype (specviz.pair.precision); recordings made before it have none.
    if "dtype_reason" in s and not (isinstance(s["dtype_reason"], str) and len(s["dtype_reason"]) <= MAX_REASON_CHARS):
        raise _fail(f"{where}.settings.dtype_reason", f"must be text of at most {MAX_REASON_CHARS} characters")
    if not all(isinstance(m, str) for m in s.get("models", [])):
        raise _fail(f"{where}.settings.models", "must be a list of model names")
    for key in ("drafter", "gamma_schedule", "tree"):
        value = s.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(
            isinstance(v, (str, int, float))
            and not isinstance(v, bool)
            and (not isinstance(v, float) or math.isfinite(v))
            for v in value.values()
        ):
            raise _fail(f"{where}.settings.{key}", "must be an object of names and finite numbers")


def check_trace(trace: Trace, where: str = "trace") -> Trace:
    """The meaning checks of the module docstring on a built Trace; returns it.

    Raises:
        ValueError: naming the first field that is out of range or inconsistent.
    """
    check_settings(trace, where)
    for i, t in enumerate(trace.prompt_ids):
        _token(t, f"{where}.prompt_ids.{i}")
    for key in ("prefill_ms", "total_ms"):
        _time(getattr(trace, key), f"{where}.{key}")
    if trace.rounds and not sum(r.verify_ms for r in trace.rounds if isinstance(r.verify_ms, (int, float))) > 0:
        raise _fail(
            f"{where}.rounds",
            "every round's verify_ms is 0: a run's target passes take time (c, v and the speedup divide by it)",
        )
    emitted: list[int] = []
    for i, r in enumerate(trace.rounds):
        at = f"{where}.rounds.{i}"
        for key in ("draft_ms", "verify_ms", "end_ms"):
            _time(getattr(r, key), f"{at}.{key}")
        if r.gamma is not None:
            _whole(r.gamma, 1, MAX_GAMMA, f"{at}.gamma")
            if len(r.drafts) > r.gamma:
                raise _fail(f"{at}.drafts", f"{len(r.drafts)} drafts in a round allowed gamma {r.gamma}")
        if trace.mode == "autoregressive" and r.drafts:
            raise _fail(f"{at}.drafts", "the autoregressive baseline drafts nothing")
        if r.features_from is not None:
            # The drafts grow from a position the target scored and kept before the round: at most
            # two before the first draft (the pending token, the last one settled, is not yet scored).
            _whole(r.features_from, 0, max(0, len(trace.prompt_ids) + len(emitted) - 2), f"{at}.features_from")
        verdicts = [d.verdict for d in r.drafts]
        n_acc = verdicts.count("accepted")
        if (
            verdicts[:n_acc] != ["accepted"] * n_acc
            or verdicts.count("rejected") > 1
            or ("rejected" in verdicts and verdicts[n_acc] != "rejected")
            or any(v != "discarded" for v in verdicts[n_acc + ("rejected" in verdicts) :])
        ):
            raise _fail(
                f"{at}.drafts",
                f"verdicts {verdicts} are not accepted drafts, then at most one rejected, then discarded ones",
            )
        if "discarded" in verdicts and "rejected" not in verdicts:
            raise _fail(f"{at}.drafts", "drafts are discarded only after a rejected one")
        if r.tree is not None:
            # A token tree: its drafts are the accepted path; the tree's own checks cover the tests.
            check_tree(r.tree, f"{at}.tree", [d.token_id for d in r.drafts], MAX_GAMMA, MAX_TOKEN_ID)
        for j, d in enumerate(r.drafts):
            dw = f"{at}.drafts.{j}"
            _token(d.token_id, f"{dw}.token_id")
            for key in ("q", "p", "accept_prob", "beta"):
                _probability(getattr(d, key), f"{dw}.{key}")
            _probability(d.u, f"{dw}.u", upper_open=True)
            if d.source is not None:
                # A prompt-lookup draft is copied from the sequence settled before its round.
                _whole(d.source, 0, max(0, len(trace.prompt_ids) + len(emitted) - 1), f"{dw}.source")
            if d.own_token_id is not None:
                _token(d.own_token_id, f"{dw}.own_token_id")
            if d.shared_mass is not None:
                _probability(d.shared_mass, f"{dw}.shared_mass")
            if d.verdict != "discarded" and r.tree is None:
                if d.q > 0 and abs(d.accept_prob - min(1.0, d.p / d.q)) > VERDICT_TOLERANCE:
                    raise _fail(f"{dw}.accept_prob", f"{d.accept_prob!r} is not min(1, p/q) = {min(1.0, d.p / d.q)!r}")
                if d.verdict == "accepted" and not d.u < d.accept_prob + VERDICT_TOLERANCE:
                    raise _fail(dw, f"accepted although u = {d.u!r} is not below min(1, p/q) = {d.accept_prob!r}")
                if d.verdict == "rejected" and not d.u > d.accept_prob - VERDICT_TOLERANCE:
                    raise _fail(dw, f"rejected although u = {d.u!r} is below min(1, p/q) = {d.accept_prob!r}")
        if r.final_token_id is not None:
            _token(r.final_token_id, f"{at}.final_token_id")
            _probability(r.final_prob, f"{at}.final_prob")
            wanted_kind = (
                "target"
                if trace.mode == "autoregressive" or (not r.drafts and r.tree is None)
                else r.tree.final_kind()
                if r.tree is not None
                else "correction"
                if "rejected" in verdicts
                else "bonus"
            )
            if r.final_kind != wanted_kind:
                raise _fail(
                    f"{at}.final_kind", f"{r.final_kind!r} after verdicts {verdicts}; it must be {wanted_kind!r}"
                )
            expected = [d.token_id for d in r.drafts[:n_acc]] + [r.final_token_id]
        else:
            if r.final_kind is not None:
                raise _fail(f"{at}.final_kind", "a round without a final token has no final kind")
            expected = [d.token_id for d in r.drafts[:n_acc]][: len(r.emitted_ids)]
        if r.emitted_ids != expected:
            raise _fail(
                f"{at}.emitted_ids", f"{r.emitted_ids} are not the round's kept drafts and final token {expected}"
            )
        for j, t in enumerate(r.final_top):
            tw = f"{at}.final_top.{j}"
            _token(t.token_id, f"{tw}.token_id")
            for key in ("prob", "p", "q"):
                _probability(getattr(t, key), f"{tw}.{key}")
        emitted += r.emitted_ids
    if trace.rounds and emitted != trace.output_ids:
        raise _fail(f"{where}.output_ids", "are not the rounds' emitted tokens in order")
    for i, t in enumerate(trace.output_ids):
        _token(t, f"{where}.output_ids.{i}")
    return trace


def check_sweep(sweep):
    """A sweep's numbers to their meaning: gammas in 1..MAX_GAMMA, counts whole and consistent, times finite >= 0."""
    for key in ("baseline_tokens_per_second", "target_step_ms"):
        _time(getattr(sweep, key), f"sweep.{key}")
    for key in ("drafter", "schedule"):  # names shown on the page: lowercase letters and hyphens only
        if getattr(sweep, key) is not None and not re.fullmatch(r"[a-z][a-z-]{0,31}", getattr(sweep, key)):
            raise _fail(f"sweep.{key}", "must be a name of lowercase letters and hyphens, at most 32")
    varies = sweep.schedule not in (None, "constant")  # gamma may change each round, up to MAX_GAMMA
    for i, p in enumerate(sweep.points):
        at = f"sweep.points.{i}"
        _whole(p.gamma, 1, MAX_GAMMA, f"{at}.gamma")
        for key in ("tokens", "rounds", "drafted", "accepted"):
            _whole(getattr(p, key), 0, MAX_NEW_TOKENS * (MAX_GAMMA + 1), f"{at}.{key}")
        if p.drafter_passes is not None:
            _whole(p.drafter_passes, 0, p.drafted, f"{at}.drafter_passes")
        for key in ("total_ms", "draft_ms"):
            _time(getattr(p, key), f"{at}.{key}")
        for key in ("verify_ms", "baseline_tokens_per_second"):
            if getattr(p, key) is not None:
                _time(getattr(p, key), f"{at}.{key}")
        if p.rounds and p.verify_ms is not None and not p.verify_ms > 0:
            raise _fail(f"{at}.verify_ms", "is 0 for a point with rounds: its target passes take time")
        rejected = p.rejected or 0
        if (
            p.accepted + rejected > p.drafted
            or rejected > p.rounds
            or p.drafted > p.rounds * (MAX_GAMMA if varies else p.gamma)
        ):
            raise _fail(at, "accepted, rejected and drafted counts are inconsistent with the rounds and gamma")
    return sweep
