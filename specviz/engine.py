"""The decoding loops: speculative sampling and its autoregressive baseline.

Speculative sampling follows Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023
(Algorithm 2): the drafter samples gamma tokens x_i ~ q_i; the target scores them all in one
pass, giving p_1 .. p_{gamma+1}; draft i is accepted when u_i < min(1, p_i(x_i) / q_i(x_i));
the first rejected one is replaced by a sample from norm(max(0, p_i - q_i)); when all are
accepted a bonus token comes from p_{gamma+1}. The output is distributed exactly as the
target's own samples (Leviathan et al. 2023, Theorem 3.5; Appendix A.1).

Both loops know nothing of any UI: they yield a growing ``Trace`` after every round, and the
``*_generate`` functions return the finished one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from specviz import rejection
from specviz.drafters import DraftRequest, as_drafter
from specviz.runner import ModelRunner
from specviz.sampling import Sampling, contexts
from specviz.schedules import GammaSchedule, make_schedule
from specviz.trace import MAX_GAMMA, Draft, Round, TopToken, Trace

# Tokens of the correction's or bonus's distribution kept in the trace for the replay.
TOP_TOKENS = 5


class _Clock:
    """Wall-clock milliseconds, synchronised with the device so GPU work is counted.

    Time spent suspended at a ``yield`` (the consumer drawing a page, say) is excluded, so
    the trace's timings measure generation alone.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.paused = 0.0
        self.start = self.now()

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() * 1000.0 - self.paused

    def since_start(self) -> float:
        return self.now() - self.start

    def suspend(self) -> float:
        return time.perf_counter() * 1000.0

    def resume(self, suspended_at: float) -> None:
        self.paused += time.perf_counter() * 1000.0 - suspended_at


def _eos_set(eos_token_id: int | Iterable[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(t) for t in eos_token_id)


def _context_limit(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)


def _validate(input_ids, models, vocab_size: int, max_new_tokens: int, sampling) -> None:
    if not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a specviz.Sampling, got {type(sampling).__name__}")
    if len(input_ids) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens!r}")
    bad = [t for t in input_ids if not (0 <= int(t) < vocab_size)]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary of {vocab_size} tokens")
    for model in models:
        limit = _context_limit(model)
        if limit is not None and len(input_ids) + max_new_tokens > limit:
            raise ValueError(
                f"prompt ({len(input_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"context of {limit} tokens of {type(model).__name__}; shorten the prompt or ask for fewer tokens"
            )


def _vocab_size(models, tokenizer, vocab_size: int | None) -> int:
    rows = min(m.get_output_embeddings().weight.shape[0] for m in models)
    if vocab_size is None:
        vocab_size = len(tokenizer) if tokenizer is not None else min(m.config.vocab_size for m in models)
    return min(vocab_size, rows)


def _decoder(tokenizer):
    """Token id -> text for the trace; empty strings without a tokenizer."""
    if tokenizer is None:
        return lambda ids: [""] * len(ids)
    return lambda ids: tokenizer.batch_decode([[t] for t in ids])


def _model_name(model) -> str:
    """A hub id as is; a local folder by its last two path parts (saved traces carry no machine paths)."""
    name = getattr(model.config, "name_or_path", "") or type(model).__name__
    parts = Path(name).parts
    return "/".join(parts[-2:]) if Path(name).is_absolute() else name


def _settings(mode: str, sampling: Sampling, seed: int, max_new_tokens: int, eos, models, gamma=None) -> dict:
    first = models[0]
    return {
        "mode": mode,
        "gamma": gamma,
        "sampling": sampling.to_dict(),
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "eos_token_id": sorted(eos),
        "device": str(first.device),
        "dtype": str(first.dtype).removeprefix("torch."),
        "models": [_model_name(m) for m in models],
    }


