"""Batched speculative decoding: several sequences drafted and verified together.

One drafter pass per draft step and one target pass per round serve every row of the batch;
each row accepts its own number of drafts, gets its own correction or bonus token, stops at its
own EOS or token budget, and leaves the batch when it is done.

**Drafting goes through the Drafter interface** (``specviz.drafters``): ``start_batch``,
``propose_batch``, ``rollback_batch`` and ``keep_rows``. A drafter model drafts for every row in
one pass per draft step; prompt lookup, and any other Drafter, drafts row by row.

**Raggedness, handled with attention masks and position ids** (``specviz.engine.batch_runner``). After
a round, the rows stand at different lengths. The caches stay rectangular: every pass appends the
same number of columns to every row, and a per-row 2-D attention mask says which columns hold the
row's settled tokens. Prompts are left-padded; the columns of drafts a row rejected (and of
padding when a row drafted fewer than the widest) are masked out instead of cropped, because
``DynamicCache.crop`` cuts every row at once. Each token's position id is its index in its own
row's sequence, so a masked column shifts nothing. The price is cache columns that are never
read again (at most gamma + 1 per round); a serving engine would use per-sequence paged blocks
instead (vLLM), which a teaching engine can do without. Finished rows leave the batch. Models
with a sliding attention window are refused where masked columns could count against it.

**Drafters that read the target's features** (EAGLE, ``specviz.drafters.eagle``): the target's passes
keep their last hidden states, and each row's drafter is handed its own row's valid columns
(``observe_target_batch``); each row drafts through its own copy of the drafter.

**Randomness.** Row b draws from its own ``torch.Generator`` seeded ``seed + b`` (``specviz.engine.seeds``), in the same
order as ``speculative_generate`` draws (drafts, then u, then the final tokens), so a row's
run is the single-sequence run of its prompt with that seed: the same tokens, up to float
rounding that padding and batch shapes change in the last bits.

**Gamma schedules are per row**: each row keeps its own schedule (its own acceptance history);
a round drafts as many steps as the row that wants the most, and a row that wants fewer stops
drafting early (its later draft slots are padding).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field

import copy

import torch

from specviz.engine import rejection
from specviz.engine.batch_runner import BatchRunner, check_window, positions
from specviz.engine.drafter import DraftRequest
from specviz.engine.rounds import (
    TOP_TOKENS,
    Clock,
    RoundTimes,
    RunOptions,
    RunSetup,
    Transfer,
    extend_trace,
    new_trace,
    pack_chain_round,
    round_outcome,
    round_record,
    run_settings,
    set_up,
    validate_inputs,
)
from specviz.engine.sampling import Sampling, contexts, row_contexts
from specviz.engine.schedules import GammaSchedule, make_schedule
from specviz.engine.seeds import check_seed, generator
from specviz.engine.stopping import StopCheck, asked, mark_stopped, run_steps
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
        drafter_passes: forward passes of the drafter's models (prefill included; 0 for prompt lookup).
        drafter_prefill_passes: of those, the prompts' prefill.
        draft_ms, verify_ms: drafting and verifying time summed over the batch's rounds, in ms
            (each round counted once, however many rows it served).
        positions: token positions the target processed, padding included.
        padded_positions: of those, the padding (left padding of prompts, draft slots of rows that
            drafted fewer than the widest row).
        total_ms: wall time of the whole batch, in ms.
        rounds: per round of the batch, the indices of the rows in it (rows leave as they finish).
        stopped: the caller's stop check ended the batch early (``specviz.engine.stopping``): the rows
            still in it then have ``stop_reason == "stopped"`` and fewer tokens than asked.
    """

    traces: list[Trace]
    target_passes: int = 0
    drafter_passes: int = 0
    drafter_prefill_passes: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    positions: int = 0
    padded_positions: int = 0
    total_ms: float = 0.0
    rounds: list[list[int]] = field(default_factory=list)
    stopped: bool = False

    @property
    def tokens(self) -> int:
        """Tokens generated over all rows."""
        return sum(len(t.output_ids) for t in self.traces)

    @property
    def tokens_per_s(self) -> float:
        """Tokens generated over all rows per second of the batch's wall time (tokens/s)."""
        return 1000.0 * self.tokens / self.total_ms if self.total_ms > 0 else 0.0

    @property
    def drafter_step_passes(self) -> int:
        """Drafter forward passes made while drafting in rounds (prefill excluded)."""
        return self.drafter_passes - self.drafter_prefill_passes

    @property
    def padding_share(self) -> float:
        """Padded positions / positions the target processed."""
        return self.padded_positions / self.positions if self.positions else 0.0

    def summary(self) -> dict:
        """Batch-level numbers as plain JSON values."""
        return {
            "rows": len(self.traces),
            "tokens": self.tokens,
            "total_ms": self.total_ms,
            "tokens_per_s": self.tokens_per_s,
            "target_passes": self.target_passes,
            "drafter_passes": self.drafter_passes,
            "positions": self.positions,
            "padded_positions": self.padded_positions,
            "padding_share": self.padding_share,
        }


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
    allowed: int = 0  # this round's gamma from the schedule, within the token budget


