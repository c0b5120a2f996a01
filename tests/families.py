"""Offline stand-ins for each hub preset's family: the real config and model classes at tiny sizes.

Each stand-in pair is a drafter and a target folder written with ``save_pretrained`` (safetensors,
``config.json``, ``generation_config.json``) and one tokenizer trained here with ``tokenizers``,
carrying the family's special tokens and chat template. They load through ``load_pair`` exactly as a
downloaded model does. Building all of them takes about a second.

Where the field values come from: the published ``config.json``, ``generation_config.json`` and
``tokenizer_config.json`` of the models named in each ``Family`` below, as recalled, because the model
hub cannot be reached from where these tests were written and no copy of those files is installed
(transformers' installed package names Qwen2.5-7B's 152,064 and Qwen2.5-0.5B's 151,936 embedding rows
in ``generation/candidate_generator.py``, and implements the ``llama3`` rope type and its four
parameters in ``modeling_rope_utils.py``; it holds none of the other values). Every copied value is
listed in ``published`` (written into ``config.json`` under the published field names, so loading
goes through transformers' conversion of the legacy ``rope_theta`` / ``rope_scaling`` fields as a
download would) and in ``generation``; sizes (width, depth, heads, vocabulary) are the stand-in's
own, keeping each model's ratio of attention heads to key-value heads.

The chat templates are written here in each family's format (ChatML, Llama 3's headers), not copied:
the published ones also add a default system turn and tool-calling branches, which these omit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

# Random weights at the published initializer_range (0.02) give nearly uniform next-token
# distributions at these widths, where every greedy step is a near-tie; 0.5 gives peaked ones,
# as a trained model's are. A stand-in's own value, not a published one.
INIT = 0.5
BPE_SIZE = 320  # byte-level BPE: 256 bytes and 64 merges, before the special tokens
SMALL_INIT = 0.15
SMALL_WORDS = 8  # the small-vocabulary variant for the statistical check (tests.test_exactness.VOCAB)

CORPUS = [
    "A small drafter proposes a few tokens and the large target scores them all in one pass.",
    "Each draft is accepted with probability min(1, p/q); the first rejected one is replaced.",
    "The correction token comes from the residual, and a bonus token comes from p when all are accepted.",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "The user asks a question and the assistant answers it in a few short sentences.",
    "Hello! How are you today? I am fine, thank you. What is the capital of France? Paris.",
    "system user assistant: speculative decoding keeps the output distribution of the target model.",
] * 4

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_CHAT = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@dataclass(frozen=True)
class Family:
    """One preset family: its classes, special tokens, published fields and the stand-in's sizes.

    ``first`` / ``last``: special tokens placed before / after the trained vocabulary, in the
    published order. ``tokens``: the tokenizer's bos/eos/pad/unk by token text. ``ids``: config
    fields that hold token ids, by token text. ``end_of_turn``: generation_config's eos tokens.
    ``published``: config fields copied from the published config.json (see the module's note).
    ``drafter`` / ``target``: the stand-in's sizes. ``extra_rows``: embedding rows beyond the
    tokenizer's size (drafter, target).
    """

    name: str
    preset: str
    model_class: type
    config_class: type
    first: tuple[str, ...]
    last: tuple[str, ...]
    tokens: dict
    ids: dict
    end_of_turn: tuple[str, ...]
    chat_template: str | None
    published: tuple[dict, dict]
    generation: dict
    drafter: dict
    target: dict
    extra_rows: tuple[int, int] = (0, 0)

    @property
    def instruct(self) -> bool:
        return self.chat_template is not None


# Llama 3.2 Instruct: values from meta-llama/Llama-3.2-1B-Instruct (drafter) and -3B-Instruct (target),
# config.json and generation_config.json. 1B: 32 heads over 8 key-value heads; 3B: 24 over 8.
LLAMA3_SPECIALS = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
)
LLAMA3_ROPE = dict(
    rope_theta=500000.0,
    rope_scaling=dict(factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0, original_max_position_embeddings=8192,
                      rope_type="llama3"),
)
LLAMA = Family(
    name="llama3.2",
    preset="Llama-3.2-1B-Instruct -> Llama-3.2-3B-Instruct",
    model_class=LlamaForCausalLM,
    config_class=LlamaConfig,
    first=(),
    last=LLAMA3_SPECIALS,
    tokens=dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
    ids=dict(bos_token_id="<|begin_of_text|>", eos_token_id=["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]),
    end_of_turn=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    chat_template=LLAMA3_CHAT,
    published=tuple(
        dict(
            LLAMA3_ROPE,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
            rms_norm_eps=1e-5,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
            torch_dtype="bfloat16",
        )
        for _ in range(2)
    ),
    generation=dict(do_sample=True, temperature=0.6, top_p=0.9),
    drafter=dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        num_hidden_layers=2,
        intermediate_size=64,
    ),
    target=dict(
        hidden_size=48,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=3,
        intermediate_size=96,
    ),
)

# SmolLM2 Instruct (LlamaForCausalLM, ChatML): HuggingFaceTB/SmolLM2-135M-Instruct (drafter, 9 heads over 3)
# and -360M-Instruct (target, 15 heads over 5); no rope scaling, tied embeddings, specials first.
SMOLLM = Family(
    name="smollm2",
    preset="SmolLM2-135M-Instruct -> SmolLM2-360M-Instruct",
    model_class=LlamaForCausalLM,
    config_class=LlamaConfig,
    first=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>", "<filename>"),
    last=(),
    tokens=dict(bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>", unk_token="<|endoftext|>"),
    ids=dict(bos_token_id="<|im_start|>", eos_token_id="<|im_end|>", pad_token_id="<|im_end|>"),
    end_of_turn=("<|im_end|>",),
    chat_template=CHATML,
    published=tuple(
        dict(
            rope_theta=100000.0,
            rope_scaling=None,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            rms_norm_eps=1e-5,
            hidden_act="silu",
            torch_dtype="bfloat16",
        )
        for _ in range(2)
    ),
    generation=dict(),
    drafter=dict(
        hidden_size=24, num_attention_heads=3, num_key_value_heads=1, num_hidden_layers=2, intermediate_size=64
    ),
    target=dict(
        hidden_size=48, num_attention_heads=6, num_key_value_heads=2, num_hidden_layers=3, intermediate_size=96
    ),
)

# Qwen2.5 Instruct: Qwen/Qwen2.5-0.5B-Instruct (drafter: 14 heads over 2, tied, 151,936 rows) and
# Qwen/Qwen2.5-7B-Instruct (target: 28 heads over 4, untied, 152,064 rows); both tokenizers 151,665
# tokens, so the tables carry 271 and 399 rows beyond it (the stand-in: 16 and 48).
# Least certain of these: sliding_window and max_window_layers, which are inert while use_sliding_window is false.
QWEN = Family(
    name="qwen2.5",
    preset="Qwen2.5-0.5B-Instruct -> Qwen2.5-7B-Instruct",
    model_class=Qwen2ForCausalLM,
    config_class=Qwen2Config,
    first=(),
    last=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>"),
    tokens=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
    ids=dict(bos_token_id="<|endoftext|>", eos_token_id="<|im_end|>"),
    end_of_turn=("<|im_end|>", "<|endoftext|>"),
    chat_template=CHATML,
    published=(
        dict(
            rope_theta=1000000.0,
            rope_scaling=None,
            max_position_embeddings=32768,
            sliding_window=32768,
            use_sliding_window=False,
            max_window_layers=21,
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            hidden_act="silu",
            torch_dtype="bfloat16",
        ),
        dict(
            rope_theta=1000000.0,
            rope_scaling=None,
            max_position_embeddings=32768,
            sliding_window=131072,
            use_sliding_window=False,
            max_window_layers=28,
            tie_word_embeddings=False,
            rms_norm_eps=1e-6,
            hidden_act="silu",
            torch_dtype="bfloat16",
        ),
    ),
    generation=dict(
        pad_token_id="<|endoftext|>", do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05
    ),
    drafter=dict(
        hidden_size=56, num_attention_heads=7, num_key_value_heads=1, num_hidden_layers=2, intermediate_size=96
    ),
    target=dict(
        hidden_size=56, num_attention_heads=14, num_key_value_heads=2, num_hidden_layers=3, intermediate_size=128
    ),
    extra_rows=(16, 48),
)

# GPT-2: openai-community/gpt2 (drafter) and gpt2-large (target); <|endoftext|> is the last token and
# both bos and eos; no chat template.
GPT2 = Family(
    name="gpt2",
    preset="gpt2 -> gpt2-large",
    model_class=GPT2LMHeadModel,
    config_class=GPT2Config,
    first=(),
    last=("<|endoftext|>",),
    tokens=dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"),
    ids=dict(bos_token_id="<|endoftext|>", eos_token_id="<|endoftext|>"),
    end_of_turn=("<|endoftext|>",),
    chat_template=None,
    published=tuple(
        dict(n_positions=1024, activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True)
        for _ in range(2)
    ),
    generation=dict(),
    drafter=dict(n_embd=32, n_head=2, n_layer=1),
    target=dict(n_embd=48, n_head=4, n_layer=2),
)

FAMILIES = {f.name: f for f in (SMOLLM, LLAMA, QWEN, GPT2)}


def train_tokenizer(family: Family, small: bool = False) -> PreTrainedTokenizerFast:
    """The family's tokenizer: byte-level BPE trained on CORPUS (or SMALL_WORDS words), its special tokens in place.

    The small variant is a word-level vocabulary of exactly SMALL_WORDS tokens that still holds the
    family's end-of-turn and bos tokens, for the statistical check.
    """
    if small:
        needed = list(dict.fromkeys(t for t in (*family.tokens.values(), *family.end_of_turn)))
        words = [f"w{i}" for i in range(SMALL_WORDS - len(needed))]
        vocab = needed + words if family.first else words + needed
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=vocab[0]))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.add_special_tokens([AddedToken(t, special=True) for t in needed])
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=BPE_SIZE + len(family.first),
            special_tokens=list(family.first),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(CORPUS, trainer)
        tok.add_special_tokens([AddedToken(t, special=True) for t in family.last])
        assert all(tok.token_to_id(t) == i for i, t in enumerate(family.first))
        assert all(tok.token_to_id(t) == tok.get_vocab_size() - len(family.last) + i for i, t in enumerate(family.last))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **family.tokens)
    if family.chat_template:
        fast.chat_template = family.chat_template
    return fast


def _token_ids(tok, value):
    if isinstance(value, list):
        return [tok.convert_tokens_to_ids(v) for v in value]
    return tok.convert_tokens_to_ids(value) if isinstance(value, str) else value


def _config(family: Family, which: int, tok, rows: int, small: bool):
    sizes = dict(family.drafter if which == 0 else family.target)
    init = SMALL_INIT if small else INIT
    if small:
        sizes["n_layer" if family.model_class is GPT2LMHeadModel else "num_hidden_layers"] = 1
    published = dict(family.published[which])
    ids = {k: _token_ids(tok, v) for k, v in family.ids.items()}
    kwargs = {k: v for k, v in published.items() if k not in ("torch_dtype", "rope_scaling", "rope_theta")}
    if family.model_class is GPT2LMHeadModel:
        config = GPT2Config(vocab_size=rows, initializer_range=init, **kwargs, **sizes, **ids)
    else:
        rope = dict(published["rope_scaling"] or {"rope_type": "default"}, rope_theta=published["rope_theta"])
        config = family.config_class(
            vocab_size=rows, initializer_range=init, rope_parameters=rope, **kwargs, **sizes, **ids
        )
    return config, published


def _write_published_fields(folder: Path, published: dict) -> None:
    """config.json as the hub publishes it: rope_theta and rope_scaling, not transformers 5's rope_parameters."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    if "rope_theta" in published:
        config.pop("rope_parameters", None)
        config["rope_theta"] = published["rope_theta"]
        config["rope_scaling"] = published["rope_scaling"]
    config["torch_dtype"] = published.get("torch_dtype", config.get("dtype"))
    path.write_text(json.dumps(config, indent=2))


def save_pair(family: Family, folder: Path, small: bool = False, seed: int = 0) -> tuple[str, str]:
    """Write the family's stand-in drafter and target to ``folder``/drafter and ``folder``/target.

    ``small``: the variant for the statistical check: SMALL_WORDS tokens, one layer each, and
    weights drawn at SMALL_INIT (spread-out distributions: most of the 64 two-token cells are
    reachable, and the drafter's drafts are often accepted).

    Returns:
        (drafter folder, target folder), ready for ``load_pair(drafter=..., target=..., allow_custom=True)``.
    """
    tok = train_tokenizer(family, small)
    size = len(tok)
    out = []
    for which, role in enumerate(("drafter", "target")):
        # The small variant keeps the rows beyond the tokenizer (2 and 4) few enough that the tokenizer's 8 hold most
        # mass.
        rows = size + (min(family.extra_rows[which], 2 * (which + 1)) if small else family.extra_rows[which])
        config, published = _config(family, which, tok, rows, small)
        torch.manual_seed(seed * 2 + which)
        model = family.model_class(config).eval()
        generation = {k: _token_ids(tok, v) for k, v in family.generation.items()}
        model.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id,
            eos_token_id=[tok.convert_tokens_to_ids(t) for t in family.end_of_turn]
            if len(family.end_of_turn) > 1
            else tok.convert_tokens_to_ids(family.end_of_turn[0]),
            **generation,
        )
        path = Path(folder) / role
        model.save_pretrained(path)
        tok.save_pretrained(path)
        _write_published_fields(path, published)
        out.append(str(path))
    return out[0], out[1]


def end_of_turn_ids(family: Family, tokenizer) -> list[int]:
    """The ids that end a reply, as ``Pair.eos_token_ids`` should list them: the tokenizer's eos first."""
    ids = [tokenizer.eos_token_id] + [tokenizer.convert_tokens_to_ids(t) for t in family.end_of_turn]
    return list(dict.fromkeys(ids))
