"""Write a tiny Qwen3-MoE model directory for ``vllm serve --load-format dummy``.

Runs inside the vllm-donor image (it has ``tokenizers``); no network. The output
is deterministic: a fixed corpus, a single-threaded BPE trainer, sorted JSON.
Sizes are the smallest ones measured to run on vLLM's CPU backend (SIM.md).
"""

import json
import os
import pathlib
import sys

os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def corpus() -> list[str]:
    """A fixed English-ish corpus, large enough for 512 merges."""
    words = [
        "spark",
        "node",
        "cluster",
        "ray",
        "vllm",
        "tensor",
        "parallel",
        "link",
        "memory",
        "model",
        "weight",
        "token",
        "expert",
        "router",
        "layer",
        "head",
        "cache",
        "serve",
        "answer",
        "question",
        "the",
        "a",
        "of",
        "to",
        "and",
        "in",
        "is",
        "for",
        "on",
        "with",
        "as",
        "by",
        "at",
        "from",
        "this",
        "that",
        "it",
        "be",
        "are",
        "was",
        "were",
        "one",
        "two",
        "three",
        "four",
    ]
    lines = []
    for i in range(400):
        picked = [words[(i * 7 + j * 13) % len(words)] for j in range(12)]
        lines.append(" ".join(picked) + f" {i}.")
    return lines


def build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def main(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(out / "tokenizer.json"))
    # Re-serialize with sorted keys so identical inputs give identical bytes.
    data = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    (out / "tokenizer.json").write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": CONFIG["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }
    files = {
        "config.json": CONFIG,
        "tokenizer_config.json": tokenizer_config,
        "generation_config.json": {"bos_token_id": 0, "eos_token_id": 0},
    }
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", "utf-8")
    print(f"tiny model written to {out}")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