def _check_prompts(prompts) -> list[list[int]]:
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    if len(prompts) > MAX_BATCH:
        raise ValueError(f"a batch holds at most {MAX_BATCH} prompts, got {len(prompts)}")
    return [[int(t) for t in p] for p in prompts]


def _validate_rows(prompts, run: RunSetup) -> None:
    for b, prompt in enumerate(prompts):
        try:
            validate_inputs(prompt, run.models, run.vocab, run.options.max_new_tokens)
        except ValueError as err:
            raise ValueError(f"prompts[{b}]: {err}") from None


def _start_rows(prompts, run: RunSetup, mode: str, gamma: int | None = None, **extra) -> list[_Row]:
    """Each prompt's row: its trace (the run's settings, its own seed ``seed + b``, ``extra``), its buffer with room
    for the tokens and a round's drafts, and its generator."""
    seed, device = run.options.seed, run.device
    check_seed(seed, len(prompts))
    rows = []
    for b, prompt in enumerate(prompts):
        settings = run_settings(run, mode, seed + b, gamma)
        settings.update(extra)
        settings["batch"] = {"rows": len(prompts), "row": b}
        trace = new_trace(mode, prompt, run.options.tokenizer, settings)
        seq = torch.zeros(len(prompt) + run.options.max_new_tokens + MAX_GAMMA + 1, dtype=torch.long, device=device)
        seq[: len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=device)
        rows.append(_Row(b, trace, seq, list(prompt), len(prompt), len(prompt), generator(seed + b, device)))
    return rows


def _prefill_steps(runner: BatchRunner, rows: list[_Row], result: BatchResult, clock: Clock):
    """All but each prompt's last token, left-padded (the last is fed by the first pass), in passes of at most
    PREFILL_CHUNK tokens over all rows (``BatchRunner.prefill_passes``), each inside inference mode, None yielded
    between them (``Clock.hand_over``); the positions and padding it fed are counted in ``result``."""
    passes = runner.prefill_passes([r.seq for r in rows], [r.n - 1 for r in rows])
    while True:
        with torch.inference_mode():
            done = next(passes, _DONE) is _DONE
        if done:
            break
        yield from clock.hand_over(None)
    result.positions += runner.columns * len(rows)
    result.padded_positions += int((runner.mask == 0).sum())


_DONE = object()


def _stopped(active: list[_Row], result: BatchResult, stop: StopCheck | None, clock: Clock, run: RunSetup) -> bool:
    """Whether ``stop`` asks the batch to end before its next round; if so, the rows still in it
    are marked stopped (their text decoded) and so is ``result``."""
    if not active or not asked(stop):
        return False
    for r in active:
        mark_stopped(r.trace, clock.since_start(), run.options.tokenizer)
    result.stopped = True
    return True


