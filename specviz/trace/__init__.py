"""The record of one generation: every round's drafts, verdicts and timings.

Data flows one way: the engine writes a Trace, the views read it. A Trace round-trips
through JSON (``to_dict`` / ``Trace.from_dict``) so a run prepared on one machine can be
replayed on another with no model.

This package holds the trace's schema: this module (Trace, Round, Draft, TopToken), ``tree`` (a token
tree round's whole tree) and ``validation`` (the checks a trace from a file passes). It imports no
engine, measuring or view code (tests/test_layers.py).

Terms (Leviathan et al. 2023; vLLM's metric names):
- round: one draft-then-verify cycle; the autoregressive baseline has one round per token.
- draft acceptance rate: accepted drafts / drafted tokens (vLLM's name). Its denominator
  counts the drafts discarded after a rejection, which were never tested.
- alpha: accepted drafts / (accepted + rejected drafts), Leviathan et al.'s probability that
  one tested draft is accepted (Sec. 3.1, alpha = E[beta]).
- beta: sum over the vocabulary of min(p(x), q(x)) = 1 - TV(p, q) at one drafted position, the
  probability that a draft there is accepted (Leviathan et al. 2023, Def. 3.1 and Cor. 3.6).
- tokens per round: emitted tokens / rounds, counting the correction or bonus token.
"""

from __future__ import annotations

import math

import re

import functools
from dataclasses import asdict, dataclass, field
from typing import Literal

from specviz import metrics
from specviz.trace import validation
from specviz.limits import MAX_GAMMA  # noqa: F401  (re-exported: the engine and the views read it here)
from specviz.trace.tree import TreeRecord, renamed_rules

# Verdict of one drafted token. accepted:  u < min(1, p/q), kept in the output rejected:  the first draft that failed
# the test; replaced by the correction token discarded: drafted after a rejection, never tested
Verdict = Literal["accepted", "rejected", "discarded"]
# Where the token that closes a round came from.
#   correction: sampled from norm(max(0, p - q)) at the rejected position
#   bonus:      sampled from p after all drafts were accepted
#   target:     sampled from p by the autoregressive baseline
FinalKind = Literal["correction", "bonus", "target"]

STOPPED = "stopped"  # the stop_reason of a trace its caller ended early (``specviz.engine.stopping``)

# 2 added Round.final_top; 3 added Draft.beta and Round.gamma; 4 added Draft.source and the
# drafter and gamma_schedule settings; 5 added Round.tree (token trees) and the tree setting; 6
# named the tree rules "with-replacement" / "without-replacement" (were "specinfer" / "one-hot"),
# added TreeRecord.drafter_passes and left a tree round's gamma None (its depth is the tree's); 7
# added Round.features_from (where an EAGLE round's drafts grew from); 8 added Draft.own_token_id
# and Draft.shared_mass (a drafter with its own tokenizer).
# Older files still load (with no top tokens, no beta, gamma read from the settings, a drafter
# model with a constant gamma, chains, the old rule names read as the new ones, and no
# features_from, own_token_id or shared_mass).
SCHEMA_VERSION = 8

# MAX_GAMMA: the most drafts a round holds (defined in specviz.limits, re-exported here).


@dataclass(slots=True)
class Draft:
    """One drafted token and the test that judged it.

    ``q`` and ``p`` are probabilities of this token under the drafter's and the target's
    processed distributions; ``accept_prob`` = min(1, p/q); ``u`` the uniform draw in [0, 1).
    ``beta`` = sum_x min(p(x), q(x)) at this position, the probability that a draft here is
    accepted before it is drawn (Leviathan et al. 2023, Def. 3.1); None in traces saved
    before schema version 3. ``source``: for a draft copied by prompt lookup, the position in
    the sequence (prompt and output, 0-based) it was copied from; None for other drafters.
    ``own_token_id`` and ``shared_mass``: for a drafter with its own tokenizer under token-level
    intersection, the drafter's id of the same token string, and the mass its distribution put on
    the tokens both vocabularies share (q is that part, renormalised); None otherwise.
    """

    token_id: int
    text: str
    q: float
    p: float
    accept_prob: float
    u: float
    verdict: Verdict
    beta: float | None = None
    source: int | None = None
    own_token_id: int | None = None
    shared_mass: float | None = None

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"


@dataclass(slots=True)
class TopToken:
    """One of the most likely tokens of the distribution a round's final token came from.

    ``prob`` is its probability there (the normalised residual for a correction, p for a
    bonus or target token); ``p`` and ``q`` are the target's and the drafter's probabilities
    at that position (``q`` is None where no draft was made).
    """

    token_id: int
    text: str
    prob: float
    p: float
    q: float | None = None


