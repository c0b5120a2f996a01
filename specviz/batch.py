"""Batched speculative decoding: several sequences drafted and verified together.

One drafter pass per draft step and one target pass per round serve every row of the batch;
each row accepts its own number of drafts, gets its own correction or bonus token, stops at its
own EOS or token budget, and leaves the batch when it is done.

**Raggedness, handled with attention masks and position ids.** After a round, the rows stand at
different lengths. The two caches stay rectangular: every pass appends the same number of
columns to every row, and a per-row 2-D attention mask says which columns hold the row's
settled tokens. Prompts are left-padded; the columns of drafts a row rejected (and of padding
when a row drafted fewer than the widest) are masked out instead of cropped, because
``DynamicCache.crop`` cuts every row at once. Each token's position id is its index in its own
row's sequence, so a masked column shifts nothing. The price is cache columns that are never
read again (at most gamma + 1 per round); a serving engine would use per-sequence paged blocks
instead (vLLM), which a teaching engine can do without. Finished rows leave the batch through
``DynamicCache.batch_select_indices``.

**Randomness.** Row b draws from its own ``torch.Generator`` seeded ``seed + b``, in the same
order as ``speculative_generate`` draws (drafts, then u, then the final tokens), so a row's
run is the single-sequence run of its prompt with that seed: the same tokens, up to float
rounding that padding and batch shapes change in the last bits.

**Gamma schedules are per row**: each row keeps its own schedule (its own acceptance history);
a round drafts as many steps as the row that wants the most, and a row that wants fewer stops
drafting early (its later draft slots are padding).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from specviz import rejection
from specviz.drafters import Drafter, EarlyExitDrafter, ModelDrafter, PromptLookupDrafter, as_drafter
from specviz.drafters.prompt_lookup import find_continuation
from specviz.engine import TOP_TOKENS, _Clock, _decoder, _eos_set, _extend, _judge, _round, _settings, _settle, _Transfer, _validate, _vocab_size
from specviz.sampling import Sampling, contexts
from specviz.schedules import GammaSchedule, make_schedule
from specviz.trace import MAX_GAMMA, Round, Trace

# The most rows one batch may hold (the page offers up to 8).
MAX_BATCH = 64


@dataclass
class BatchResult:
    """A finished batch.

    Attributes:
        traces: one Trace per prompt, in the prompts' order; each records its rows' rounds with
            the batch's draft and verify times (shared by every row of a round).
        target_passes: forward passes of the target (prefill included).
        drafter_passes: forward passes of a drafter model (0 for prompt lookup).
        positions: token positions the target processed, padding included.
        padded_positions: of those, the padding (left padding of prompts, draft slots of rows that
            drafted fewer than the widest row).
        total_ms: wall time of the whole batch, in ms.
        rounds: per round of the batch, the indices of the rows in it (rows leave as they finish).
    """

    traces: list[Trace]
    target_passes: int = 0
    drafter_passes: int = 0
    positions: int = 0
    padded_positions: int = 0
    total_ms: float = 0.0
    rounds: list[list[int]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Tokens generated over all rows."""
        return sum(len(t.output_ids) for t in self.traces)

    @property
    def tokens_per_s(self) -> float:
        """Tokens generated over all rows per second of the batch's wall time (tokens/s)."""
        return 1000.0 * self.tokens / self.total_ms if self.total_ms > 0 else 0.0

    @property
    def padding_share(self) -> float:
        """Padded positions / positions the target processed."""
        return self.padded_positions / self.positions if self.positions else 0.0

    def summary(self) -> dict:
        """Batch-level numbers as plain JSON values."""
        return {
            "rows": len(self.traces), "tokens": self.tokens, "total_ms": self.total_ms, "tokens_per_s": self.tokens_per_s,
            "target_passes": self.target_passes, "drafter_passes": self.drafter_passes,
            "positions": self.positions, "padded_positions": self.padded_positions, "padding_share": self.padding_share,
        }