def speculative_batch_steps(
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
    schedule: str | GammaSchedule = "constant",
    steps: rejection.Steps = rejection.EXACT,
    stop: StopCheck | None = None,
) -> Generator[None, None, BatchResult]:
    """Speculative sampling over a batch of prompts of different lengths, as steps: a generator that yields None
    after each round (a server's device thread runs other jobs' steps there; the time until the next round is asked
    for is not the batch's, ``Clock.hand_over``) and returns the BatchResult. ``speculative_generate_batch`` runs it
    to its end.

    Args:
        prompts: 1..MAX_BATCH lists of token ids, each of length >= 1.
        drafter: any ``specviz.drafters.Drafter`` (drafting through its batch verbs), or a
            transformers causal LM (taken as a drafter model).
        target, gamma, sampling, max_new_tokens, eos_token_id, tokenizer, vocab_size: as in
            ``specviz.engine.chain.speculative_stream``, applied to every row.
        seed: row b draws from a generator seeded ``seed + b``.
        schedule: a gamma schedule name, or a fresh GammaSchedule (a confidence threshold, say)
            that each row copies; each row runs its own (see the module docstring).
        steps: the round's steps, as in ``specviz.engine.speculative_stream``.
        stop: asked before each round (``specviz.engine.stopping``); when it answers True the batch ends
            there, its unfinished rows marked "stopped" and ``BatchResult.stopped`` set.

    Returns (as the generator's value):
        A BatchResult: one Trace per prompt (row b is the run ``speculative_generate`` gives its
        prompt with seed ``seed + b``) and the batch's totals.

    Raises:
        ValueError: no prompts or more than MAX_BATCH, a model whose sliding attention window the
            batch's cache could outgrow, and whatever ``speculative_stream`` raises for a row's
            prompt or the settings.
        TypeError: a drafter that is neither a Drafter nor a causal LM.
    """
    prompts = _check_prompts(prompts)
    options = RunOptions(sampling=sampling, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, seed=seed,
                         tokenizer=tokenizer, vocab_size=vocab_size)
    run = set_up(drafter, target, options)
    drafter, vocab, device, warpers = run.drafter, run.vocab, run.device, run.warpers
    _validate_rows(prompts, run)
    template = schedule if isinstance(schedule, GammaSchedule) else make_schedule(schedule, gamma)  # refuses a bad one
    # Each round adds at most (the most drafts a round may propose) + 1 columns to the caches.
    check_window(run.models, max(len(p) for p in prompts) + max_new_tokens * (template.most + 1))
    top_k = min(TOP_TOKENS, vocab)
    rows = _start_rows(prompts, run, "speculative", gamma, drafter=drafter.describe(),
                       gamma_schedule=template.describe())
    for row in rows:
        row.schedule = copy.deepcopy(template)
    result = BatchResult(traces=[r.trace for r in rows])
    clock = Clock(device)
    # An EAGLE drafter reads the target's features of each row's positions from the target's passes.
    reads_features = drafter.reads_target_features
    target_runner = BatchRunner(target, vocab, len(rows), keep_features=reads_features)

    yield from _prefill_steps(target_runner, rows, result, clock)
    with torch.inference_mode():
        drafter.start_batch([r.seq for r in rows], [r.n - 1 for r in rows], vocab)
        if reads_features and target_runner.features is not None:  # each row's prompt, left-padded
            valid = target_runner.mask.bool()
            drafter.observe_target_batch([(0, target_runner.features[i][valid[i]]) for i in range(len(rows))])
        result.drafter_prefill_passes = drafter.passes
        for r in rows:
            r.trace.prefill_ms = clock.since_start()

    active = list(rows)
    while active and not _stopped(active, result, stop, clock, run):
        with torch.inference_mode():  # per round, left before each yield (``Clock.hand_over``)
            t0 = clock.mark()
            # 1. Draft, for every row at once: up to each row's allowed gamma into its seq.
            for r in active:
                r.allowed = min(r.schedule.next_gamma(), r.n_prompt + max_new_tokens - r.n)
            proposals = drafter.propose_batch([
                DraftRequest(seq=r.seq, n=r.n, gamma=r.allowed, history=r.history, sampling=sampling, warpers=warpers,
                             gen=r.gen, vocab=vocab, keep_drafting=r.schedule.keep_drafting, steps=steps)
                for r in active
            ])
            t1 = clock.mark()

            # 2. Verify: one target pass over every row's pending token and drafts (right-padded).
            # The drafts are copied on the device: no host round trip per row.
            counts = [p.count for p in proposals]
            width = max(counts) + 1
            tokens = torch.zeros(len(active), width, dtype=torch.long, device=device)
            for i, r in enumerate(active):
                tokens[i, : counts[i] + 1] = r.seq[r.n - 1 : r.n + counts[i]]
            valid = torch.arange(width, device=device)[None, :] <= torch.tensor(counts, device=device)[:, None]
            base = target_runner.columns
            logits = target_runner.feed(tokens, valid, positions([r.n - 1 for r in active], valid, left=False), width)
            result.positions += width * len(active)
            result.padded_positions += int((~valid).sum())
            if reads_features:  # row i's pending token and drafts, right-padded
                drafter.observe_target_batch(
                    [(r.n - 1, target_runner.features[i, : counts[i] + 1]) for i, r in enumerate(active)]
                )

            # 3-4. Row by row, from each row's own generator: accept draft i when u_i < min(1, p_i(x_i) / q_i(x_i));
            # the final token a correction from norm(max(0, p_i - q_i)) at each draft or the bonus from p after the
            # last (u first, then these: the order the single-sequence loop draws in).
            transfer = Transfer()
            for i, (r, g) in enumerate(zip(active, counts)):
                ctx = contexts(r.seq, range(r.n, r.n + g + 1), vocab) if sampling.needs_context else None
                p_all = steps.target_probs(logits[i, : g + 1], sampling, warpers, ctx)
                drafts, q_all = r.seq[r.n : r.n + g], proposals[i].q
                u = torch.rand(g, generator=r.gen, device=device)
                q_x, p_x = q_all.gather(1, drafts[:, None])[:, 0], p_all[:g].gather(1, drafts[:, None])[:, 0]
                accepted = steps.accept(u, q_x, p_x)
                candidates = torch.cat([steps.residual(p_all[:g], q_all), p_all[g:]])  # (g+1, V)
                finals = rejection.sample_rows(candidates, sampling.greedy, r.gen)
                pack_chain_round(transfer, f"{i}.", drafts=drafts, q_all=q_all, p_all=p_all, q_x=q_x, p_x=p_x, u=u,
                                 accepted=accepted,
                                 candidates=candidates, finals=finals, top_k=top_k)
            host = transfer.fetch()
            t2 = clock.mark()
            draft_ms, verify_ms = clock.ms(t0, t1), clock.ms(t1, t2)  # the round's, shared by its rows
            result.draft_ms += draft_ms
            result.verify_ms += verify_ms

            # 5. Each row settles, rolls back by masking, and records; finished rows leave.
            staying = []
            for i, (r, g) in enumerate(zip(active, counts)):
                mine = {k.split(".", 1)[1]: v for k, v in host.items() if k.startswith(f"{i}.")}
                outcome = round_outcome(mine, run.eos, r.n_prompt + max_new_tokens - r.n)
                # Target columns: the pending token, then drafts 1..g; those after the accepted ones go.
                target_runner.forget(i, [base + 1 + j for j in range(outcome.accepted, g)])
                r.seq[r.n + outcome.accepted] = outcome.final
                r.n += len(outcome.emitted)
                r.history.extend(outcome.emitted)
                times = RoundTimes(draft_ms, verify_ms, clock.since_start())
                r.schedule.observe(g, outcome.accepted, min(g, outcome.accepted + 1), draft_ms, verify_ms)
                r.trace.rounds.append(round_record(mine, outcome, proposals[i], decode=run.decode, top_k=top_k,
                                                   gamma=r.allowed, times=times))
                if not extend_trace(r.trace, outcome.emitted, run, clock):
                    staying.append(i)
            # Both sides keep all but each row's newest token, which is fed next round.
            drafter.rollback_batch([r.n - 1 for r in active])
            result.rounds.append([r.index for r in active])
            if len(staying) < len(active):
                target_runner.keep(staying)
                drafter.keep_rows(staying)
                active = [active[i] for i in staying]
        yield from clock.hand_over(None)  # the time until the next round is asked for is not the batch's
    result.target_passes = target_runner.passes
    result.drafter_passes = drafter.passes
    result.total_ms = clock.since_start()
    return result


