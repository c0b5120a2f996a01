"""What every decoding loop shares: its options, the clock, the host transfer, the run's settings, its input
checks, the round's outcome and the EOS cut, and the trace.

Public names (the engine's API): ``RunOptions`` (what every loop takes besides its models and prompts), ``Clock``,
``Transfer``, ``RunSetup`` / ``set_up``, ``SequenceStart`` / ``start_sequence``, ``new_trace``, ``run_settings``,
``validate_inputs``, ``pack_chain_round``, ``RoundOutcome`` / ``round_outcome``, ``emit``, ``extend_trace``,
``RoundTimes`` / ``round_record``, ``TOP_TOKENS``.

The single-sequence chain loop (``specviz.engine.chain``), the batched loop (``specviz.engine.batch``) and the
token-tree loop (``specviz.engine.tree.loop``) build their rounds from these parts, so a fix to any of
them reaches all three. The rules themselves (the acceptance test, the residual) are called by the loops, from
``specviz.engine.rejection``.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from specviz.engine.prefill import prefill_ends
from specviz.engine.runner import Cache
from specviz.engine.model_drafter import as_drafter  # a causal LM given as the drafter becomes a drafter model
from specviz.engine.drafter import Drafter, Proposal
from specviz.engine.sampling import Sampling
from specviz.engine.seeds import generator
from specviz.trace import Draft, Round, TopToken, Trace

# Tokens of the correction's or bonus's distribution kept in the trace for the replay.
TOP_TOKENS = 5


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What every loop takes besides its models, its prompt(s) and its drafting (gamma, schedule or tree).

    Attributes:
        sampling: temperature, top-k, top-p and repetition penalty, applied to q and p alike.
        max_new_tokens: at most this many tokens per sequence (>= 1).
        eos_token_id: one id or several (None: none); a sequence stops after the first it emits.
        seed: 0..2^63 - 1; seeds the generator of every draw (``specviz.engine.seeds``).
        tokenizer: fills the trace's token texts and output text; its size cuts the logits.
        vocab_size: logits columns kept (None: the tokenizer's size, else the target's config).
        record: build each round's record (False: output ids and totals only).
        cached: the passes' KV cache (``specviz.engine.runner.make_runner``).
    """

    sampling: Sampling = Sampling()
    max_new_tokens: int = 64
    eos_token_id: int | Iterable[int] | None = None
    seed: int = 0
    tokenizer: object = None
    vocab_size: int | None = None
    record: bool = True
    cached: Cache = "auto"


class Mark(NamedTuple):
    """A point of a round's timeline: host milliseconds, and a CUDA event recorded there (None on a CPU)."""

    ms: float
    event: torch.cuda.Event | None


