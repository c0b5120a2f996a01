"""Rebuild the embedded model pair from the CPython standard library.

    python -m specviz train                      # tokenizer, target, drafter, into assets/models python -m specviz
    train --target-steps 50 --drafter-steps 20 --out /tmp/pair   # a quick smoke run python -m specviz train --english  
    # the English pair's drafter (see specviz.training.distill) python -m specviz train --eagle-data         # the EAGLE
    head's corpus, shard by shard (specviz.training.eagle_corpus) python -m specviz train --eagle              # the
    English pair's EAGLE head, one chunk (see specviz.training.eagle) python -m specviz train --onpolicy           # the
    English drafter, on its own text, one chunk (specviz.training.onpolicy)

Steps, in order, all seeded:
1. a byte-level BPE tokenizer (``tokenizers``) trained on the training split;
2. the target, a GPT-2 causal LM, trained on next-token cross-entropy;
3. the drafter, a two-layer GPT-2, distilled from the target: it minimises
   KL(p_target || q_drafter) over every position, which raises the acceptance rate
   E[min(1, p/q)] more than training on the corpus alone would (Leviathan et al. 2023, Sec. 3.5
   note that acceptance depends on how close q is to p).

Each step logs its loss to a progress bar and to ``training_log.json`` in its model folder.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import time
from dataclasses import dataclass, asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specviz.training import corpus

EOS = "<|endoftext|>"


@dataclass
class ModelShape:
    """A GPT-2 shape: layers, width, heads."""

    n_layer: int
    n_embd: int
    n_head: int


TARGET_SHAPE = ModelShape(n_layer=10, n_embd=192, n_head=3)
# Two layers: one layer cannot form an induction head, so it cannot copy from the context,
# which greedy text of small models does a lot; 128 wide keeps its step near a fifth of the target's.
DRAFTER_SHAPE = ModelShape(n_layer=2, n_embd=128, n_head=2)
VOCAB_SIZE = 4096
CONTEXT = 512


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE (GPT-2 style) wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS, model_max_length=CONTEXT
    )


def encode_all(tokenizer, files: list[corpus.SourceFile]) -> torch.Tensor:
    """One long 1-D tensor of token ids: each file followed by EOS."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for f in files:
        ids.extend(tokenizer(f.text, add_special_tokens=False)["input_ids"])
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32)


def build_model(shape: ModelShape, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=CONTEXT,
        n_embd=shape.n_embd,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config)