class _BatchRunner:
    """One model's rectangular KV cache over the batch's rows, with a 2-D mask of the valid columns."""

    def __init__(self, model, vocab: int, rows: int):
        self.model = model
        self.vocab = vocab
        self.cache = DynamicCache(config=model.config)
        self.mask = torch.zeros(rows, 0, dtype=torch.long, device=model.device)
        self.passes = 0

    @property
    def columns(self) -> int:
        return self.mask.shape[1]

    def feed(self, tokens: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor, n_last: int) -> torch.Tensor:
        """Append (rows, k) tokens; return the logits of the last ``n_last`` columns, (rows, n_last, vocab)."""
        self.mask = torch.cat([self.mask, valid.long()], dim=1)
        out = self.model(input_ids=tokens, attention_mask=self.mask, position_ids=positions, past_key_values=self.cache,
                         use_cache=True, logits_to_keep=n_last)
        self.passes += 1
        return out.logits[:, :, : self.vocab]

    def forget(self, row: int, columns: Sequence[int]) -> None:
        """Mask out columns of one row (rejected drafts): never attended to again."""
        if columns:
            self.mask[row, list(columns)] = 0

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows (finished rows leave the batch)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        if self.cache.get_seq_length() > 0:
            self.cache.batch_select_indices(index)
        self.mask = self.mask[index]


