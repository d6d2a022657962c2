"""Write one of the sim's tiny checkpoints: weights that give known answers, and chat.

Runs inside the vllm-donor image (torch, tokenizers, transformers, safetensors); no network.
Usage: make_tiny_model.py OUT_DIR [NAME]

NAME picks the architecture (MODELS): tiny-qwen3-moe (the default, Qwen3MoeForCausalLM) or
tiny-qwen3 (a dense Qwen3ForCausalLM: the architecture the sim's base lacks, so that a
profile serving it needs the donor's vLLM). Both learn the same replies with the same
tokenizer; they differ in their MLP (four experts, top two, against one dense MLP).

- A byte-level BPE tokenizer trained on a fixed corpus, with ChatML's turn markers and
  Qwen's <think> and <tool_call> markers as single added tokens (vLLM's qwen3 parsers look
  them up by id), and chat_template.jinja (Qwen3.5's token format) in tokenizer_config.json.
- Weights trained for seconds on the scripted replies of conversations.json, until greedy
  decoding gives each one with a margin that survives bfloat16, then written as safetensors
  in two shards with an index, as a real checkpoint is.
- Deterministic: a fixed corpus, fixed seeds, one thread, sorted JSON; the same image gives
  the same bytes. The replies are checked before the weights are written; a failed check
  exits non-zero.
Sizes are the smallest measured to run on vLLM's CPU backend (head_dim 64; 16 is refused).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sys
import time

STARTED = time.monotonic()
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
SEED = 20261130
BPE_VOCAB = 1024
# Special tokens (skipped when decoding) take the first ids, as in Qwen's vocabulary.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Markers the parsers read in the decoded text: added tokens, not special.
MARKERS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
]  # fmt: skip
MAX_STEPS = 1500
LEARNING_RATE = 3e-3
# Logit lead of every scripted token over the runner-up before training stops: wide enough
# that bfloat16 inference picks the same tokens.
MARGIN = 4.0
# The plain lines' share of the loss, against 1 for the scripted replies.
BACKGROUND_WEIGHT = 0.2
SHARDS = 2

# What both architectures share (the attention, the norms, the positions, the vocabulary).
COMMON = {
    "vocab_size": 1088,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 2,
}
MODELS = {
    "tiny-qwen3-moe": {
        **COMMON,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
    },
    # One dense MLP per layer, as wide as the MoE's four experts together (4 x 32).
    "tiny-qwen3": {
        **COMMON,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "intermediate_size": 128,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": COMMON["num_hidden_layers"],
    },
}
DEFAULT_MODEL = "tiny-qwen3-moe"


def is_moe(c: dict) -> bool:
    return "num_experts" in c


WORDS = [
    "spark", "node", "cluster", "ray", "vllm", "tensor", "parallel", "link", "memory", "model",
    "weight", "token", "expert", "router", "layer", "head", "cache", "serve", "answer",
    "question", "the", "a", "of", "to", "and", "in", "is", "for", "on", "with", "as", "by", "at",
    "from", "this", "that", "it", "be", "are", "was", "were", "one", "two", "three", "four",
]  # fmt: skip


def background() -> list[str]:
    """Plain text without an end: a completion of anything else goes on with words."""
    lines = []
    for i in range(48):
        picked = [WORDS[(i * 7 + j * 13) % len(WORDS)] for j in range(12)]
        lines.append(" ".join(picked) + f" {i}.")
    return lines


# ---------------------------------------------------------------- tokenizer


def build_tokenizer(texts: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    return tokenizer


def write_tokenizer(out: pathlib.Path, tokenizer: Tokenizer, template: str) -> None:
    data = json.loads(tokenizer.to_str())
    (out / "tokenizer.json").write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": COMMON["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "chat_template": template,
    }
    write_json(out / "tokenizer_config.json", config)


def write_json(path: pathlib.Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- scripted data


def reply_text(reply: dict, thinking: bool) -> str:
    """What the model writes after the generation prompt (which opens <think>\\n)."""
    text = reply.get("reasoning", "") + "\n</think>\n\n" if thinking else ""
    text += reply.get("content", "")
    for i, call in enumerate(reply.get("tool_calls", [])):
        text += "\n" if i else "\n\n" if reply.get("content") else ""
        text += f"<tool_call>\n<function={call['name']}>\n"
        for name, value in call["arguments"].items():
            text += f"<parameter={name}>\n{value}\n</parameter>\n"
        text += "</function>\n</tool_call>"
    return text


def scripted(script: dict, hf_tokenizer) -> list[tuple[str, str, str]]:
    """(prompt, reply, end token) texts; chat prompts rendered by the template as vLLM does."""
    texts = []
    for chat in script["chats"]:
        thinking = chat.get("enable_thinking", True)
        tools = [script["tools"][name] for name in chat.get("tools", [])] or None
        # The API sends a tool call's arguments as JSON text; vLLM gives templates a mapping.
        messages = json.loads(json.dumps(chat["messages"]))
        for message in messages:
            for call in message.get("tool_calls", []):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        prompt = hf_tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False,
            enable_thinking=thinking,
        )  # fmt: skip
        texts.append((prompt, reply_text(chat["reply"], thinking), "<|im_end|>"))
    for completion in script["completions"]:
        texts.append((completion["prompt"], completion["text"], "<|endoftext|>"))
    return texts


def encode(hf_tokenizer, text: str) -> list[int]:
    return hf_tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------- model


def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + COMMON["rms_norm_eps"]))


def init_weights(c: dict) -> dict[str, torch.Tensor]:
    """Qwen3's or Qwen3-MoE's checkpoint names and shapes (the MoE's per expert, as the
    published checkpoints)."""
    h, hd = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd

    def normal(*shape: int, fan_in: int) -> torch.Tensor:
        return torch.randn(*shape) / math.sqrt(fan_in)

    w = {"model.embed_tokens.weight": torch.randn(c["vocab_size"], h) * 0.5}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        w[p + "input_layernorm.weight"] = torch.ones(h)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h)
        w[p + "self_attn.q_proj.weight"] = normal(q, h, fan_in=h)
        w[p + "self_attn.k_proj.weight"] = normal(kv, h, fan_in=h)
        w[p + "self_attn.v_proj.weight"] = normal(kv, h, fan_in=h)
        w[p + "self_attn.o_proj.weight"] = normal(h, q, fan_in=q) * 0.5
        w[p + "self_attn.q_norm.weight"] = torch.ones(hd)
        w[p + "self_attn.k_norm.weight"] = torch.ones(hd)
        if not is_moe(c):
            i = c["intermediate_size"]
            w[p + "mlp.gate_proj.weight"] = normal(i, h, fan_in=h)
            w[p + "mlp.up_proj.weight"] = normal(i, h, fan_in=h)
            w[p + "mlp.down_proj.weight"] = normal(h, i, fan_in=i) * 0.5
            continue
        e, i = c["num_experts"], c["moe_intermediate_size"]
        w[p + "mlp.gate.weight"] = normal(e, h, fan_in=h)
        for x in range(e):
            w[p + f"mlp.experts.{x}.gate_proj.weight"] = normal(i, h, fan_in=h)
            w[p + f"mlp.experts.{x}.up_proj.weight"] = normal(i, h, fan_in=h)
            w[p + f"mlp.experts.{x}.down_proj.weight"] = normal(h, i, fan_in=i) * 0.5
    w["model.norm.weight"] = torch.ones(h)
    w["lm_head.weight"] = normal(c["vocab_size"], h, fan_in=h)
    return w


def rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, halves rotated (the neox layout Qwen uses); x is [B, heads, T, hd]."""
    hd = x.shape[-1]
    inv = 1.0 / (COMMON["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    angles = torch.arange(x.shape[-2], dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    first, second = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-second, first], -1) * sin


def forward(c: dict, w: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """Hidden states before the LM head for ids [B, T] (right-padded; attention is causal)."""
    bsz, t = ids.shape
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    x = w["model.embed_tokens.weight"][ids]
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(bsz, t, nh, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(bsz, t, nkv, hd)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(bsz, t, nkv, hd)
        q = rope(rms(q, w[p + "self_attn.q_norm.weight"]).transpose(1, 2))
        k = rope(rms(k, w[p + "self_attn.k_norm.weight"]).transpose(1, 2))
        att = F.scaled_dot_product_attention(
            q, k, v.transpose(1, 2), is_causal=True, enable_gqa=nh != nkv
        )
        x = x + att.transpose(1, 2).reshape(bsz, t, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        if not is_moe(c):
            y = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
            x = x + y @ w[p + "mlp.down_proj.weight"].T
            continue
        # Softmax over the experts, the top k renormalized (norm_topk_prob); computed densely.
        probs = torch.softmax(h @ w[p + "mlp.gate.weight"].T, dim=-1)
        top, idx = probs.topk(c["num_experts_per_tok"], dim=-1)
        top = top / top.sum(-1, keepdim=True)
        gates = torch.zeros_like(probs).scatter(-1, idx, top)
        moe = torch.zeros_like(x)
        for e in range(c["num_experts"]):
            pe = p + f"mlp.experts.{e}."
            y = F.silu(h @ w[pe + "gate_proj.weight"].T) * (h @ w[pe + "up_proj.weight"].T)
            moe = moe + gates[..., e : e + 1] * (y @ w[pe + "down_proj.weight"].T)
        x = x + moe
    return rms(x, w["model.norm.weight"])


# ---------------------------------------------------------------- training


def batch(rows: list[tuple[list[int], int]], pad: int, weight: float):
    """Right-padded ids, the next token at each position, and each prediction's loss weight
    (from a row's start on: a reply's first token, or a plain line's second)."""
    width = max(len(seq) for seq, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    weights = torch.zeros(len(rows), width)
    for row, (seq, start) in enumerate(rows):
        ids[row, : len(seq)] = torch.tensor(seq)
        weights[row, start - 1 : len(seq) - 1] = weight
    return ids, torch.roll(ids, -1, dims=1), weights


def scripted_margin(c, w, ids, targets, weights) -> float:
    """The smallest lead of a scripted token over the best other token."""
    with torch.no_grad():
        mask = weights > 0
        logits = forward(c, w, ids)[mask] @ w["lm_head.weight"].T
        target = targets[mask]
        right = logits.gather(1, target[:, None])[:, 0]
        logits.scatter_(1, target[:, None], float("-inf"))
        return float((right - logits.max(1).values).min())


def train(c: dict, pairs, lines, pad: int) -> tuple[dict[str, torch.Tensor], int]:
    torch.manual_seed(SEED)
    w = {k: v.requires_grad_() for k, v in init_weights(c).items()}
    opt = torch.optim.Adam(w.values(), lr=LEARNING_RATE)
    # Two batches, so that short plain lines are not padded to a chat prompt's length.
    n_reply = sum(len(r) for _, r in pairs)
    n_plain = sum(len(line) - 1 for line in lines)
    scripted = batch([(p + r, len(p)) for p, r in pairs], pad, 1.0 / n_reply)
    plain = batch([(line, 1) for line in lines], pad, BACKGROUND_WEIGHT / n_plain)
    for step in range(1, MAX_STEPS + 1):
        loss = torch.zeros(())
        for ids, targets, weights in (scripted, plain):
            mask = weights > 0
            logits = forward(c, w, ids)[mask] @ w["lm_head.weight"].T
            ce = F.cross_entropy(logits, targets[mask], reduction="none")
            loss = loss + (ce * weights[mask]).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            margin = scripted_margin(c, w, *scripted)
            print(f"step {step}: loss {loss.item():.4f}, margin {margin:.2f}", flush=True)
            if margin >= MARGIN:
                return {k: v.detach() for k, v in w.items()}, step
    raise SystemExit(f"training did not reach a margin of {MARGIN} in {MAX_STEPS} steps")


def greedy(c: dict, w: dict, prompt: list[int], stop: set[int], limit: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(limit):
            nxt = int((forward(c, w, torch.tensor([ids]))[0, -1] @ w["lm_head.weight"].T).argmax())
            ids.append(nxt)
            if nxt in stop:
                break
    return ids[len(prompt) :]


def check(c, w, pairs, hf_tokenizer, stop: set[int]) -> None:
    """Greedy decoding with the bfloat16 weights gives every scripted reply, and plain text
    goes on with words (the sim's tests ask completions of N tokens from short prompts)."""
    w16 = {k: v.to(torch.bfloat16).float() for k, v in w.items()}
    for prompt, reply in pairs:
        got = greedy(c, w16, prompt, stop, len(reply) + 4)
        if got != reply:
            raise SystemExit(
                f"after {hf_tokenizer.decode(prompt)!r} the model writes "
                f"{hf_tokenizer.decode(got)!r}, not {hf_tokenizer.decode(reply)!r}"
            )
    for text in ("spark", "spark node cluster", "Hi", "ping"):
        got = greedy(c, w16, encode(hf_tokenizer, text), stop, 8)
        if stop & set(got):
            raise SystemExit(f"a completion of {text!r} ends early: {hf_tokenizer.decode(got)!r}")


# ---------------------------------------------------------------- checkpoint


def write_shards(out: pathlib.Path, w: dict[str, torch.Tensor]) -> None:
    """Layer-aligned shards and model.safetensors.index.json, as published checkpoints."""

    def shard_of(name: str) -> int:
        if name.startswith("model.layers."):
            layer = int(name.split(".")[2])
            return min(SHARDS - 1, layer * SHARDS // COMMON["num_hidden_layers"])
        return 0 if name == "model.embed_tokens.weight" else SHARDS - 1

    files = [f"model-{n + 1:05d}-of-{SHARDS:05d}.safetensors" for n in range(SHARDS)]
    weight_map, total = {}, 0
    for n, name in enumerate(files):
        tensors = {
            k: v.to(torch.bfloat16).contiguous() for k, v in sorted(w.items()) if shard_of(k) == n
        }
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    write_json(
        out / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )


def main(out: pathlib.Path, name: str, started: float) -> None:
    c = MODELS[name]
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    script = json.loads((HERE / "conversations.json").read_text(encoding="utf-8"))
    template = (HERE / "chat_template.jinja").read_text(encoding="utf-8")
    out.mkdir(parents=True, exist_ok=True)

    from transformers import AutoTokenizer  # renders the chat template as vLLM does

    print(f"imports done in {time.monotonic() - started:.1f}s", flush=True)

    # A first tokenizer renders the scripted prompts; the final one learns them as rendered.
    first = build_tokenizer([json.dumps(script), template, *background()])
    write_tokenizer(out, first, template)
    texts = scripted(script, AutoTokenizer.from_pretrained(str(out)))
    tokenizer = build_tokenizer([t for triple in texts for t in triple[:2]] + background())
    if tokenizer.get_vocab_size() > c["vocab_size"]:
        raise SystemExit(f"vocabulary of {tokenizer.get_vocab_size()} exceeds the config's")
    write_tokenizer(out, tokenizer, template)
    hf_tokenizer = AutoTokenizer.from_pretrained(str(out))

    vocab = hf_tokenizer.get_vocab()
    for token in SPECIAL_TOKENS + MARKERS:
        if token not in vocab or encode(hf_tokenizer, token) != [vocab[token]]:
            raise SystemExit(f"{token} is not a single token of the vocabulary")
    if scripted(script, hf_tokenizer) != texts:
        raise SystemExit("the chat template renders differently with the final tokenizer")
    pairs = [
        (encode(hf_tokenizer, prompt), encode(hf_tokenizer, reply) + [vocab[end]])
        for prompt, reply, end in texts
    ]
    lines = [encode(hf_tokenizer, line) for line in background()]
    tokens = sum(len(p) + len(r) for p, r in pairs) + sum(map(len, lines))
    print(f"{len(pairs)} scripted replies and {len(lines)} lines, {tokens} tokens", flush=True)

    eos = {vocab["<|endoftext|>"], vocab["<|im_end|>"]}
    mark = time.monotonic()
    weights, steps = train(c, pairs, lines, pad=vocab["<|endoftext|>"])
    print(f"trained in {time.monotonic() - mark:.1f}s", flush=True)
    mark = time.monotonic()
    check(c, weights, pairs, hf_tokenizer, eos)
    print(f"replies checked in {time.monotonic() - mark:.1f}s", flush=True)
    write_shards(out, weights)
    write_json(out / "config.json", {**c, "eos_token_id": vocab["<|im_end|>"]})
    write_json(
        out / "generation_config.json",
        {"bos_token_id": vocab["<|endoftext|>"], "eos_token_id": sorted(eos)},
    )
    for path in out.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; every node's user reads the copies
    print(f"{name} written to {out}: {steps} steps, {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] and sys.argv[2] not in MODELS:
        raise SystemExit(f"usage: make_tiny_model.py OUT_DIR [{' | '.join(MODELS)}]")
    main(pathlib.Path(sys.argv[1]), sys.argv[2] if len(sys.argv) == 3 else DEFAULT_MODEL, STARTED)
