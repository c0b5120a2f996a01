"""The decoding loops: speculative sampling and its autoregressive baseline.

Speculative sampling follows Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023
(Algorithm 2): the drafter samples gamma tokens x_i ~ q_i; the target scores them all in one
pass, giving p_1 .. p_{gamma+1}; draft i is accepted when u_i < min(1, p_i(x_i) / q_i(x_i));
the first rejected one is replaced by a sample from norm(max(0, p_i - q_i)); when all are
accepted a bonus token comes from p_{gamma+1}. The output is distributed exactly as the
target's own samples (Leviathan et al. 2023, Theorem 3.5; Appendix A.1).

Both loops know nothing of any UI: they yield a growing ``Trace`` after every round (and between the passes of a long
prompt's prefill), and the ``*_generate`` functions return the finished one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from specviz.engine import rejection
from specviz.engine.drafter import DraftRequest
from specviz.engine.runner import Cache, make_runner
from specviz.engine.sampling import Sampling, contexts
from specviz.engine.schedules import GammaSchedule, make_schedule
from specviz.engine.stopping import finish
from specviz.trace import MAX_GAMMA, Round, Trace
from specviz.engine.rounds import (  # noqa: F401  (TOP_TOKENS re-exported)
    TOP_TOKENS,
    Clock,
    RoundTimes,
    RunOptions,
    Transfer,
    engine_settings,
    extend_trace,
    held,
    open_run,
    prefill_steps,
    pack_chain_round,
    round_outcome,
    round_record,
    set_up,
    start_sequence,
)


def speculative_stream(
    input_ids: list[int],
    drafter,
    target,
    gamma: int = 4,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 64,
    eos_token_id: int | Iterable[int] | None = None,
    seed: int = 0,
    tokenizer=None,
    vocab_size: int | None = None,
    record: bool = True,
    cached: Cache = "auto",
    schedule: str | GammaSchedule = "constant",
    tree=None,
    steps: rejection.Steps = rejection.EXACT,
) -> Iterator[Trace]:
    """Speculative sampling, yielding the same growing Trace after every round.

    Args:
        input_ids: the prompt's token ids (batch of one), length >= 1.
        drafter: a ``specviz.drafters.Drafter`` (drafter model, prompt lookup, early exit), or a
            transformers causal LM sharing the target's tokenizer (taken as a drafter model).
        target: a transformers causal LM on the run's device, in eval mode.
        gamma: drafts per round, 1..MAX_GAMMA: the constant schedule's, the first round's for the
            adaptive ones, the most per round for ``confidence``; fewer in the last round if
            max_new_tokens is near, and fewer when prompt lookup finds less to copy.
        sampling: temperature, top-k, top-p, repetition penalty, applied identically to q and p.
        max_new_tokens: at most this many tokens are generated.
        eos_token_id: one id or several; generation stops after the first one emitted.
        seed: 0..2^63 - 1; seeds the torch.Generator that draws every sample and every u
            (``specviz.engine.seeds.generator``: seeds s and s + 2^32 draw differently).
        tokenizer: fills token texts and ``output_text``; its size cuts the logits.
        vocab_size: logits columns kept (default: the tokenizer's size, else the smaller config vocab).
        record: build the per-round record; False keeps only output ids and totals (for measuring
            the cost of the trace).
        cached: "auto" (CUDA graphs over the static cache on a GPU, transformers' dynamic cache elsewhere:
            ``specviz.engine.runner.make_runner``), True (the dynamic cache), "static", "graphs", or False
            (re-feed the whole sequence each pass: the test reference). The trace's settings record the
            engine used ("engine", and "engine_note": graphs captured by this run, or why not graphs on a GPU).
        schedule: a ``specviz.engine.schedules`` name ("constant", "heuristic", "confidence", "optimal")
            or a GammaSchedule. "optimal" reads the run's timings, so its tokens for one seed can
            differ between runs (each run is still distributed as the target's).
        tree: a ``specviz.engine.tree.spec.TreeSpec``: draft a token tree per round instead of a chain
            (``specviz.engine.tree.loop.tree_stream``; gamma and schedule are then unused).
        steps: the round's steps (``specviz.engine.rejection.Steps``): the published algorithm unless an
            experiment passes a variant (``specviz.lab.faults``). Chains only.

    Yields:
        The Trace, after each round, and (with no rounds yet) between the prefill passes of a prompt longer than
        ``specviz.engine.prefill.PREFILL_CHUNK`` tokens (a server's device thread runs other jobs' steps there).

    Raises:
        ValueError: empty prompt, ids outside the vocabulary, gamma out of range, max_new_tokens < 1,
            prompt + max_new_tokens beyond a model's context, NaN or all -inf logits, an unknown schedule,
            a seed out of range.
        TypeError: sampling is not a Sampling, drafter is neither a Drafter nor a causal LM.
    """
    options = RunOptions(sampling=sampling, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, seed=seed,
                         tokenizer=tokenizer, vocab_size=vocab_size, record=record, cached=cached)
    if tree is not None:
        from specviz.engine.tree.loop import tree_rounds

        yield from tree_rounds(input_ids, drafter, target, tree, options)
        return
    yield from chain_rounds(input_ids, drafter, target, options, gamma=gamma, schedule=schedule, steps=steps)


def chain_rounds(
    input_ids: list[int],
    drafter,
    target,
    options: RunOptions,
    *,
    gamma: int,
    schedule: str | GammaSchedule,
    steps: rejection.Steps = rejection.EXACT,
) -> Iterator[Trace]:
    """``speculative_stream`` with a chain of drafts per round: its numbered steps, yielding the Trace after each
    round. Arguments and errors as ``speculative_stream`` (its run-wide ones in ``options``)."""
    run = set_up(drafter, target, options)
    schedule = schedule if isinstance(schedule, GammaSchedule) else make_schedule(schedule, gamma)
    drafter, sampling, device = run.drafter, options.sampling, run.device
    trace, seq, history, gen = start_sequence(run, input_ids, gamma=gamma, room=options.max_new_tokens + MAX_GAMMA + 1,
                                              drafter=drafter.describe(), gamma_schedule=schedule.describe())
    n_prompt = len(input_ids)
    # An EAGLE drafter reads the target's features at the positions each target pass scores.
    reads_features = drafter.reads_target_features
    target_runner = make_runner(target, run.vocab, options.cached, keep_features=reads_features)
    top_k = min(TOP_TOKENS, run.vocab) if options.record else 0
    with held(target_runner, drafter):  # given back when the run ends, however it ends
        clock = yield from open_run(target_runner, run, trace, seq, n_prompt)
        n = n_prompt  # settled sequence length
        while True:
            with torch.inference_mode():  # per round, left before each yield (``Clock.hand_over``)
                remaining = n_prompt + options.max_new_tokens - n
                allowed = min(schedule.next_gamma(), remaining)
                t0 = clock.mark()  # CUDA events on a GPU: no synchronisation per phase

                # 1. Draft: up to `allowed` tokens x_i ~ q_i into seq[n:], each with the q it was drawn from.
                proposal = drafter.propose(DraftRequest(
                    seq=seq, n=n, gamma=allowed, history=history, sampling=sampling, warpers=run.warpers, gen=gen,
                    vocab=run.vocab, keep_drafting=schedule.keep_drafting, steps=steps))
                g, q_all = proposal.count, proposal.q  # q_all: (g, V)
                drafts = seq[n : n + g]
                t1 = clock.mark()

                # 2. Verify: one target pass over the pending token and the g drafts; row i scores the
                # position after n + i tokens, so its context holds the drafts before it.
                ctx = contexts(seq, range(n, n + g + 1), run.vocab) if sampling.needs_context else None
                p_all = steps.target_probs(target_runner.logits(seq, n + g, g + 1), sampling, run.warpers, ctx)
                if reads_features:
                    drafter.observe_target(*target_runner.features)

                # 3. Accept draft i when u_i < min(1, p_i(x_i) / q_i(x_i)).
                u = torch.rand(g, generator=gen, device=device)
                q_x, p_x = q_all.gather(1, drafts[:, None])[:, 0], p_all[:g].gather(1, drafts[:, None])[:, 0]
                accepted = steps.accept(u, q_x, p_x)

                # 4. The final token: a correction from norm(max(0, p_i - q_i)) at each draft, the bonus from p after
                # the last; one drawn from each (u first, then these: the run's random stream), the one after the
                # accepted drafts kept, so the round reads the device once.
                candidates = torch.cat([steps.residual(p_all[:g], q_all), p_all[g:]])  # (g+1, V)
                finals = rejection.sample_rows(candidates, sampling.greedy, gen)
                transfer = Transfer()
                pack_chain_round(transfer, "", drafts=drafts, q_all=q_all, p_all=p_all, q_x=q_x, p_x=p_x, u=u,
                                 accepted=accepted, candidates=candidates, finals=finals, top_k=top_k)
                host = transfer.fetch()
                t2 = clock.mark()
                outcome = round_outcome(host, run.eos, remaining)

                # 5. Roll back: the sequence stands after the emitted tokens; both sides keep all but
                # the newest token, which is fed next round.
                seq[n + outcome.accepted] = outcome.final  # after the accepted drafts; ignored if not kept
                n += len(outcome.emitted)
                history.extend(outcome.emitted)
                target_runner.rollback(n - 1)
                drafter.rollback(n - 1)
                draft_ms, verify_ms = clock.ms(t0, t1), clock.ms(t1, t2)
                schedule.observe(g, outcome.accepted, min(g, outcome.accepted + 1), draft_ms, verify_ms)

                # 6. Record.
                if options.record:
                    times = RoundTimes(draft_ms, verify_ms, clock.since_start())
                    trace.rounds.append(round_record(host, outcome, proposal, decode=run.decode, top_k=top_k,
                                                     gamma=allowed, times=times))
                extend_trace(trace, outcome.emitted, run, clock)
            yield from clock.hand_over(trace)
            if trace.stop_reason:
                return


def autoregressive_stream(
    input_ids: list[int],
    target,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 64,
    eos_token_id: int | Iterable[int] | None = None,
    seed: int = 0,
    tokenizer=None,
    vocab_size: int | None = None,
    record: bool = True,
    cached: Cache = "auto",
) -> Iterator[Trace]:
    """The baseline: one target pass per token, sampled from the same processed p.

    Arguments, yields and errors as ``speculative_stream`` (without drafter and gamma); each
    token is one Round with no drafts and ``final_kind="target"``.
    """
    options = RunOptions(sampling=sampling, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, seed=seed,
                         tokenizer=tokenizer, vocab_size=vocab_size, record=record, cached=cached)
    run = set_up(None, target, options)
    trace, seq, _, gen = start_sequence(run, input_ids, gamma=None, room=max_new_tokens, mode="autoregressive")
    n_prompt = len(input_ids)
    runner = make_runner(target, run.vocab, cached)
    with held(runner):  # given back when the run ends, however it ends
        clock = Clock(run.device)
        yield from prefill_steps(runner, seq, n_prompt - 1, clock, trace)  # long prompts in a few passes
        trace.prefill_ms = clock.since_start()
        trace.settings.update(engine_settings(runner))
        for n in range(n_prompt, n_prompt + max_new_tokens):
            with torch.inference_mode():  # per step, left before each yield (``Clock.hand_over``)
                t0 = clock.mark()
                ctx = contexts(seq, [n], run.vocab) if sampling.needs_context else None
                p = sampling.probs(runner.logits(seq, n, 1), run.warpers, ctx)
                token = rejection.sample_rows(p, sampling.greedy, gen)
                seq[n] = token[0]
                token_id, prob, finite = torch.cat(
                    [token.double(), p[0, token].double(), torch.isfinite(p).all().double()[None]]
                ).tolist()
                if not finite:
                    raise ValueError(
                        "the target produced NaN or infinite probabilities; refusing to sample an invalid token"
                    )
                token_id = int(token_id)
                t1 = clock.mark()
                if record:
                    trace.rounds.append(
                        Round(
                            drafts=[],
                            emitted_ids=[token_id],
                            final_token_id=token_id,
                            final_text=run.decode([token_id])[0],
                            final_kind="target",
                            final_prob=prob,
                            draft_ms=0.0,
                            verify_ms=clock.ms(t0, t1),
                            end_ms=clock.since_start(),
                        )
                    )
                extend_trace(trace, [token_id], run, clock)
            yield from clock.hand_over(trace)
            if trace.stop_reason:
                return


def speculative_generate(
    input_ids, drafter, target, gamma: int = 4, sampling: Sampling = Sampling(), **kwargs
) -> Trace:
    """Run ``speculative_stream`` to the end and return the finished Trace (same arguments and errors)."""
    return finish(speculative_stream(input_ids, drafter, target, gamma=gamma, sampling=sampling, **kwargs))


def autoregressive_generate(input_ids, target, sampling: Sampling = Sampling(), **kwargs) -> Trace:
    """Run ``autoregressive_stream`` to the end and return the finished Trace (same arguments and errors)."""
    return finish(autoregressive_stream(input_ids, target, sampling=sampling, **kwargs))