@dataclass(slots=True)
class Round:
    """One round.

    Attributes:
        drafts: the drafted tokens in order (empty for the autoregressive baseline).
        final_token_id / final_text / final_kind: the correction, bonus or target token that
            closes the round; None when the round stopped before it (an accepted EOS draft,
            or max_new_tokens reached).
        final_prob: probability of the final token under the distribution it was sampled
            from (the normalised residual for a correction, p otherwise).
        emitted_ids: the tokens this round added to the output, in order.
        draft_ms / verify_ms: wall time of drafting and of the target's pass, in ms.
        end_ms: time since the start of generation when the round ended, in ms.
        final_top: the most likely tokens of the final token's distribution, most likely
            first (empty when not recorded).
        gamma: the drafts this round was allowed (its schedule's gamma, cut near
            max_new_tokens); None for the baseline and in traces saved before schema version 3.
            None for a token tree's round: a tree has a depth (``tree.depth``), not a gamma (tree
            traces saved before schema version 6 recorded the depth here).
        tree: a token tree round's whole tree (``specviz.trace.tree``); ``drafts`` then holds its
            accepted path. None for chains and in traces saved before schema version 5.
        features_from: for a drafter that reads the target's features (EAGLE), the sequence
            position (0-based over prompt and output) whose target feature the round's drafts grew
            from: the last position the target scored and kept, two before the first draft. None for
            other drafters, for a round that drafted nothing, and in traces saved before schema 7.
    """

    drafts: list[Draft]
    emitted_ids: list[int]
    final_token_id: int | None
    final_text: str | None
    final_kind: FinalKind | None
    final_prob: float | None
    draft_ms: float
    verify_ms: float
    end_ms: float
    final_top: list[TopToken] = field(default_factory=list)
    gamma: int | None = None
    tree: TreeRecord | None = None
    features_from: int | None = None

    @property
    def accepted_count(self) -> int:
        return sum(d.accepted for d in self.drafts)

    @property
    def drafted_count(self) -> int:
        """Drafted tokens: the chain's drafts, or every node of the tree."""
        return len(self.tree.nodes) if self.tree is not None else len(self.drafts)

    @property
    def rejected_count(self) -> int:
        """Tested drafts that failed: at most one in a chain, several siblings in a tree."""
        return self.tree.rejected if self.tree is not None else sum(d.verdict == "rejected" for d in self.drafts)

    @property
    def emitted_texts(self) -> list[str]:
        """The texts of ``emitted_ids``: the kept accepted drafts, then the final token if kept."""
        kept = len(self.emitted_ids) - (self.final_token_id is not None)
        return [d.text for d in self.drafts[:kept]] + (
            [self.final_text or ""] if self.final_token_id is not None else []
        )