class _Transfer:
    """Named device tensors sent to the host in one transfer and read back by name.

    A round's values would each cost a device synchronisation if read one by one; packed into
    one float64 tensor they cost one, and no offset arithmetic leaks into the loop.
    """

    def __init__(self):
        self._parts: list[torch.Tensor] = []
        self._spans: dict[str, tuple[int, int]] = {}
        self._size = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        flat = tensor.reshape(-1).double()
        self._spans[name] = (self._size, self._size + flat.numel())
        self._size += flat.numel()
        self._parts.append(flat)

    def fetch(self) -> dict[str, list[float]]:
        host = torch.cat(self._parts).tolist()
        return {name: host[a:b] for name, (a, b) in self._spans.items()}


def _verdicts(n_drafts: int, n_acc: int) -> list[str]:
    return ["accepted" if i < n_acc else ("rejected" if i == n_acc else "discarded") for i in range(n_drafts)]



def _judge(transfer: _Transfer, prefix: str, drafts: torch.Tensor, q_all: torch.Tensor, p_all: torch.Tensor,
           sampling: Sampling, gen: torch.Generator, top_k: int) -> None:
    """Steps 3 and 4 of a round for one sequence, added to ``transfer`` under ``prefix``.

    Accept: draft i stands when u_i < min(1, p_i / q_i). The final token: a correction from the
    residual at every draft position, the bonus from p after the last; only one is used, but
    drawing all at once keeps the round to a single device-to-host transfer.

    Args:
        drafts: (g,) the drafts; q_all: (g, V) their q; p_all: (g + 1, V) the target's p.
        gen: the sequence's generator: u first, then the final tokens (this order is the
            run's random stream, shared by the single-sequence and the batched loop).
        top_k: tokens of each candidate distribution to keep for the replay (0: none).
    """
    g = drafts.shape[0]
    q_d = q_all.gather(1, drafts[:, None])[:, 0]
    p_d = p_all[:g].gather(1, drafts[:, None])[:, 0]
    u = torch.rand(g, generator=gen, device=p_all.device)
    accept = rejection.accept(u, q_d, p_d)
    candidates = torch.cat([rejection.residual(p_all[:g], q_all), p_all[g:]])  # (g+1, V)
    finals = rejection.sample_rows(candidates, sampling.greedy, gen)
    values = {
        "drafts": drafts, "q": q_d, "p": p_d, "u": u, "accept": accept, "finals": finals,
        "final_probs": candidates.gather(1, finals[:, None])[:, 0],
        # beta_i = sum_x min(p_i(x), q_i(x)) at every drafted position, discarded ones too
        # (Leviathan et al. 2023, Def. 3.1): computed here, where p and q already are.
        "beta": torch.minimum(p_all[:g], q_all).sum(dim=-1),
        "finite": torch.isfinite(p_all).all() & torch.isfinite(q_all).all(),
    }
    if top_k:
        # The top tokens of each candidate distribution, with p and q there: the replay shows
        # why the correction or bonus came out.
        top_prob, top_ids = candidates.topk(top_k, dim=-1)  # (g+1, k)
        q_pad = torch.cat([q_all, torch.zeros_like(p_all[:1])])  # no q after the last draft
        values.update(top_ids=top_ids, top_prob=top_prob, top_p=p_all.gather(1, top_ids), top_q=q_pad.gather(1, top_ids))
    for name, tensor in values.items():
        transfer.add(prefix + name, tensor)


def _settle(host: dict, eos: frozenset[int], remaining: int) -> tuple[list[int], int, int, str, list[int], bool]:
    """A round's outcome from its transferred values (``host``, names without prefix).

    Returns:
        (draft ids, accepted drafts, final token, its kind "correction" / "bonus" / "target",
        the emitted tokens cut at the first EOS and at ``remaining``, whether the final token is kept).

    Raises:
        ValueError: a model produced NaN or infinite probabilities.
    """
    if not host["finite"][0]:
        raise ValueError("a model produced NaN or infinite probabilities; refusing to sample an invalid token")
    draft_ids = [int(x) for x in host["drafts"]]
    g = len(draft_ids)
    n_acc = next((i for i, a in enumerate(host["accept"]) if not a), g)
    final = int(host["finals"][n_acc])
    kind = "correction" if n_acc < g else ("bonus" if g else "target")
    emitted = draft_ids[:n_acc] + [final]
    # Stop at the first EOS (kept), and never past max_new_tokens.
    cut = next((i + 1 for i, t in enumerate(emitted) if t in eos), len(emitted))
    emitted = emitted[: min(cut, remaining)]
    return draft_ids, n_acc, final, kind, emitted, len(emitted) == n_acc + 1


