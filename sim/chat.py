#!/usr/bin/env python3
"""Ask the simulated pair's endpoint what a client would, with the official OpenAI SDK: one
chat question (its thinking and its answer) and one request offering a tool.

The questions are the tiny model's scripted ones (sim/models/conversations.json), so the
answers are readable and known. Usage: chat.py [BASE_URL] (default: the sim head's endpoint).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import openai
import yaml

ROOT = Path(__file__).resolve().parent.parent
SERVE = yaml.safe_load((ROOT / "inventories/sim/group_vars/all/serve.yml").read_text())
# The serving port vllm_serve derives from spark_defaults.
SHARED = yaml.safe_load((ROOT / "roles/spark_defaults/defaults/main.yml").read_text())
PORT = SHARED["spark_serving_port"]
SCRIPT = json.loads((ROOT / "sim/models/conversations.json").read_text())


def head_url() -> str:
    sys.path.insert(0, str(ROOT / "sim"))
    import simctl

    return f"http://{simctl.read_nodes()[0].mgmt_ip}:{PORT}/v1"


def main() -> int:
    base_url = sys.argv[1] if len(sys.argv) > 1 else head_url()
    client = openai.OpenAI(base_url=base_url, api_key=SERVE["vllm_serve_api_key"], timeout=120)
    model = SERVE["vllm_serve_served_model_name"]
    chats = {chat["name"]: chat for chat in SCRIPT["chats"]}
    print(f"Chat with {model} at {base_url} (OpenAI Python SDK {openai.__version__}):")
    for name in ("capital", "weather"):
        chat = chats[name]
        tools = [SCRIPT["tools"][tool] for tool in chat.get("tools", [])]
        answer = client.chat.completions.create(
            model=model, messages=chat["messages"], temperature=0,
            **({"tools": tools} if tools else {}),
        )  # fmt: skip
        message = answer.choices[0].message
        # vLLM 0.32 names the thinking `reasoning`; earlier releases `reasoning_content`.
        thought = getattr(message, "reasoning", None) or getattr(message, "reasoning_content", "")
        print(f"  user:      {chat['messages'][-1]['content']}")
        if tools:
            print(f"  tools:     {', '.join(t['function']['name'] for t in tools)}")
        print(f"  reasoning: {(thought or '').strip()}")
        for call in message.tool_calls or []:
            print(f"  tool call: {call.function.name}({call.function.arguments})")
        if (message.content or "").strip():
            print(f"  answer:    {message.content.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