def _left_padded(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(tokens, valid) of shape (len(rows), width), each row left-padded with 0, and the width."""
    width = max((len(r) for r in rows), default=0)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            tokens[i, width - len(r):] = torch.tensor(r)
            valid[i, width - len(r):] = True
    return tokens.to(device), valid.to(device), width


def _positions(starts: list[int], valid: torch.Tensor, left: bool) -> torch.Tensor:
    """Each column's position id: the token's index in its row's sequence (padding: clamped to 0)."""
    width = valid.shape[1]
    offsets = torch.arange(width, device=valid.device)[None, :]
    counts = valid.long().sum(dim=1, keepdim=True)
    start = torch.tensor(starts, device=valid.device)[:, None]
    pos = start + offsets - (width - counts if left else 0)
    return torch.where(valid, pos, 0)  # padding at 0: never past a model's position table


@dataclass
class _Row:
    """One sequence's state in the batch."""

    index: int
    trace: Trace
    seq: torch.Tensor
    history: list[int]
    n: int
    n_prompt: int
    gen: torch.Generator
    schedule: GammaSchedule | None = None
    drafter_fed: int = 0  # tokens of the sequence whose keys and values the drafter's cache holds
    # This round's drafting:
    allowed: int = 0  # the schedule's gamma for this round, within the token budget
    gamma: int = 0  # drafts actually proposed this round
    drafting: bool = False
    q_rows: list = field(default_factory=list)
    sources: list[int] | None = None
    draft_columns: list[int] = field(default_factory=list)


def _model_of(drafter: Drafter):
    if isinstance(drafter, (ModelDrafter, EarlyExitDrafter)):
        return drafter.model
    if isinstance(drafter, PromptLookupDrafter):
        return None
    raise TypeError(f"batched speculative decoding takes a drafter model, early exit or prompt lookup, got {type(drafter).__name__}")


def _check_prompts(prompts) -> list[list[int]]:
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    if len(prompts) > MAX_BATCH:
        raise ValueError(f"a batch holds at most {MAX_BATCH} prompts, got {len(prompts)}")
    return [[int(t) for t in p] for p in prompts]


def _validate_rows(prompts, models, vocab: int, max_new_tokens: int, sampling: Sampling) -> None:
    for b, prompt in enumerate(prompts):
        try:
            _validate(prompt, models, vocab, max_new_tokens, sampling)
        except ValueError as err:
            raise ValueError(f"prompts[{b}]: {err}") from None


def _start_rows(prompts, mode, sampling, seed, max_new_tokens, eos, models, tokenizer, device, gamma=None, extra=None) -> list[_Row]:
    rows = []
    for b, prompt in enumerate(prompts):
        settings = _settings(mode, sampling, seed + b, max_new_tokens, eos, models, gamma)
        settings.update(extra or {})
        settings["batch"] = {"rows": len(prompts), "row": b}
        trace = Trace(mode=mode, prompt_ids=list(prompt), prompt_text=tokenizer.decode(prompt) if tokenizer is not None else "",
                      settings=settings)
        seq = torch.zeros(len(prompt) + max_new_tokens + MAX_GAMMA + 1, dtype=torch.long, device=device)
        seq[: len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=device)
        rows.append(_Row(b, trace, seq, list(prompt), len(prompt), len(prompt),
                         torch.Generator(device=device).manual_seed(seed + b), drafter_fed=len(prompt) - 1))
    return rows


def _prefill(runner: _BatchRunner, rows: list[_Row]) -> None:
    """All but each prompt's last token, left-padded (the last is fed by the first pass)."""
    tokens, valid, width = _left_padded([r.history[:-1] for r in rows], runner.mask.device)
    if width:
        runner.feed(tokens, valid, _positions([0] * len(rows), valid, left=True), 1)


def speculative_generate_batch(
    prompts: Sequence[Sequence[int]],
    drafter,
    target,
    gamma: int = 4,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 64,
    eos_token_id: int | Iterable[int] | None = None,
    seed: int = 0,
    tokenizer=None,
    vocab_size: int | None = None,
    schedule: str = "constant",
) -> BatchResult:
    """Speculative sampling over a batch of prompts of different lengths.

    Args:
        prompts: 1..MAX_BATCH lists of token ids, each of length >= 1.
        drafter: a drafter model (causal LM or ``ModelDrafter``), an ``EarlyExitDrafter`` or a
            ``PromptLookupDrafter``.
        target, gamma, sampling, max_new_tokens, eos_token_id, tokenizer, vocab_size: as in
            ``specviz.engine.speculative_stream``, applied to every row.
        seed: row b draws from a generator seeded ``seed + b``.
        schedule: a gamma schedule name; each row runs its own (see the module docstring).

    Returns:
        A BatchResult: one Trace per prompt (row b is the run ``speculative_generate`` gives its
        prompt with seed ``seed + b``) and the batch's totals.

    Raises:
        ValueError: no prompts or more than MAX_BATCH, and whatever ``speculative_stream`` raises
            for a row's prompt or the settings.
        TypeError: a drafter kind the batch cannot run.
    """
    prompts = _check_prompts(prompts)
    drafter = as_drafter(drafter)
    draft_model = _model_of(drafter)
    models = (*drafter.models, target)
    vocab = _vocab_size(models, tokenizer, vocab_size)
    _validate_rows(prompts, models, vocab, max_new_tokens, sampling)
    schedules = [make_schedule(schedule, gamma) for _ in prompts]  # one per row; refuses an unknown name or gamma
    eos = _eos_set(eos_token_id)
    device = target.device
    decode = _decoder(tokenizer)
    warpers = sampling.warpers()
    top_k = min(TOP_TOKENS, vocab)
    extra = {"drafter": drafter.describe(), "gamma_schedule": schedules[0].describe()}
    rows = _start_rows(prompts, "speculative", sampling, seed, max_new_tokens, eos, models, tokenizer, device, gamma, extra)
    for row, row_schedule in zip(rows, schedules):
        row.schedule = row_schedule
    result = BatchResult(traces=[r.trace for r in rows])
    clock = _Clock(device)
    target_runner = _BatchRunner(target, vocab, len(rows))
    draft_runner = _BatchRunner(draft_model, vocab, len(rows)) if draft_model is not None else None

    with torch.inference_mode():
        _prefill(target_runner, rows)
        result.positions += target_runner.columns * len(rows)
        result.padded_positions += int((target_runner.mask == 0).sum())
        if draft_runner is not None:
            _prefill(draft_runner, rows)
        for r in rows:
            r.trace.prefill_ms = clock.since_start()

        active = list(rows)
        while active:
            t0 = clock.now()
            # 1. Draft, for every row at once.
            for r in active:
                r.allowed = r.gamma = min(r.schedule.next_gamma(), r.n_prompt + max_new_tokens - r.n)
                r.q_rows, r.sources, r.draft_columns = [], None, []
            if draft_runner is None:
                _lookup(active, drafter, vocab)
            else:
                _draft(active, draft_runner, sampling, warpers, vocab)
            t1 = clock.now()

            # 2. Verify: one target pass over every row's pending token and drafts (right-padded).
            # The drafts are copied on the device: no host round trip per row.
            width = max(r.gamma for r in active) + 1
            tokens = torch.zeros(len(active), width, dtype=torch.long, device=device)
            for i, r in enumerate(active):
                tokens[i, : r.gamma + 1] = r.seq[r.n - 1 : r.n + r.gamma]
            valid = torch.arange(width, device=device)[None, :] <= torch.tensor([r.gamma for r in active], device=device)[:, None]
            base = target_runner.columns
            logits = target_runner.feed(tokens, valid, _positions([r.n - 1 for r in active], valid, left=False), width)
            result.positions += width * len(active)
            result.padded_positions += int((~valid).sum())

            # 3-4. Accept and the final token, row by row, from each row's own generator.
            transfer = _Transfer()
            for i, r in enumerate(active):
                g = r.gamma
                ctx = contexts(r.seq, range(r.n, r.n + g + 1), vocab) if sampling.needs_context else None
                p_all = rejection.target_probs(logits[i, :g + 1], sampling, warpers, ctx)
                q_all = torch.cat(r.q_rows) if r.q_rows else torch.zeros(0, vocab, device=device)
                _judge(transfer, f"{i}.", r.seq[r.n : r.n + g], q_all, p_all, sampling, r.gen, top_k)
            host = transfer.fetch()
            t2 = clock.now()

            # 5. Each row settles, rolls back by masking, and records; finished rows leave.
            staying = []
            for i, r in enumerate(active):
                mine = {k.split(".", 1)[1]: v for k, v in host.items() if k.startswith(f"{i}.")}
                remaining = r.n_prompt + max_new_tokens - r.n
                draft_ids, n_acc, final, kind, emitted, keeps_final = _settle(mine, eos, remaining)
                # Target columns: the pending token, then drafts 1..g; those after the accepted ones go.
                target_runner.forget(i, [base + 1 + j for j in range(n_acc, r.gamma)])
                if draft_runner is not None:
                    # The drafter fed the pending token and drafts 1..g-1; keep the accepted ones.
                    draft_runner.forget(i, r.draft_columns[n_acc:])
                    r.drafter_fed = r.n + min(n_acc, len(r.draft_columns))
                r.seq[r.n + n_acc] = final
                r.n += len(emitted)
                r.history.extend(emitted)
                r.schedule.observe(r.gamma, n_acc, min(r.gamma, n_acc + 1), t1 - t0, t2 - t1)
                r.trace.rounds.append(_round(mine, draft_ids, n_acc, final, kind, keeps_final, emitted, r.sources,
                                             decode, top_k, r.allowed, t1 - t0, t2 - t1, clock.since_start()))
                if not _extend(r.trace, emitted, eos, max_new_tokens, clock, tokenizer):
                    staying.append(i)
            result.rounds.append([r.index for r in active])
            if len(staying) < len(active):
                target_runner.keep(staying)
                if draft_runner is not None:
                    draft_runner.keep(staying)
                active = [active[i] for i in staying]

    result.target_passes = target_runner.passes
    result.drafter_passes = draft_runner.passes if draft_runner is not None else 0
    result.total_ms = clock.since_start()
    return result


def _contexts(ends: list[tuple[torch.Tensor, int]], vocab: int) -> torch.Tensor:
    """Each row's context for a repetition penalty: (seq, end) pairs -> (rows, longest) padded with
    ``vocab`` (an id the penalty ignores), as ``specviz.sampling.contexts`` gives one row."""
    parts = [contexts(seq, [end], vocab)[0] for seq, end in ends]
    return torch.nn.utils.rnn.pad_sequence(parts, batch_first=True, padding_value=vocab)


def _lookup(active: list[_Row], drafter: PromptLookupDrafter, vocab: int) -> None:
    """Prompt lookup for each row: no model, so nothing is batched but the verify pass."""
    for r in active:
        found = find_continuation(r.history, drafter.max_ngram, drafter.min_ngram, r.gamma)
        copied = found[1] if found else []
        r.gamma = len(copied)
        r.sources = list(range(found[0], found[0] + len(copied))) if copied else []
        if copied:
            drafts = torch.tensor(copied, dtype=torch.long, device=r.seq.device)
            r.seq[r.n : r.n + len(copied)] = drafts
            r.q_rows = [torch.nn.functional.one_hot(drafts, vocab).float()]


def _draft(active: list[_Row], runner: _BatchRunner, sampling: Sampling, warpers, vocab: int) -> None:
    """Draft with a model, one pass per draft step over every row still drafting.

    The first pass feeds each row what its drafter cache lacks (the pending token, and the
    last draft of a round whose drafts were all accepted), left-padded; each later pass feeds
    every row's newest draft. A row whose gamma is reached, or whose confidence schedule says
    stop, rides along masked.
    """
    device = runner.mask.device
    missing = [r.history[r.drafter_fed:] for r in active]
    tokens, valid, _ = _left_padded(missing, device)
    logits = runner.feed(tokens, valid, _positions([r.drafter_fed for r in active], valid, left=True), 1)[:, -1]
    for r in active:
        r.drafting = r.gamma > 0
    step = 0
    while True:
        drafting = [i for i, r in enumerate(active) if r.drafting]
        rows = [active[i] for i in drafting]
        sub = logits[drafting]
        ctx = _contexts([(r.seq, r.n + step) for r in rows], vocab) if sampling.needs_context else None
        tokens, q = rejection.draft_token(sub, sampling, warpers, [r.gen for r in rows], ctx)
        # Greedy q is one-hot, which says nothing of confidence: the schedule reads the softmax then.
        sure = torch.softmax(sub.float(), dim=-1) if sampling.greedy else q
        for j, r in enumerate(rows):
            r.q_rows.append(q[j:j + 1])
            r.seq[r.n + step] = tokens[j]
            if step + 1 >= r.gamma or not r.schedule.keep_drafting(sure[j:j + 1]):
                r.gamma = step + 1
                r.drafting = False
        if not any(r.drafting for r in active):
            return
        feeding = torch.tensor([[r.drafting] for r in active], device=device)
        last = torch.stack([r.seq[r.n + step] for r in active])[:, None]
        column = runner.columns
        for r in active:
            if r.drafting:
                r.draft_columns.append(column)
        positions = torch.tensor([[r.n + step if r.drafting else 0] for r in active], device=device)
        logits = runner.feed(last * feeding, feeding, positions, 1)[:, -1]
        step += 1


def autoregressive_generate_batch(
    prompts: Sequence[Sequence[int]],
    target,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 64,
    eos_token_id: int | Iterable[int] | None = None,
    seed: int = 0,
    tokenizer=None,
    vocab_size: int | None = None,
) -> BatchResult:
    """The batched baseline: one target pass per step for every unfinished row.

    Arguments, returns and errors as ``speculative_generate_batch`` without drafter, gamma and
    schedule; row b is the run ``autoregressive_generate`` gives its prompt with seed ``seed + b``.
    """
    prompts = _check_prompts(prompts)
    models = (target,)
    vocab = _vocab_size(models, tokenizer, vocab_size)
    _validate_rows(prompts, models, vocab, max_new_tokens, sampling)
    eos = _eos_set(eos_token_id)
    device = target.device
    decode = _decoder(tokenizer)
    warpers = sampling.warpers()
    rows = _start_rows(prompts, "autoregressive", sampling, seed, max_new_tokens, eos, models, tokenizer, device)
    result = BatchResult(traces=[r.trace for r in rows])
    clock = _Clock(device)
    runner = _BatchRunner(target, vocab, len(rows))
    with torch.inference_mode():
        _prefill(runner, rows)
        result.positions += runner.columns * len(rows)
        result.padded_positions += int((runner.mask == 0).sum())
        for r in rows:
            r.trace.prefill_ms = clock.since_start()
        active = list(rows)
        while active:
            t0 = clock.now()
            pending = torch.stack([r.seq[r.n - 1] for r in active])[:, None]
            positions = torch.tensor([[r.n - 1] for r in active], device=device)
            logits = runner.feed(pending, torch.ones_like(pending, dtype=torch.bool), positions, 1)[:, -1]
            result.positions += len(active)
            ctx = _contexts([(r.seq, r.n) for r in active], vocab) if sampling.needs_context else None
            p = sampling.probs(logits, warpers, ctx)
            token = rejection.sample_rows(p, sampling.greedy, [r.gen for r in active])
            for i, r in enumerate(active):
                r.seq[r.n] = token[i]
            host = torch.cat([token.double(), p.gather(1, token[:, None])[:, 0].double(),
                              torch.isfinite(p).all(dim=-1).double()]).tolist()
            t1 = clock.now()
            staying = []
            for i, r in enumerate(active):
                token_id, prob, finite = int(host[i]), host[len(active) + i], host[2 * len(active) + i]
                if not finite:
                    raise ValueError("the target produced NaN or infinite probabilities; refusing to sample an invalid token")
                r.n += 1
                r.history.append(token_id)
                r.trace.rounds.append(Round(drafts=[], emitted_ids=[token_id], final_token_id=token_id,
                                            final_text=decode([token_id])[0], final_kind="target", final_prob=prob,
                                            draft_ms=0.0, verify_ms=t1 - t0, end_ms=clock.since_start()))
                if not _extend(r.trace, [token_id], eos, max_new_tokens, clock, tokenizer):
                    staying.append(i)
            result.rounds.append([r.index for r in active])
            if len(staying) < len(active):
                runner.keep(staying)
                active = [active[i] for i in staying]
    result.target_passes = runner.passes
    result.total_ms = clock.since_start()
    return result