class Clock:
    """Wall-clock milliseconds, synchronised with the device so GPU work is counted.

    Time spent suspended at a ``yield`` (the consumer drawing a page, say) is excluded, so
    the trace's timings measure generation alone.

    ``now`` synchronises the device (one synchronisation per call on CUDA). A round's phases are
    timed without that: ``mark`` records a CUDA event (host time on a CPU) and ``ms(a, b)`` reads
    the GPU time between two marks once the later one has completed (the round's one transfer to
    the host waits for it anyway).
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.paused = 0.0
        self.start = self.now()

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() * 1000.0 - self.paused

    def mark(self) -> Mark:
        """A mark here: no synchronisation."""
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        return Mark(time.perf_counter() * 1000.0 - self.paused, event)

    def ms(self, a: Mark, b: Mark) -> float:
        """Milliseconds from mark ``a`` to mark ``b``: GPU time between their events on CUDA (waits for
        ``b``'s event), host time on a CPU."""
        if a.event is not None and b.event is not None:
            b.event.synchronize()
            return float(a.event.elapsed_time(b.event))
        return b.ms - a.ms

    def since_start(self) -> float:
        return self.now() - self.start

    def suspend(self) -> float:
        return time.perf_counter() * 1000.0

    def resume(self, suspended_at: float) -> None:
        self.paused += time.perf_counter() * 1000.0 - suspended_at

    def hand_over(self, trace: Trace) -> Iterator[Trace]:
        """Yield ``trace`` to the loop's consumer; the time the consumer keeps the loop suspended there is not the
        run's. Inference mode is thread-local: a loop leaves it before this yield, because the consumer may resume
        the generator on another thread."""
        suspended = self.suspend()
        yield trace
        self.resume(suspended)


def _eos_set(eos_token_id: int | Iterable[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(t) for t in eos_token_id)


def _context_limit(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)


def validate_inputs(input_ids, models, vocab_size: int, max_new_tokens: int) -> None:
    """Refuse an empty prompt, ids outside the vocabulary, a token budget under 1 and a prompt plus budget past a
    model's context (ValueError, naming the value). The sampling's type is ``set_up``'s check."""
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


def _logit_rows(model) -> int:
    """Columns of the model's logits: its output layer's rows (``out_features``: an ``nn.Linear`` or
    torch's int8 ``Linear``), else its config's vocabulary (a model whose head scatters a few rows
    into full-vocabulary logits, such as ``SmallHeadLM``, has no vocabulary-wide output layer)."""
    rows = getattr(model.get_output_embeddings(), "out_features", None)
    return int(rows) if rows is not None else int(model.config.vocab_size)


def _vocab_size(models, tokenizer, vocab_size: int | None) -> int:
    """The run's vocabulary: ``vocab_size`` if given, else the tokenizer's size, else the target's
    config, and never wider than the target's logits (the target, ``models[-1]``, must give every
    token its p). A drafter's narrower head does not cut it: its logits are widened with the
    dtype's lowest value (``specviz.engine.runner.widen``), so q = 0 outside its head, as FR-Spec has it."""
    target = models[-1]
    if vocab_size is None:
        vocab_size = len(tokenizer) if tokenizer is not None else int(target.config.vocab_size)
    return min(vocab_size, _logit_rows(target))


@functools.lru_cache(maxsize=1)
def _byte_of_char() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table, as transformers converts it), inverted."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


def _piece_text(tokenizer, token_id: int, text: str) -> str:
    """A token's own text, or, where it alone holds part of a multi-byte character (it decodes to U+FFFD), its text
    with the lone bytes written out (``\\xe2\\x80``): a drafter's byte piece read as a bare "\ufffd" in the output
    (EAGLE's first draft on the English pair, rejected)."""
    if "\ufffd" not in text:
        return text
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    table = _byte_of_char()
    if not isinstance(piece, str) or not piece or any(c not in table for c in piece):
        return text  # not a byte-level piece (a byte-fallback token names its byte already, as "<0xE2>")
    return bytes(table[c] for c in piece).decode("utf-8", errors="backslashreplace")


def _decoder(tokenizer):
    """Token id -> text for the trace (``_piece_text``); empty strings without a tokenizer."""
    if tokenizer is None:
        return lambda ids: [""] * len(ids)
    return lambda ids: [
        _piece_text(tokenizer, t, text) for t, text in zip(ids, tokenizer.batch_decode([[t] for t in ids]))
    ]


def _model_name(model) -> str:
    """A hub id as is; a local folder by its last two path parts (saved traces carry no machine paths)."""
    name = getattr(model.config, "name_or_path", "") or type(model).__name__
    parts = Path(name).parts
    return "/".join(parts[-2:]) if Path(name).is_absolute() else name


def run_settings(run: RunSetup, mode: str, seed: int, gamma: int | None = None) -> dict:
    """The settings a trace records of its run: mode, gamma, sampling, seed, token budget, EOS, device, dtype (and
    why, for a model given a form at load: ``specviz.pair.precision.apply_form``) and the models' names."""
    first = run.models[0]
    return {
        "mode": mode,
        "gamma": gamma,
        "sampling": run.options.sampling.to_dict(),
        "seed": seed,
        "max_new_tokens": run.options.max_new_tokens,
        "eos_token_id": sorted(run.eos),
        "device": str(first.device),
        "dtype": str(first.dtype).removeprefix("torch."),
        **(
            {"dtype_reason": form.reason} if (form := getattr(run.models[-1], "specviz_form", None)) is not None else {}
        ),
        "models": [_model_name(m) for m in run.models],
    }


class RunSetup(NamedTuple):
    """What every loop knows before its first pass (``set_up``)."""

    options: RunOptions
    drafter: Drafter | None  # None for the autoregressive baseline
    models: tuple  # the drafter's models, then the target
    vocab: int  # logits columns kept
    eos: frozenset[int]
    device: torch.device  # the target's
    decode: Callable[[list[int]], list[str]]  # token ids -> texts for the trace
    warpers: list  # the sampling's logits processors, applied to q and p alike


def set_up(drafter, target, options: RunOptions) -> RunSetup:
    """The drafter as a Drafter (None: the autoregressive baseline), the models, the vocabulary, the
    EOS set, the device, the decoder and the warpers of a run.

    Raises:
        TypeError: a drafter that is neither a Drafter nor a causal LM; sampling that is not a Sampling.
    """
    if not isinstance(options.sampling, Sampling):
        raise TypeError(f"sampling must be a specviz.Sampling, got {type(options.sampling).__name__}")
    drafter = as_drafter(drafter) if drafter is not None else None
    models = (*(drafter.models if drafter is not None else ()), target)
    return RunSetup(
        options=options,
        drafter=drafter,
        models=models,
        vocab=_vocab_size(models, options.tokenizer, options.vocab_size),
        eos=_eos_set(options.eos_token_id),
        device=target.device,
        decode=_decoder(options.tokenizer),
        warpers=options.sampling.warpers(),
    )


def new_trace(mode: str, prompt_ids, tokenizer, settings: dict) -> Trace:
    """An empty Trace of ``prompt_ids`` (its text decoded when there is a tokenizer)."""
    return Trace(
        mode=mode,
        prompt_ids=[int(t) for t in prompt_ids],
        prompt_text=tokenizer.decode(list(prompt_ids)) if tokenizer is not None else "",
        settings=settings,
    )


class SequenceStart(NamedTuple):
    """A single-sequence run's empty trace, its token buffer, the settled tokens and its generator."""

    trace: Trace
    seq: torch.Tensor  # (len(prompt) + room,) long, the prompt at the front
    history: list[int]  # the settled sequence on the host (prompt lookup reads it)
    gen: torch.Generator


def start_sequence(
    run: RunSetup, input_ids, *, gamma: int | None, room: int, mode: str = "speculative", **settings
) -> SequenceStart:
    """Check a single sequence's inputs and seed, and open its trace (the run's settings plus
    ``settings``) and its buffer of ``len(input_ids) + room`` tokens.

    Raises:
        ValueError: as ``validate_inputs``; a seed out of 0..2^63 - 1.
    """
    o = run.options
    validate_inputs(input_ids, run.models, run.vocab, o.max_new_tokens)
    gen = generator(o.seed, run.device)
    recorded = run_settings(run, mode, o.seed, gamma)
    recorded.update(settings)
    history = [int(t) for t in input_ids]
    seq = torch.zeros(len(history) + room, dtype=torch.long, device=run.device)
    seq[: len(history)] = torch.as_tensor(history, dtype=torch.long, device=run.device)
    return SequenceStart(new_trace(mode, history, o.tokenizer, recorded), seq, history, gen)


@contextlib.contextmanager
def held(runner, drafter: Drafter | None = None):
    """While a run lasts: on leaving (the run's end, an error, or its generator closed) the target's runner and the
    drafter give back what they hold (``release``: a graphed runner's one cache serves one run at a time)."""
    try:
        yield
    finally:
        runner.release()
        if drafter is not None:
            drafter.release()


def prefill_steps(runner, seq: torch.Tensor, end: int, clock: Clock, trace: Trace, after=None) -> Iterator[Trace]:
    """``runner.prefill(seq, end)`` in passes of at most PREFILL_CHUNK tokens (``prefill_ends``), ``after()`` (None:
    nothing) after each inside inference mode, ``trace`` yielded between passes (``Clock.hand_over``: a server's device
    thread runs other jobs' steps there, and that time is not the run's)."""
    ends = prefill_ends(end)
    for stop in ends:
        with torch.inference_mode():
            runner.prefill(seq, stop)
            if after is not None:
                after()
        if stop < end:
            yield from clock.hand_over(trace)


def open_run(runner, run: RunSetup, trace: Trace, seq: torch.Tensor, n_prompt: int):
    """A speculative run's start, shared by the chain and tree loops, as a generator whose value is the run's clock:
    the drafter prepared before the clock starts (a capture of its graphs is not the run's time), both sides prefilled
    with all but the pending last prompt token (the target's in passes of at most PREFILL_CHUNK tokens, ``trace``, with
    no rounds yet, yielded between them: ``prefill_steps``; an EAGLE drafter handed the target's features of each),
    ``trace.prefill_ms`` and the engine (``engine_settings``) recorded."""
    drafter, cached = run.drafter, run.options.cached
    drafter.prepare(run.vocab, cached)
    clock = Clock(run.device)
    with torch.inference_mode():
        # The last prompt token stays pending: the first round feeds it to the target.
        drafter.start(seq, n_prompt - 1, run.vocab, cached)

    def observed():
        if drafter.reads_target_features and runner.features is not None:
            drafter.observe_target(*runner.features)

    yield from prefill_steps(runner, seq, n_prompt - 1, clock, trace, observed)
    trace.prefill_ms = clock.since_start()
    trace.settings.update(engine_settings(runner, drafter))
    return clock


def engine_settings(runner, drafter: Drafter | None = None) -> dict:
    """What the trace records of the passes' engine: the target runner's ``engine`` ("graphs", "static",
    "dynamic" or "re-fed") and, where there is one, a note ("CUDA graphs captured in 1.6 s", or why not graphs
    on a GPU), the drafter's after the target's."""
    notes = [runner.note, *([f"drafter: {drafter.engine_note}"] if drafter is not None and drafter.engine_note else [])]
    notes = [n for n in notes if n]
    return {"engine": runner.engine, **({"engine_note": "; ".join(notes)} if notes else {})}


class Transfer:
    """Named device tensors sent to the host in one transfer and read back by name.

    A round's values would each cost a device synchronisation if read one by one; packed into
    one float64 tensor they cost one, and no offset arithmetic leaks into the loop.
    """

    def __init__(self):
        # An empty float64 part first: torch.cat promotes every part to float64 in the one cat.
        self._parts: list[torch.Tensor] = [torch.zeros(0, dtype=torch.float64)]
        self._spans: dict[str, tuple[int, int]] = {}
        self._size = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        flat = tensor.reshape(-1)
        self._spans[name] = (self._size, self._size + flat.numel())
        self._size += flat.numel()
        self._parts.append(flat)

    def fetch(self) -> dict[str, list[float]]:
        """Every value by name. On CUDA the packed tensor is copied asynchronously into pinned host
        memory and only that copy is waited for (an event), not the whole device."""
        if len(self._parts) > 1 and self._parts[0].device != self._parts[1].device:
            self._parts[0] = self._parts[0].to(self._parts[1].device)
        packed = torch.cat(self._parts)
        if packed.is_cuda:
            pinned = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            pinned.copy_(packed, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            done.synchronize()
            packed = pinned
        host = packed.tolist()
        return {name: host[a:b] for name, (a, b) in self._spans.items()}


def _verdicts(n_drafts: int, n_acc: int) -> list[str]:
    return ["accepted" if i < n_acc else ("rejected" if i == n_acc else "discarded") for i in range(n_drafts)]


def pack_chain_round(
    transfer: Transfer,
    prefix: str,
    *,
    drafts: torch.Tensor,
    q_all: torch.Tensor,
    p_all: torch.Tensor,
    q_x: torch.Tensor,
    p_x: torch.Tensor,
    u: torch.Tensor,
    accepted: torch.Tensor,
    candidates: torch.Tensor,
    finals: torch.Tensor,
    top_k: int,
) -> None:
    """A chain round's values for the host, added to ``transfer`` under ``prefix``: the drafts, their q(x) and p(x),
    u, the verdicts, every candidate final token and its probability, beta at each drafted position, whether p and q
    are finite, and (``top_k`` > 0) each candidate distribution's top tokens for the replay.

    Args:
        drafts: (g,); q_all: (g, V) their q; p_all: (g + 1, V) the target's p; q_x, p_x, u, accepted: (g,) q and p
            at each draft, its uniform and its verdict;
        candidates: (g + 1, V) the residual at each draft, then p after the last; finals: (g + 1,) one draw from each.
    """
    g = drafts.shape[0]
    values = {
        "drafts": drafts,
        "q": q_x,
        "p": p_x,
        "u": u,
        "accept": accepted,
        "finals": finals,
        "final_probs": candidates.gather(1, finals[:, None])[:, 0],
        # beta_i = sum_x min(p_i(x), q_i(x)) at every drafted position, discarded ones too
        # (Leviathan et al. 2023, Def. 3.1): computed here, where p and q already are.
        "beta": torch.minimum(p_all[:g], q_all).sum(dim=-1),
        # Finite probabilities sum to a finite number and any NaN or inf makes the sum so: one
        # reduction each, far cheaper than an elementwise isfinite over the vocabulary.
        "finite": torch.isfinite(p_all.sum() + q_all.sum()),
    }
    if top_k:
        # The top tokens of each candidate distribution, with p and q there: the replay shows
        # why the correction or bonus came out.
        top_prob, top_ids = candidates.topk(top_k, dim=-1)  # (g+1, k)
        q_pad = torch.cat([q_all, torch.zeros_like(p_all[:1])])  # no q after the last draft
        values.update(
            top_ids=top_ids, top_prob=top_prob, top_p=p_all.gather(1, top_ids), top_q=q_pad.gather(1, top_ids)
        )
    for name, tensor in values.items():
        transfer.add(prefix + name, tensor)


def emit(accepted_ids: list[int], final: int, eos: frozenset[int], remaining: int) -> tuple[list[int], bool]:
    """A round's emitted tokens, the accepted drafts and then the final token, cut after the first EOS (kept) and at
    ``remaining`` tokens; and whether the final token survived the cut. Every loop's one EOS cut."""
    emitted = [*accepted_ids, final]
    end = next((i + 1 for i, t in enumerate(emitted) if t in eos), len(emitted))
    emitted = emitted[: min(end, remaining)]
    return emitted, len(emitted) == len(accepted_ids) + 1


class RoundOutcome(NamedTuple):
    """What a round settled (``round_outcome``)."""

    draft_ids: list[int]  # every draft proposed, in order
    accepted: int  # the first ``accepted`` drafts stand
    final: int  # the correction (after a rejection), the bonus (all accepted), or the baseline's own token
    kind: str  # "correction", "bonus" or "target"
    emitted: list[int]  # ``emit``: accepted drafts and the final token, cut at EOS and the token budget
    keeps_final: bool  # whether the final token is among the emitted


def round_outcome(host: dict, eos: frozenset[int], remaining: int) -> RoundOutcome:
    """A chain round's outcome from its transferred values (``host``, names without prefix).

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
    emitted, keeps_final = emit(draft_ids[:n_acc], final, eos, remaining)
    return RoundOutcome(draft_ids, n_acc, final, kind, emitted, keeps_final)


def extend_trace(trace: Trace, emitted: list[int], run: RunSetup, clock: Clock) -> bool:
    """Append a round's emitted tokens to ``trace``; stop it at an EOS (kept, always the last
    emitted token) or at ``max_new_tokens``, decoding its text then. Returns whether it stopped."""
    trace.output_ids.extend(emitted)
    if emitted and emitted[-1] in run.eos:
        trace.stop_reason = "eos"
    elif len(trace.output_ids) >= run.options.max_new_tokens:
        trace.stop_reason = "max_new_tokens"
    trace.total_ms = clock.since_start()
    if trace.stop_reason:
        tokenizer = run.options.tokenizer
        trace.output_text = tokenizer.decode(trace.output_ids) if tokenizer is not None else ""
    return trace.stop_reason is not None


class RoundTimes(NamedTuple):
    """A round's times in ms: drafting, verifying (the target's pass and the judging), and its end since the run's
    start."""

    draft_ms: float
    verify_ms: float
    end_ms: float


def round_record(
    host: dict, outcome: RoundOutcome, proposal: Proposal, *, decode, top_k: int, gamma: int, times: RoundTimes
) -> Round:
    """The Round record of a chain round from its transferred values (``host``, by name), its outcome and the
    drafter's proposal (where drafts were copied from, whose features, a cross-tokenizer drafter's own tokens and
    shared mass); ``gamma``: the drafts the round allowed."""
    draft_ids, n_acc, final, kind, emitted, keeps_final = outcome
    g = len(draft_ids)
    texts = decode(draft_ids + [final])
    top = {key: host[key][n_acc * top_k : (n_acc + 1) * top_k] for key in ("top_ids", "top_prob", "top_p", "top_q")}
    top_ids = [int(t) for t in top["top_ids"]]
    verdicts = _verdicts(g, n_acc)
    sources, own_tokens, shared_mass = proposal.sources, proposal.own_tokens, proposal.shared_mass
    drafts = [
        Draft(
            token_id=draft_ids[i],
            text=texts[i],
            q=host["q"][i],
            p=host["p"][i],
            accept_prob=min(1.0, host["p"][i] / host["q"][i]) if host["q"][i] > 0 else 0.0,
            u=host["u"][i],
            verdict=verdicts[i],
            beta=min(1.0, host["beta"][i]),
            source=sources[i] if sources else None,
            own_token_id=own_tokens[i] if own_tokens else None,
            shared_mass=min(1.0, shared_mass[i]) if shared_mass else None,
        )
        for i in range(g)
    ]
    return Round(
        drafts=drafts,
        emitted_ids=emitted,
        final_token_id=final if keeps_final else None,
        final_text=texts[g] if keeps_final else None,
        final_kind=kind if keeps_final else None,
        final_prob=host["final_probs"][n_acc] if keeps_final else None,
        final_top=[
            TopToken(token_id=t, text=x, prob=pr, p=pp, q=qq if kind == "correction" else None)
            for t, x, pr, pp, qq in zip(top_ids, decode(top_ids), top["top_prob"], top["top_p"], top["top_q"])
        ]
        if keeps_final
        else [],
        draft_ms=times.draft_ms,
        verify_ms=times.verify_ms,
        end_ms=times.end_ms,
        gamma=gamma,
        features_from=proposal.features_from if g else None,
    )
