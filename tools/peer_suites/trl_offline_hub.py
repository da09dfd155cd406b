# SPDX-License-Identifier: Apache-2.0
"""Builds, under a folder, local stand-ins for the Hub repositories TRL's GRPO tests load, so those
tests run with no network: `from_pretrained("trl-internal-testing/tiny-...")` and
`load_dataset("trl-internal-testing/zen", ...)` read a local folder of that name first.

The stand-ins are not TRL's files: tiny random models of the same classes, one byte-level
tokenizer with a chat template, and a prompt-only dataset in both formats. A test that depends on
the real files (a vocabulary, a model's exact outputs) can fail on them, so tools/peer_suites/run
runs the suite twice, with TRL's trainer and with rlpt's, and reports only the tests whose result
differs.

    python trl_offline_hub.py DIR [--qwen-vocab]
"""

import json
import os
import sys

import torch
import transformers

# The Zen of Python, cut as the Hub dataset's prompts (a test checks the first twelve in order)
PROMPTS = [
    "Beautiful is better than",
    "Explicit is",
    "Simple is better",
    "Complex",
    "Flat is better than",
    "Sparse is better",
    "Readability",
    "Special cases aren't special",
    "Although practicality beats",
    "Errors should never",
    "Unless explicitly",
    "In the face of ambiguity, refuse",
    "There should be one",
    "Although that way may not",
    "Now is better",
    "Although never is often",
    "If the implementation is hard",
    "If the implementation is easy",
    "Namespaces are one",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }} {{ message['content'] }}<|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def tokenizer(qwen_vocab):
    # Byte-level BPE with no merges (one token per byte), as a Qwen2 tokenizer: transformers 5 loads
    # a checkpoint's tokenizer as its model type's class, which must read the saved files as written.
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    # qwen_vocab: Qwen2.5's special-token ids and vocabulary size, which two tests write out
    # (151643, 151645), and over 151,665 tokens a random model seldom ends a completion, as another
    # assumes; each training step then costs ten times as much on the CPU. Otherwise 259 tokens.
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    while qwen_vocab and len(vocab) < 151643:
        vocab[f"<|filler_{len(vocab)}|>"] = len(vocab)
    for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[t] = len(vocab)
    while qwen_vocab and len(vocab) < 151665:
        vocab[f"<|filler_{len(vocab)}|>"] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab, merges=[], unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tok.padding_side = "left"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def small(config_cls, vocab, **extra):
    kw = dict(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    kw.update(extra)
    return config_cls(**kw)


def save_model(root, name, model, tok):
    path = os.path.join(root, "trl-internal-testing", name)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)


def save_dataset(root):
    path = os.path.join(root, "trl-internal-testing", "zen")
    configs = {
        "standard_prompt_only": [{"prompt": p} for p in PROMPTS],
        "conversational_prompt_only": [{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS],
    }
    yaml = ["---", "configs:"]
    for name, rows in configs.items():
        os.makedirs(os.path.join(path, name), exist_ok=True)
        # 17 train and 2 test rows
        for split, part in (("train", rows[:17]), ("test", rows[17:])):
            with open(os.path.join(path, name, f"{split}.jsonl"), "w") as f:
                for r in part:
                    f.write(json.dumps(r) + "\n")
        yaml += [
            f"- config_name: {name}",
            "  data_files:",
            "  - split: train",
            f"    path: {name}/train.jsonl",
            "  - split: test",
            f"    path: {name}/test.jsonl",
        ]
    yaml.append("---")
    with open(os.path.join(path, "README.md"), "w") as f:
        f.write("\n".join(yaml) + "\n")


def main(root, qwen_vocab):
    torch.manual_seed(0)
    tok = tokenizer(qwen_vocab)
    v = len(tok)
    tf = transformers
    pad = {"pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id}
    causal = {
        "tiny-Qwen2ForCausalLM-2.5": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {}),
        "tiny-Qwen3ForCausalLM": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {"head_dim": 4}),
        "tiny-LlamaForCausalLM-3.2": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
        "tiny-MistralForCausalLM-0.2": (tf.MistralConfig, tf.MistralForCausalLM, {}),
        "tiny-Qwen3MoeForCausalLM": (
            tf.Qwen3MoeConfig,
            tf.Qwen3MoeForCausalLM,
            {"head_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
        ),
        "tiny-Gemma2ForCausalLM": (tf.Gemma2Config, tf.Gemma2ForCausalLM, {"head_dim": 4}),
        "tiny-Cohere2ForCausalLM": (tf.Cohere2Config, tf.Cohere2ForCausalLM, {}),
        "tiny-GptOssForCausalLM": (
            tf.GptOssConfig,
            tf.GptOssForCausalLM,
            {"head_dim": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
             "rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}},
        ),
        "tiny-Glm4MoeForCausalLM": (
            tf.Glm4MoeConfig,
            tf.Glm4MoeForCausalLM,
            {"head_dim": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
             "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1},
        ),
    }
    for name, (cfg, cls, extra) in causal.items():
        save_model(root, name, cls(small(cfg, v, **pad, **extra)), tok)
    classifiers = {
        "tiny-Qwen2ForSequenceClassification-2.5": (tf.Qwen2Config, tf.Qwen2ForSequenceClassification, {}),
        "tiny-Qwen3ForSequenceClassification": (tf.Qwen3Config, tf.Qwen3ForSequenceClassification, {"head_dim": 4}),
        "tiny-LlamaForSequenceClassification-3.2": (tf.LlamaConfig, tf.LlamaForSequenceClassification, {}),
    }
    for name, (cfg, cls, extra) in classifiers.items():
        save_model(root, name, cls(small(cfg, v, num_labels=1, **pad, **extra)), tok)
    save_dataset(root)


if __name__ == "__main__":
    main(sys.argv[1], "--qwen-vocab" in sys.argv[2:])