def _extend(trace: Trace, emitted: list[int], eos: frozenset[int], max_new_tokens: int, clock: _Clock, tokenizer) -> bool:
    """Append a round's emitted tokens to ``trace``; stop it at an EOS (kept, always the last
    emitted token) or at ``max_new_tokens``, decoding its text then. Returns whether it stopped."""
    trace.output_ids.extend(emitted)
    if emitted and emitted[-1] in eos:
        trace.stop_reason = "eos"
    elif len(trace.output_ids) >= max_new_tokens:
        trace.stop_reason = "max_new_tokens"
    trace.total_ms = clock.since_start()
    if trace.stop_reason:
        trace.output_text = tokenizer.decode(trace.output_ids) if tokenizer is not None else ""
    return trace.stop_reason is not None


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
    cached: bool = True,
    schedule: str | GammaSchedule = "constant",
    tree=None,
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
        seed: seeds the torch.Generator that draws every sample and every u.
        tokenizer: fills token texts and ``output_text``; its size cuts the logits.
        vocab_size: logits columns kept (default: the tokenizer's size, else the smaller config vocab).
        record: build the per-round record; False keeps only output ids and totals (for measuring
            the cost of the trace).
        cached: use KV caches (True) or re-feed the whole sequence each pass (the test reference).
        schedule: a ``specviz.schedules`` name ("constant", "heuristic", "confidence", "optimal")
            or a GammaSchedule. "optimal" reads the run's timings, so its tokens for one seed can
            differ between runs (each run is still distributed as the target's).
        tree: a ``specviz.tree.spec.TreeSpec``: draft a token tree per round instead of a chain
            (``specviz.tree.loop.tree_stream``; gamma and schedule are then unused).

    Yields:
        The Trace, after each round.

    Raises:
        ValueError: empty prompt, ids outside the vocabulary, gamma out of range, max_new_tokens < 1,
            prompt + max_new_tokens beyond a model's context, NaN or all -inf logits, an unknown schedule.
        TypeError: sampling is not a Sampling, drafter is neither a Drafter nor a causal LM.
    """
    if tree is not None:
        from specviz.tree.loop import tree_stream

        yield from tree_stream(input_ids, drafter, target, tree, sampling=sampling, max_new_tokens=max_new_tokens,
                               eos_token_id=eos_token_id, seed=seed, tokenizer=tokenizer, vocab_size=vocab_size, record=record,
                               cached=cached)
        return
    drafter = as_drafter(drafter)
    schedule = schedule if isinstance(schedule, GammaSchedule) else make_schedule(schedule, gamma)
    models = (*drafter.models, target)
    vocab = _vocab_size(models, tokenizer, vocab_size)
    _validate(input_ids, models, vocab, max_new_tokens, sampling)
    eos = _eos_set(eos_token_id)
    device = target.device
    decode = _decoder(tokenizer)
    warpers = sampling.warpers()
    gen = torch.Generator(device=device).manual_seed(seed)
    settings = _settings("speculative", sampling, seed, max_new_tokens, eos, models, gamma)
    settings.update(drafter=drafter.describe(), gamma_schedule=schedule.describe())
    trace = Trace(
        mode="speculative",
        prompt_ids=[int(t) for t in input_ids],
        prompt_text=tokenizer.decode(list(input_ids)) if tokenizer is not None else "",
        settings=settings,
    )
    n_prompt = len(input_ids)
    history = [int(t) for t in input_ids]  # the settled sequence on the host (prompt lookup reads it)
    seq = torch.zeros(n_prompt + max_new_tokens + MAX_GAMMA + 1, dtype=torch.long, device=device)
    seq[:n_prompt] = torch.as_tensor(history, dtype=torch.long, device=device)
    target_runner = ModelRunner(target, vocab, cached)
    clock = _Clock(device)
    top_k = min(TOP_TOKENS, vocab)

    with torch.inference_mode():
        # The last prompt token stays pending: the first round feeds it to the target.
        drafter.start(seq, n_prompt - 1, vocab, cached)
        target_runner.prefill(seq, n_prompt - 1)
        trace.prefill_ms = clock.since_start()

    n = n_prompt  # settled sequence length
    while True:
        # Inference mode is thread-local: it is entered per round and left before each yield,
        # because the consumer may resume this generator on another thread.
        with torch.inference_mode():
            remaining = n_prompt + max_new_tokens - n
            allowed = min(schedule.next_gamma(), remaining)
            t0 = clock.now()

            # 1. Draft: up to `allowed` tokens into seq[n:], each with the q it was drawn from.
            proposal = drafter.propose(DraftRequest(seq, n, allowed, history, sampling, warpers, gen, vocab, schedule.keep_drafting))
            g, q_all = proposal.count, proposal.q  # q_all: (g, V)
            t1 = clock.now()

            # 2. Verify: one target pass over the pending token and the g drafts; row i scores the
            # position after n + i tokens, so its context holds the drafts before it.
            ctx = contexts(seq, range(n, n + g + 1), vocab) if sampling.needs_context else None
            p_all = rejection.target_probs(target_runner.logits(seq, n + g, g + 1), sampling, warpers, ctx)  # (g+1, V)
            drafts = seq[n : n + g]

            # 3-4. Accept, and the final token (correction or bonus).
            transfer = _Transfer()
            _judge(transfer, "", drafts, q_all, p_all, sampling, gen, top_k if record else 0)
            host = transfer.fetch()
            t2 = clock.now()

            draft_ids, n_acc, final, kind, emitted, keeps_final = _settle(host, eos, remaining)

            # 5. Roll back: the sequence stands after the emitted tokens; both sides keep all but
            # the newest token, which is fed next round.
            seq[n + n_acc] = final  # after the accepted drafts; ignored if not kept
            n += len(emitted)
            history.extend(emitted)
            target_runner.rollback(n - 1)
            drafter.rollback(n - 1)
            schedule.observe(g, n_acc, min(g, n_acc + 1), t1 - t0, t2 - t1)

            # 6. Record.
            if record:
                trace.rounds.append(_round(host, draft_ids, n_acc, final, kind, keeps_final, emitted, proposal.sources,
                                           decode, top_k, allowed, t1 - t0, t2 - t1, clock.since_start()))
            _extend(trace, emitted, eos, max_new_tokens, clock, tokenizer)
        if trace.stop_reason:
            yield trace
            return
        suspended = clock.suspend()
        yield trace
        clock.resume(suspended)


def _round(host: dict, draft_ids: list[int], n_acc: int, final: int, kind: str, keeps_final: bool, emitted: list[int],
           sources: list[int] | None, decode, top_k: int, allowed: int, draft_ms: float, verify_ms: float, end_ms: float) -> Round:
    """The Round record from one round's transferred values (``host``, by name)."""
    g = len(draft_ids)
    texts = decode(draft_ids + [final])
    top = {key: host[key][n_acc * top_k : (n_acc + 1) * top_k] for key in ("top_ids", "top_prob", "top_p", "top_q")}
    top_ids = [int(t) for t in top["top_ids"]]
    verdicts = _verdicts(g, n_acc)
    drafts = [
        Draft(
            token_id=draft_ids[i], text=texts[i], q=host["q"][i], p=host["p"][i],
            accept_prob=min(1.0, host["p"][i] / host["q"][i]) if host["q"][i] > 0 else 0.0, u=host["u"][i],
            verdict=verdicts[i], beta=min(1.0, host["beta"][i]), source=sources[i] if sources else None,
        )
        for i in range(g)
    ]
    return Round(
        drafts=drafts, emitted_ids=emitted,
        final_token_id=final if keeps_final else None,
        final_text=texts[g] if keeps_final else None,
        final_kind=kind if keeps_final else None,
        final_prob=host["final_probs"][n_acc] if keeps_final else None,
        final_top=[
            TopToken(token_id=t, text=x, prob=pr, p=pp, q=qq if kind == "correction" else None)
            for t, x, pr, pp, qq in zip(top_ids, decode(top_ids), top["top_prob"], top["top_p"], top["top_q"])
        ] if keeps_final else [],
        draft_ms=draft_ms, verify_ms=verify_ms, end_ms=end_ms, gamma=allowed,
    )


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
    cached: bool = True,
) -> Iterator[Trace]:
    """The baseline: one target pass per token, sampled from the same processed p.

    Arguments, yields and errors as ``speculative_stream`` (without drafter and gamma); each
    token is one Round with no drafts and ``final_kind="target"``.
    """
    models = (target,)
    vocab = _vocab_size(models, tokenizer, vocab_size)
    _validate(input_ids, models, vocab, max_new_tokens, sampling)
    eos = _eos_set(eos_token_id)
    device = target.device
    decode = _decoder(tokenizer)
    warpers = sampling.warpers()
    gen = torch.Generator(device=device).manual_seed(seed)
    trace = Trace(
        mode="autoregressive",
        prompt_ids=[int(t) for t in input_ids],
        prompt_text=tokenizer.decode(list(input_ids)) if tokenizer is not None else "",
        settings=_settings("autoregressive", sampling, seed, max_new_tokens, eos, models),
    )
    n_prompt = len(input_ids)
    seq = torch.zeros(n_prompt + max_new_tokens, dtype=torch.long, device=device)
    seq[:n_prompt] = torch.as_tensor(list(input_ids), dtype=torch.long, device=device)
    runner = ModelRunner(target, vocab, cached)
    clock = _Clock(device)
    with torch.inference_mode():
        runner.prefill(seq, n_prompt - 1)
        trace.prefill_ms = clock.since_start()
    for n in range(n_prompt, n_prompt + max_new_tokens):
        with torch.inference_mode():  # per step, not across a yield (thread-local)
            t0 = clock.now()
            p = sampling.probs(runner.logits(seq, n, 1), warpers, contexts(seq, [n], vocab) if sampling.needs_context else None)
            token = rejection.sample_rows(p, sampling.greedy, gen)
            seq[n] = token[0]
            token_id, prob, finite = torch.cat([token.double(), p[0, token].double(), torch.isfinite(p).all().double()[None]]).tolist()
            if not finite:
                raise ValueError("the target produced NaN or infinite probabilities; refusing to sample an invalid token")
            token_id = int(token_id)
            t1 = clock.now()
            if record:
                trace.rounds.append(
                    Round(
                        drafts=[], emitted_ids=[token_id], final_token_id=token_id, final_text=decode([token_id])[0],
                        final_kind="target", final_prob=prob, draft_ms=0.0, verify_ms=t1 - t0, end_ms=clock.since_start(),
                    )
                )
            _extend(trace, [token_id], eos, max_new_tokens, clock, tokenizer)
        if trace.stop_reason:
            yield trace
            return
        suspended = clock.suspend()
        yield trace
        clock.resume(suspended)


def _last(stream: Iterator[Trace]) -> Trace:
    trace = None
    for trace in stream:
        pass
    return trace


def speculative_generate(input_ids, drafter, target, gamma: int = 4, sampling: Sampling = Sampling(), **kwargs) -> Trace:
    """Run ``speculative_stream`` to the end and return the finished Trace (same arguments and errors)."""
    return _last(speculative_stream(input_ids, drafter, target, gamma=gamma, sampling=sampling, **kwargs))


def autoregressive_generate(input_ids, target, sampling: Sampling = Sampling(), **kwargs) -> Trace:
    """Run ``autoregressive_stream`` to the end and return the finished Trace (same arguments and errors)."""
    return _last(autoregressive_stream(input_ids, target, sampling=sampling, **kwargs))