def batches(data: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    """Endless random windows of ``length + 1`` tokens; shape (batch, length + 1)."""
    while True:
        starts = torch.randint(0, len(data) - length - 1, (batch,), generator=gen)
        yield torch.stack([data[s : s + length + 1] for s in starts.tolist()]).long()


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def bits_per_byte(model, data: torch.Tensor, n_bytes: int, length: int = CONTEXT) -> float:
    """Cross-entropy of ``model`` on ``data`` in bits per byte of the text it encodes.

    ``n_bytes`` is the UTF-8 size of that text; windows do not overlap, so the first token
    of each window is predicted from no context (a small, stated pessimism).
    """
    model.eval()
    nats = 0.0
    count = 0
    for s in range(0, len(data) - 1, length):
        chunk = data[s : s + length + 1].long()[None]
        if chunk.shape[1] < 2:
            break
        logits = model(chunk[:, :-1]).logits
        nats += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
        count += chunk.shape[1] - 1
    model.train()
    # Tokens counted cover almost all of data; scale bytes to the share predicted.
    share = count / max(1, len(data) - 1)
    return nats / math.log(2) / (n_bytes * share)


def gzip_bits_per_byte(text: str) -> float:
    raw = text.encode()
    return 8 * len(gzip.compress(raw, compresslevel=9)) / len(raw)


def run_training(
    model,
    data: torch.Tensor,
    steps: int,
    batch: int,
    peak_lr: float,
    seed: int,
    desc: str,
    teacher=None,
) -> list[dict]:
    """AdamW training; with ``teacher`` the loss is KL(teacher || model), else cross-entropy.

    Returns the loss log: one dict per logged step.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.1, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    log = []
    model.train()
    bar = tqdm(range(steps), desc=desc)
    it = batches(data, batch, CONTEXT, gen)
    start = time.perf_counter()
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr, warmup)
        x = next(it)
        logits = model(x[:, :-1]).logits
        if teacher is None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        else:
            with torch.no_grad():
                target_logp = F.log_softmax(teacher(x[:, :-1]).logits, dim=-1)
            loss = F.kl_div(
                F.log_softmax(logits, dim=-1).reshape(-1, logits.shape[-1]),
                target_logp.reshape(-1, logits.shape[-1]),
                log_target=True,
                reduction="batchmean",
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % 25 == 0 or step == steps - 1:
            log.append({"step": step, "loss": round(loss.item(), 4), "seconds": round(time.perf_counter() - start, 1)})
            tqdm.write(f"{desc} step {step} loss {loss.item():.4f}")
    return log


def main(argv: list[str] | None = None, prog: str = "python -m specviz train") -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if "--english" in argv:  # the English pair's drafter: specviz.training.distill
        from specviz.training import distill

        return distill.main([a for a in argv if a != "--english"])
    if "--eagle-data" in argv:  # the EAGLE head's corpus: specviz.training.eagle_corpus
        from specviz.training import eagle_corpus

        return eagle_corpus.main([a for a in argv if a != "--eagle-data"])
    if "--onpolicy" in argv:  # the English pair's drafter, distilled on-policy: specviz.training.onpolicy
        from specviz.training import onpolicy

        return onpolicy.main([a for a in argv if a != "--onpolicy"])
    if "--eagle" in argv:  # the English pair's EAGLE head: specviz.training.eagle
        from specviz.training import eagle as eagle_train

        return eagle_train.main([a for a in argv if a != "--eagle"])
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("assets/models"), help="folder for tokenizer, target, drafter")
    parser.add_argument("--target-steps", type=int, default=1500)
    parser.add_argument("--drafter-steps", type=int, default=1200)
    parser.add_argument("--batch", type=int, default=8, help="sequences of 512 tokens per step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--skip-target", action="store_true", help="reuse the target in --out and only distil a "
                                                                   "drafter")
    args = parser.parse_args(argv)

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    files = corpus.stdlib_files()
    train_files, held = corpus.split(files)
    print(f"corpus: {len(train_files)} training files, {len(held)} held out")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    if args.skip_target:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(out / "target")
        target = AutoModelForCausalLM.from_pretrained(out / "target")
    else:
        t0 = time.perf_counter()
        tokenizer = train_tokenizer([f.text for f in train_files], VOCAB_SIZE)
        print(f"tokenizer: {len(tokenizer)} tokens in {time.perf_counter() - t0:.0f} s")
    train_data = encode_all(tokenizer, train_files)
    held_text = "".join(f.text for f in held)
    held_data = encode_all(tokenizer, held)
    print(f"training tokens: {len(train_data):,}; held-out tokens: {len(held_data):,}")
    gzip_bpb = gzip_bits_per_byte(held_text)
    n_bytes = len(held_text.encode()) + len(held)  # one byte-equivalent per EOS

    if not args.skip_target:
        torch.manual_seed(args.seed)
        target = build_model(TARGET_SHAPE, tokenizer).to(device)
        t0 = time.perf_counter()
        target_log = run_training(
            target, train_data.to(device), args.target_steps, args.batch, 2e-3, args.seed, "target"
        )
        target_seconds = time.perf_counter() - t0
        target = target.cpu()
        target_bpb = bits_per_byte(target, held_data, n_bytes)
        target.save_pretrained(out / "target")
        tokenizer.save_pretrained(out / "target")
        _write_log(
            out / "target",
            TARGET_SHAPE,
            target,
            args.target_steps,
            args.batch,
            target_seconds,
            target_bpb,
            gzip_bpb,
            target_log,
            "cross-entropy on the corpus",
        )
        print(f"target: {target_bpb:.3f} bits/byte on held-out code (gzip -9: {gzip_bpb:.3f})")

    torch.manual_seed(args.seed + 1)
    drafter = build_model(DRAFTER_SHAPE, tokenizer).to(device)
    target = target.to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    t0 = time.perf_counter()
    drafter_log = run_training(
        drafter, train_data.to(device), args.drafter_steps, args.batch, 3e-3, args.seed + 1, "drafter", teacher=target
    )
    drafter_seconds = time.perf_counter() - t0
    drafter = drafter.cpu()
    drafter_bpb = bits_per_byte(drafter, held_data, n_bytes)
    drafter.save_pretrained(out / "drafter")
    tokenizer.save_pretrained(out / "drafter")
    _write_log(
        out / "drafter",
        DRAFTER_SHAPE,
        drafter,
        args.drafter_steps,
        args.batch,
        drafter_seconds,
        drafter_bpb,
        gzip_bpb,
        drafter_log,
        "distilled from the target: KL(p_target || q_drafter)",
    )
    print(f"drafter: {drafter_bpb:.3f} bits/byte on held-out code (gzip -9: {gzip_bpb:.3f})")

    prompts = corpus.held_out_prompts(held)
    (out.parent / "prompts.json").write_text(json.dumps(prompts, indent=1) + "\n")
    print(f"wrote {len(prompts)} held-out prompts to {out.parent / 'prompts.json'}")


def _write_log(folder: Path, shape: ModelShape, model, steps, batch, seconds, bpb, gzip_bpb, log, objective) -> None:
    info = {
        "architecture": "GPT2LMHeadModel",
        "shape": asdict(shape),
        "parameters": sum(p.numel() for p in model.parameters()),
        "context": CONTEXT,
        "objective": objective,
        "steps": steps,
        "batch": f"{batch} x {CONTEXT} tokens",
        "train_seconds": round(seconds),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "torch_threads": torch.get_num_threads(),
        "held_out_bits_per_byte": round(bpb, 4),
        "gzip9_bits_per_byte": round(gzip_bpb, 4),
        "loss_log": log,
    }
    (folder / "training_log.json").write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