def speculative_generate_batch(prompts: Sequence[Sequence[int]], drafter, target, **kwargs) -> BatchResult:
    """``speculative_batch_steps`` run to its end: its BatchResult (keywords and errors as there)."""
    return run_steps(speculative_batch_steps(prompts, drafter, target, **kwargs))


def autoregressive_batch_steps(
    prompts: Sequence[Sequence[int]],
    target,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 64,
    eos_token_id: int | Iterable[int] | None = None,
    seed: int = 0,
    tokenizer=None,
    vocab_size: int | None = None,
    stop: StopCheck | None = None,
) -> Generator[None, None, BatchResult]:
    """The batched baseline: one target pass per step for every unfinished row, as steps (None yielded after each).

    Arguments, yields, returns and errors as ``speculative_batch_steps`` (``stop`` asked before each step)
    without drafter, gamma and schedule; row b is the run ``autoregressive_generate`` gives its prompt with seed ``seed
    + b``. ``autoregressive_generate_batch`` runs it to its end.
    """
    prompts = _check_prompts(prompts)
    options = RunOptions(sampling=sampling, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, seed=seed,
                         tokenizer=tokenizer, vocab_size=vocab_size)
    run = set_up(None, target, options)
    vocab, device, decode, warpers = run.vocab, run.device, run.decode, run.warpers
    _validate_rows(prompts, run)
    rows = _start_rows(prompts, run, "autoregressive")
    result = BatchResult(traces=[r.trace for r in rows])
    clock = Clock(device)
    runner = BatchRunner(target, vocab, len(rows))
    yield from _prefill_steps(runner, rows, result, clock)
    for r in rows:
        r.trace.prefill_ms = clock.since_start()

    active = list(rows)
    while active and not _stopped(active, result, stop, clock, run):
        with torch.inference_mode():  # per round, left before each yield (``Clock.hand_over``)
            t0 = clock.mark()
            pending = torch.stack([r.seq[r.n - 1] for r in active])[:, None]
            positions = torch.tensor([[r.n - 1] for r in active], device=device)
            logits = runner.feed(pending, torch.ones_like(pending, dtype=torch.bool), positions, 1)[:, -1]
            result.positions += len(active)
            ctx = row_contexts([(r.seq, r.n) for r in active], vocab) if sampling.needs_context else None
            p = sampling.probs(logits, warpers, ctx)
            token = rejection.sample_rows(p, sampling.greedy, [r.gen for r in active])
            for i, r in enumerate(active):
                r.seq[r.n] = token[i]
            host = torch.cat(
                [token.double(), p.gather(1, token[:, None])[:, 0].double(), torch.isfinite(p).all(dim=-1).double()]
            ).tolist()
            t1 = clock.mark()
            result.verify_ms += clock.ms(t0, t1)
            staying = []
            for i, r in enumerate(active):
                token_id, prob, finite = int(host[i]), host[len(active) + i], host[2 * len(active) + i]
                if not finite:
                    raise ValueError(
                        "the target produced NaN or infinite probabilities; refusing to sample an invalid token"
                    )
                r.n += 1
                r.history.append(token_id)
                r.trace.rounds.append(
                    Round(
                        drafts=[],
                        emitted_ids=[token_id],
                        final_token_id=token_id,
                        final_text=decode([token_id])[0],
                        final_kind="target",
                        final_prob=prob,
                        draft_ms=0.0,
                        verify_ms=clock.ms(t0, t1),
                        end_ms=clock.since_start(),
                    )
                )
                if not extend_trace(r.trace, [token_id], run, clock):
                    staying.append(i)
            result.rounds.append([r.index for r in active])
            if len(staying) < len(active):
                runner.keep(staying)
                active = [active[i] for i in staying]
        yield from clock.hand_over(None)  # the time until the next round is asked for is not the batch's
    result.target_passes = runner.passes
    result.total_ms = clock.since_start()
    return result


def autoregressive_generate_batch(prompts: Sequence[Sequence[int]], target, **kwargs) -> BatchResult:
    """``autoregressive_batch_steps`` run to its end: its BatchResult (keywords and errors as there)."""
    return run_steps(autoregressive_batch_steps(prompts, target, **kwargs))
