"""The endpoint as clients see it, through the official OpenAI Python SDK: the tiny model's
known answers (sim/models/conversations.json), its thinking split from its answer by the
qwen3 reasoning parser, and a tool call parsed by the qwen3_coder tool-call parser.

DGX_SPARK_CHAT_ENDPOINT=http://HOST:PORT/v1 points these tests at another server of the
tiny model (e.g. `vllm serve` in the donor image alone, with the sim inventory's key)."""

from __future__ import annotations

import json
import os

import openai
import pytest
import yaml
from conftest import INVENTORY, ROOT, drills

SERVE = yaml.safe_load((INVENTORY / "group_vars/all/serve.yml").read_text())
# The port every role reads (vllm_serve_port derives from it); the sim inventory keeps it.
SHARED = yaml.safe_load((ROOT / "roles/spark_defaults/defaults/main.yml").read_text())
PORT = SHARED["spark_serving_port"]
MODEL = drills.SERVED_MODEL
SCRIPT = json.loads((ROOT / "sim/models/conversations.json").read_text())
CHATS = {chat["name"]: chat for chat in SCRIPT["chats"]}


@pytest.fixture(scope="module")
def base_url(request) -> str:
    if os.environ.get("DGX_SPARK_CHAT_ENDPOINT"):
        return os.environ["DGX_SPARK_CHAT_ENDPOINT"]
    nodes = request.getfixturevalue("deployed_pair")
    return f"http://{nodes[0].mgmt_ip}:{PORT}/v1"


@pytest.fixture(scope="module")
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=base_url, api_key=SERVE["vllm_serve_api_key"], timeout=120, max_retries=0
    )


def reasoning(message) -> str | None:
    """vLLM 0.32 names the thinking `reasoning`; earlier releases `reasoning_content`."""
    return getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None)


def ask(client, name: str, **extra):
    chat = CHATS[name]
    tools = [SCRIPT["tools"][tool] for tool in chat.get("tools", [])]
    if "enable_thinking" in chat:
        extra["extra_body"] = {"chat_template_kwargs": {"enable_thinking": chat["enable_thinking"]}}
    return client.chat.completions.create(
        model=MODEL, messages=chat["messages"], temperature=0, max_tokens=64,
        **({"tools": tools} if tools else {}), **extra,
    )  # fmt: skip


def test_models_list_names_the_served_model(client):
    assert [model.id for model in client.models.list()] == [MODEL]


def test_a_completion_continues_the_prompt(client):
    known = SCRIPT["completions"][0]
    answer = client.completions.create(
        model=MODEL, prompt=known["prompt"], max_tokens=16, temperature=0
    )
    print(f"\ncompletion: {known['prompt']}{answer.choices[0].text}")
    assert answer.choices[0].text == known["text"]
    assert answer.choices[0].finish_reason == "stop"


def test_a_chat_answers_with_its_thinking_apart(client):
    reply = CHATS["capital"]["reply"]
    answer = ask(client, "capital")
    message = answer.choices[0].message
    print(f"\nreasoning: {reasoning(message)!r}\ncontent: {message.content!r}")
    assert message.content.strip() == reply["content"]
    assert reasoning(message).strip() == reply["reasoning"]
    assert "<think>" not in message.content and "</think>" not in message.content
    assert answer.choices[0].finish_reason == "stop"
    assert not message.tool_calls


def test_a_streamed_chat_thinks_first_then_answers(client):
    reply = CHATS["capital"]["reply"]
    kinds, thought, said = [], "", ""
    for chunk in ask(client, "capital", stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if reasoning(delta):
            thought += reasoning(delta)
            kinds.append("reasoning")
        if delta.content:
            said += delta.content
            kinds.append("content")
    print(f"\nstreamed: {len(kinds)} deltas, reasoning {thought!r}, content {said!r}")
    assert thought.strip() == reply["reasoning"]
    assert said.strip() == reply["content"]
    assert kinds == sorted(kinds, key=["reasoning", "content"].index), "thinking after answering"
    assert kinds.count("content") > 1, "the answer came in one piece, not streamed"


def test_a_chat_without_thinking_has_no_reasoning(client):
    message = ask(client, "capital without thinking").choices[0].message
    assert message.content.strip() == CHATS["capital without thinking"]["reply"]["content"]
    assert not reasoning(message)


def test_a_chat_offering_a_tool_gets_a_parsed_call(client):
    want = CHATS["weather"]["reply"]["tool_calls"][0]
    answer = ask(client, "weather")
    message = answer.choices[0].message
    calls = message.tool_calls or []
    print(f"\nreasoning: {reasoning(message)!r}\ntool calls: {[c.model_dump() for c in calls]}")
    assert answer.choices[0].finish_reason == "tool_calls"
    assert [call.function.name for call in calls] == [want["name"]]
    assert json.loads(calls[0].function.arguments) == want["arguments"]
    assert not (message.content or "").strip()


def test_a_streamed_tool_call_adds_up_to_the_same_call(client):
    want = CHATS["weather"]["reply"]["tool_calls"][0]
    names, arguments, finish = [], "", None
    for chunk in ask(client, "weather", stream=True):
        if not chunk.choices:
            continue
        for call in chunk.choices[0].delta.tool_calls or []:
            names += [call.function.name] if call.function.name else []
            arguments += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == [want["name"]]
    assert json.loads(arguments) == want["arguments"]
    assert finish == "tool_calls"


def test_the_tools_result_comes_back_as_an_answer(client):
    chat = CHATS["weather, the tool's result"]
    message = ask(client, chat["name"]).choices[0].message
    assert message.content.strip() == chat["reply"]["content"]
    assert not message.tool_calls


def test_a_wrong_key_is_refused(base_url):
    stranger = openai.OpenAI(base_url=base_url, api_key="not-the-key", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    with pytest.raises(openai.AuthenticationError):
        stranger.chat.completions.create(model=MODEL, messages=CHATS["capital"]["messages"])