@dataclass
class Trace:
    """A whole generation (batch of one).

    Attributes:
        mode: "speculative" or "autoregressive".
        prompt_ids: the prompt's token ids.
        output_ids: generated token ids, prompt excluded, stopped at the first EOS (kept) and
            at max_new_tokens.
        output_text: the decoded output ("" when no tokenizer was given).
        rounds: one Round per draft-verify round (per token for the baseline).
        stop_reason: "eos" or "max_new_tokens".
        prefill_ms: time of the prompt pass(es), in ms; included in total_ms.
        total_ms: wall time from the call's start to its last token, in ms.
        settings: gamma, sampling, seed, max_new_tokens, eos_token_id, device, dtype, models.
    """

    mode: Literal["speculative", "autoregressive"]
    prompt_ids: list[int]
    prompt_text: str = ""
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    rounds: list[Round] = field(default_factory=list)
    stop_reason: str | None = None
    prefill_ms: float = 0.0
    total_ms: float = 0.0
    settings: dict = field(default_factory=dict)

    # Totals, derived from the rounds so they can never disagree with them.
    @property
    def has_tree(self) -> bool:
        """Whether some round drafted a token tree (the run's predictions are then a tree's)."""
        return any(r.tree is not None for r in self.rounds)

    @property
    def drafted(self) -> int:
        return sum(r.drafted_count for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted_count for r in self.rounds)

    @property
    def rejected(self) -> int:
        """Drafts that were tested and failed: at most one per chain round, one per sibling in a tree."""
        return sum(r.rejected_count for r in self.rounds)

    @property
    def acceptance_rate(self) -> float | None:
        """Draft acceptance rate: accepted drafts / drafted tokens (discarded drafts counted);
        None when nothing was drafted."""
        return metrics.draft_acceptance_rate(self.accepted, self.drafted)

    @property
    def alpha(self) -> float | None:
        """Leviathan et al.'s alpha estimated from the verdicts: accepted / (accepted + rejected),
        the share of tested drafts that were accepted (Sec. 3.1); None when nothing was tested."""
        return metrics.alpha(self.accepted, self.rejected)

    @property
    def mean_beta(self) -> float | None:
        """Mean of beta over the tested drafts (accepted + rejected; the denominator of alpha).

        A tested draft is accepted with probability beta at its position, so this estimates the
        same alpha as accepted / (accepted + rejected), with less variance (no coin flips).
        Discarded drafts are left out: their context follows a rejected draft, off the output's
        path, and the target agrees less there. None without beta (traces before schema 3).
        """
        return metrics.mean(self.tested_betas)

    @property
    def alpha_chance_sd(self) -> float | None:
        """How far alpha falls from ``mean_beta`` by chance alone: one standard deviation of their difference,
        sqrt(sum of beta (1 - beta)) / N over the N tested drafts that recorded beta.

        Given the contexts the run met, each tested draft is accepted with probability beta there
        (Leviathan et al. 2023, Def. 3.1), so alpha - mean beta is a mean of N zero-mean coin flips of
        variance beta (1 - beta) each. 0 under greedy decoding (each test is certain: beta is 0 or 1). None
        without beta."""
        betas = self.tested_betas
        if not betas:
            return None
        return math.sqrt(sum(b * (1 - b) for b in betas)) / len(betas)

    @property
    def tested_betas(self) -> list[float]:
        """beta at each tested draft (accepted or rejected) that recorded one."""
        return [d.beta for r in self.rounds for d in r.drafts if d.verdict != "discarded" and d.beta is not None]

    @property
    def mean_tokens_per_round(self) -> float | None:
        """Emitted tokens / rounds, the correction or bonus token included."""
        return metrics.tokens_per_round(len(self.output_ids), len(self.rounds))

    @property
    def target_forward_passes(self) -> int:
        """Target forward passes after the prompt prefill: one per round."""
        return len(self.rounds)

    @property
    def drafter_forward_passes(self) -> int:
        """Drafter forward passes after the prompt prefill: one per drafted token for a drafter
        model or early exit, none for prompt lookup (it copies, with no model); a token tree's
        rounds count the passes they recorded (one per expanded depth, not one per node)."""
        if self.rounds and all(r.tree is not None and r.tree.drafter_passes is not None for r in self.rounds):
            return sum(r.tree.drafter_passes for r in self.rounds)
        drafter = self.settings.get("drafter")
        return metrics.drafter_passes(drafter.get("kind") if isinstance(drafter, dict) else None, self.drafted)

    @property
    def tokens_per_second(self) -> float | None:
        """Generated tokens / total wall time (prefill included), in tokens/s."""
        return metrics.tokens_per_second(len(self.output_ids), self.total_ms)

    @property
    def draft_ms(self) -> float:
        return sum(r.draft_ms for r in self.rounds)

    @property
    def verify_ms(self) -> float:
        return sum(r.verify_ms for r in self.rounds)

    def to_dict(self) -> dict:
        """A JSON-ready dict: the fields above, every round, and the derived totals."""
        d = asdict(self)
        d["schema_version"] = SCHEMA_VERSION
        for r_dict, r in zip(d["rounds"], self.rounds):
            for d_dict, dr in zip(r_dict["drafts"], r.drafts):
                d_dict["accepted"] = dr.accepted
        d.update(
            drafted=self.drafted,
            accepted=self.accepted,
            rejected=self.rejected,
            acceptance_rate=self.acceptance_rate,
            alpha=self.alpha,
            mean_beta=self.mean_beta,
            mean_tokens_per_round=self.mean_tokens_per_round,
            target_forward_passes=self.target_forward_passes,
            drafter_forward_passes=self.drafter_forward_passes,
            tokens_per_second=self.tokens_per_second,
        )
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "") -> "Trace":
        """Rebuild a Trace from ``to_dict`` output, validated field by field against the
        dataclasses above (pydantic); derived totals in ``d`` are ignored and recomputed.

        Then every field is checked to its meaning and the counts are bounded
        (``specviz.trace.validation``): a trace from a file is data from outside. ``where``: the trace's
        field in a recording ("speculative", "baseline"), for the schema version's message.

        Raises:
            ValueError: ``d`` is not a trace: a field is missing or has the wrong type, a
                verdict or kind is unknown, the schema version is newer than this code, or a
                value is out of range or inconsistent (the message names the field).
        """
        if not isinstance(d, dict):
            raise ValueError(f"not a specviz trace: expected a JSON object, got {type(d).__name__}")
        validation.check_schema_version(
            d.get("schema_version", 1), f"{where}.schema_version" if where else "schema_version", SCHEMA_VERSION
        )
        validation.check_structure(d)
        validation.check_depth(d)
        return validation.check_trace(validate(Trace, renamed_rules(d), "trace"))


@functools.cache
def _adapter(kind: type):
    import pydantic

    return pydantic.TypeAdapter(kind)


def validate(kind: type, data, what: str):
    """``data`` (parsed JSON) as the dataclass ``kind``, checked field by field with pydantic.

    Raises:
        ValueError: naming the first bad field and how many there are, as "not a specviz <what>: ...".
    """
    import pydantic

    try:
        return _adapter(kind).validate_python(data)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        # never a file's own markup
        where = ".".join(str(x) if re.fullmatch(r"[A-Za-z0-9_-]{1,40}", str(x)) else "?" for x in first["loc"])
        raise ValueError(
            f"not a specviz {what}: {where}: {first['msg']} ({e.error_count()} problem(s) in all)"
        ) from None


def json_schema() -> dict:
    """The JSON Schema of a saved trace (derived totals are extra, informative keys)."""
    return _adapter(Trace).json_schema()
