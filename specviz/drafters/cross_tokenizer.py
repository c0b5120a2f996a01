"""A drafter whose tokenizer differs from the target's, still exact.

Two schemes, both through the ordinary acceptance rule u < min(1, p/q) and residual
norm(max(0, p - q)) (Leviathan et al. 2023, Appendix A.1), which keeps the output exactly the
target's for any q that is the distribution each draft was really drawn from:

- **Token-level intersection** (``scheme="intersection"``; Timor et al., ICML 2025, "Accelerating
  LLM inference with lossless speculative decoding algorithms for heterogeneous vocabularies";
  transformers' sampled ``assistant_tokenizer`` path since 4.50). The shared vocabulary is the set
  of token strings both vocabularies hold. The drafter's logits are kept at those tokens (-inf
  elsewhere) and moved to the target's ids; the run's sampling processors then give q, a
  distribution over target tokens that is 0 outside the shared vocabulary and renormalised inside
  it. Each draft is drawn from that q, so the rule keeps the output exact at every sampling setting.
  What the drafter put outside the shared vocabulary is lost: ``shared_mass`` reports it per draft.
- **String level** (``scheme="string"``; transformers' greedy ``assistant_tokenizer`` path since
  4.46, "universal assisted decoding"). The drafter continues the text greedily in its own tokens;
  the text is re-encoded with the target's tokenizer and the target tokens that follow the settled
  ones are the drafts. They are a deterministic function of the sequence, so q is one-hot at each
  (as for prompt lookup): the rule then accepts a draft with probability p(x) and is exact at any
  temperature too, but the drafter's confidence is thrown away, so under sampling it accepts less
  than the intersection; it is the scheme for greedy decoding.

The drafter reads the settled sequence as text: each round the target's tokens are decoded and
re-encoded with the drafter's tokenizer, and its KV cache is kept up to the longest common prefix
with what it held (``_sync``). Decoding is ``skip_special_tokens=False``: a chat template's markers
reach the drafter as text unless its tokenizer knows them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from specviz.engine.drafter import Drafter, DraftRequest, Proposal
from specviz.engine.runner import ModelRunner
from specviz.engine.sampling import contexts

SCHEMES = ("intersection", "string")
MIN_SHARED = 0.1  # the smallest fraction of the drafter's vocabulary the target must share for the pair to be offered
UNNORMALISED = "unnormalised"  # the lab's planted fault: q restricted to the shared vocabulary, not renormalised
STRING_WINDOW = 8  # settled target tokens re-encoded with the string-level drafts, to find where they begin


class CrossTokenizerError(ValueError):
    """A drafter/target pair whose vocabularies cannot serve token-level intersection."""


@dataclass(frozen=True)
class SharedVocabulary:
    """Where two vocabularies meet: the token strings both hold.

    Attributes:
        drafter_ids, target_ids: (S,) LongTensors on the CPU, row i the same string in each.
        target_size, drafter_size: the vocabularies' sizes (``len(tokenizer)``).
    """

    drafter_ids: torch.Tensor
    target_ids: torch.Tensor
    target_size: int
    drafter_size: int

    @property
    def size(self) -> int:
        return int(self.target_ids.numel())

    @property
    def fraction(self) -> float:
        """Shared tokens / the drafter's vocabulary size: the share of what the drafter can say
        that it may still draft (a small drafter's vocabulary is usually the smaller)."""
        return self.size / max(1, self.drafter_size)


def shared_vocabulary(drafter_tokenizer, target_tokenizer, min_fraction: float = MIN_SHARED) -> SharedVocabulary:
    """The token strings both tokenizers hold (``get_vocab`` keys, compared exactly), with their ids.

    A string special in both (the same end-of-text marker, say) is shared; an ordinary token of
    both is shared. Special means named by the tokenizer or added as a special token (``_specials``).

    Raises:
        CrossTokenizerError: no shared tokens; fewer than ``min_fraction`` of the drafter's
            vocabulary shared (the message gives the fraction); a string that is a special token
            of one tokenizer and ordinary text to the other (its meaning differs across the pair).
    """
    d_vocab, t_vocab = drafter_tokenizer.get_vocab(), target_tokenizer.get_vocab()
    common = sorted(set(d_vocab) & set(t_vocab), key=lambda s: t_vocab[s])
    if not common:
        raise CrossTokenizerError(
            "the drafter's and the target's vocabularies share no token string: token-level intersection "
            "has nothing to draft (a tokenizer that marks spaces differently, such as ▁ against Ġ, shares none)"
        )
    d_special, t_special = _specials(drafter_tokenizer), _specials(target_tokenizer)
    differing = [s for s in common if (s in d_special) != (s in t_special)]
    if differing:
        named = ", ".join(repr(s) for s in differing[:3])
        raise CrossTokenizerError(
            f"special tokens differ: {named} {'is' if len(differing) == 1 else 'are'} special to one "
            f"tokenizer and ordinary text to the other ({len(differing)} such strings); choose a pair "
            "whose special tokens agree"
        )
    t_size, d_size = len(target_tokenizer), len(drafter_tokenizer)
    fraction = len(common) / max(1, d_size)
    if fraction < min_fraction:
        raise CrossTokenizerError(
            f"the vocabularies share {len(common)} of the drafter's {d_size} tokens ({fraction:.1%}), "
            f"below the {min_fraction:.0%} token-level intersection needs to draft usefully"
        )
    return SharedVocabulary(
        drafter_ids=torch.tensor([d_vocab[s] for s in common], dtype=torch.long),
        target_ids=torch.tensor([t_vocab[s] for s in common], dtype=torch.long),
        target_size=t_size,
        drafter_size=d_size,
    )


def _specials(tokenizer) -> set[str]:
    """The tokenizer's special tokens: those it names (bos, eos, ...) and every added token marked special
    (a chat marker such as ``<|im_start|>`` may be only the latter)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_tokens) | {t.content for t in added.values() if getattr(t, "special", False)}


def _text(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) if text else []


class CrossTokenizerDrafter(Drafter):
    """Drafts with a causal LM whose tokenizer differs from the target's.

    Args:
        model: a transformers causal LM on the target's device, in eval mode.
        drafter_tokenizer, target_tokenizer: the two tokenizers.
        scheme: "intersection" (exact at every sampling setting, the drafter's q kept over the
            shared vocabulary) or "string" (greedy drafting re-encoded through text, one-hot q).
        min_fraction: as ``shared_vocabulary``.
        fault: None, or ``UNNORMALISED`` (the lab's planted fault: each draft is drawn from the
            renormalised q but reported with q restricted and not renormalised, so the ratio
            p/q is inflated by 1 / shared mass).

    Raises:
        ValueError: an unknown scheme or fault.
        CrossTokenizerError: as ``shared_vocabulary``.

    Under intersection each Proposal carries, per draft, the drafter's own token id and the mass
    its distribution put inside the shared vocabulary (``own_tokens``, ``shared_mass``; the trace
    keeps them in each Draft), as ``last_drafts`` does after each ``propose``; the string scheme
    leaves them None (its drafts are not the drafter's tokens one for one).
    """

    kind = "cross-tokenizer"

    def __init__(
        self,
        model,
        drafter_tokenizer,
        target_tokenizer,
        scheme: str = "intersection",
        min_fraction: float = MIN_SHARED,
        fault: str | None = None,
    ):
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
        if fault not in (None, UNNORMALISED):
            raise ValueError(f"fault must be None or {UNNORMALISED!r}, got {fault!r}")
        self.model, self.models = model, (model,)
        self.drafter_tokenizer, self.target_tokenizer = drafter_tokenizer, target_tokenizer
        self.scheme, self.fault = scheme, fault
        self.shared = shared_vocabulary(drafter_tokenizer, target_tokenizer, min_fraction)
        self.runner: ModelRunner | None = None
        self.last_drafts: list[tuple[int, float | None]] = []

    @property
    def passes(self) -> int:
        return self.runner.passes if self.runner is not None else 0

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "scheme": self.scheme,
            "shared_tokens": self.shared.size,
            "shared_fraction": round(self.shared.fraction, 4),
        }

    def fork(self) -> "CrossTokenizerDrafter":
        twin = super().fork()
        twin.runner = None
        return twin

    # ---- the drafter's own sequence ---------------------------------------------------------

    def start(self, seq: torch.Tensor, n: int, vocab: int, cached: str) -> None:
        device = seq.device
        self.vocab = vocab
        keep = self.shared.target_ids < vocab  # shared tokens inside the run's vocabulary
        self._t_cols = self.shared.target_ids[keep].to(device)
        self._d_cols = self.shared.drafter_ids[keep].to(device)
        self._to_drafter = torch.full((vocab,), -1, dtype=torch.long)  # target id -> drafter id, host side
        self._to_drafter[self.shared.target_ids[keep]] = self.shared.drafter_ids[keep]
        self.runner = ModelRunner(self.model, self.shared.drafter_size, cached != "re-fed")
        self._dseq = torch.zeros(64, dtype=torch.long, device=device)
        self._held: list[int] = []  # drafter tokens in self._dseq, the cache a prefix of them
        self.last_drafts = []

    def _sync(self, ids: list[int]) -> int:
        """Make ``ids`` the drafter's sequence, its cache kept up to the common prefix (but the last
        token, which the next pass feeds to score what follows); its length."""
        common = 0
        for a, b in zip(ids, self._held):
            if a != b:
                break
            common += 1
        self.runner.rollback(min(common, len(ids) - 1))
        self._write(common, ids[common:])
        return len(ids)

    def _write(self, at: int, ids: list[int]) -> None:
        end = at + len(ids)
        if end > self._dseq.numel():
            grown = torch.zeros(max(end, 2 * self._dseq.numel()), dtype=torch.long, device=self._dseq.device)
            grown[: self._dseq.numel()] = self._dseq
            self._dseq = grown
        if ids:
            self._dseq[at:end] = torch.tensor(ids, dtype=torch.long, device=self._dseq.device)
        self._held = self._held[:at] + list(ids)

    def _context(self, request: DraftRequest) -> list[int]:
        """The settled sequence in the drafter's tokens: the target's decoded and re-encoded."""
        return _encode(self.drafter_tokenizer, _text(self.target_tokenizer, request.history))

    # ---- drafting ----------------------------------------------------------------------------

    def propose(self, request: DraftRequest) -> Proposal:
        self.last_drafts = []
        ids = self._context(request) if request.gamma > 0 else []
        if not ids:
            return Proposal(q=self.empty(request))
        m = self._sync(ids)
        return self._intersection(request, m) if self.scheme == "intersection" else self._string(request, m)

    def _intersection(self, r: DraftRequest, m: int) -> Proposal:
        """Each draft from q: the drafter's logits at the shared tokens, moved to target ids, processed."""
        seq, n = r.seq, r.n
        q_rows = []
        for i in range(r.gamma):
            own = self.runner.logits(self._dseq, m, 1).float()  # (1, drafter vocab)
            logits = torch.full((1, r.vocab), float("-inf"), device=own.device)
            logits[:, self._t_cols] = own[:, self._d_cols]
            ctx = contexts(seq, [n + i], r.vocab) if r.sampling.needs_context else None
            token, q = r.steps.draft_token(logits, r.sampling, r.warpers, r.gen, ctx)
            # The drafter's own distribution (its own context for a repetition penalty); greedy: its softmax.
            own_ctx = contexts(self._dseq, [m], self.shared.drafter_size) if r.sampling.needs_context else None
            own_probs = torch.softmax(own, dim=-1) if r.sampling.greedy else r.sampling.probs(own, r.warpers, own_ctx)
            mass = own_probs[0, self._d_cols].sum()
            if self.fault == UNNORMALISED:
                q = q * mass  # the fault: q restricted to the shared vocabulary, not renormalised
            q_rows.append(q)
            seq[n + i] = token[0]
            t = int(token[0])
            d = int(self._to_drafter[t])
            self.last_drafts.append((d, float(mass)))
            self._write(m, [d])
            m += 1
            if i + 1 >= r.gamma or not r.keep_drafting(torch.softmax(logits, dim=-1) if r.sampling.greedy else q):
                break
        return Proposal(
            q=torch.cat(q_rows),
            own_tokens=[d for d, _ in self.last_drafts],
            shared_mass=[m for _, m in self.last_drafts],
        )

    def _string(self, r: DraftRequest, m: int) -> Proposal:
        """Greedy drafter tokens, their text re-encoded with the target's tokenizer; one-hot q."""
        own_tokens = []
        for _ in range(r.gamma):
            d = int(self.runner.logits(self._dseq, m, 1)[0].argmax())
            own_tokens.append(d)
            self._write(m, [d])
            m += 1
        window = r.history[-STRING_WINDOW:]
        text = _text(self.target_tokenizer, window) + _text(self.drafter_tokenizer, own_tokens)
        again = _encode(self.target_tokenizer, text)
        if again[: len(window)] != window:  # the drafts' text re-tokenised the settled tokens: no drafts this round
            return Proposal(q=self.empty(r))
        drafts = list(itertools.takewhile(lambda t: t < r.vocab, again[len(window) : len(window) + r.gamma]))
        if not drafts:
            return Proposal(q=self.empty(r))
        tokens = torch.tensor(drafts, dtype=torch.long, device=r.seq.device)
        r.seq[r.n : r.n + len(drafts)] = tokens
        q = torch.zeros(len(drafts), r.vocab, device=tokens.device).scatter_(1, tokens[:, None], 1.0)  # one-hot
        return Proposal(q=q)
