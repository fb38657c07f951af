"""Tests for the fake Anthropic server: the REAL SDK accepts its streams; it refuses what the API refuses."""
import asyncio
import copy
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import anthropic
import httpx2
import pytest

from fake_api import (FakeAnthropic, Memory, PromptCache, auto_signature, error, redacted_thinking, reply,
                      text, thinking, tool_use, validate)

MODEL = "claude-sonnet-5-5"
TOOLS = [{"name": "read", "description": "Read a file.", "input_schema": {
    "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}]


@pytest.fixture(autouse=True)
def isolated_sdk(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path / "anthropic-config"))
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(name, raising=False)


def request(*messages, **extra):
    return {"model": MODEL, "max_tokens": 1000, "messages": list(messages) or [user("hi")], **extra}


def user(content):
    return {"role": "user", "content": content}


def assistant(content):
    return {"role": "assistant", "content": content}


def result(tool_use_id, content="ok", **extra):
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, **extra}


CALL = {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"file_path": "a"}}


def stream(fake, timeout=None, **kwargs):
    """Stream one request through the real SDK; returns (final message, events seen, request id)."""
    async def go():
        client = anthropic.AsyncAnthropic(api_key="test", base_url=fake.base_url, max_retries=0,
                                          **({"timeout": timeout} if timeout else {}))
        params = {"model": MODEL, "max_tokens": 1000, "messages": [user("hi")], **kwargs}
        async with client.messages.stream(**params) as s:
            seen = [event.type async for event in s]
            return await s.get_final_message(), seen, s.request_id
    return asyncio.run(go())


def call_raw(fake, path="/v1/messages", body=None, headers=None):
    """A plain urllib POST; returns (status, parsed JSON body)."""
    data = json.dumps(body if body is not None else request()).encode()
    req = urllib.request.Request(fake.base_url + path, data=data, method="POST",
                                 headers={"content-type": "application/json", "anthropic-version": "2026-10-21",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def as_param(block):
    """Turn an SDK response block back into a request block, dropping response-only fields."""
    keep = {"text": ("type", "text"), "thinking": ("type", "thinking", "signature"),
            "redacted_thinking": ("type", "data"), "tool_use": ("type", "id", "name", "input")}[block.type]
    dumped = block.model_dump()
    return {k: dumped[k] for k in keep}


# ---------------------------------------------------------------- streams the SDK accepts
def test_text_thinking_and_tool_use_stream_to_a_correct_final_message():
    script = reply(thinking("Let me look at the file first."), text("I will read a.py for you now."),
                   tool_use("read", {"file_path": "a.py"}))
    with FakeAnthropic([script]) as fake:
        message, seen, request_id = stream(fake, tools=TOOLS)
        assert fake.rejections == []
    kinds = [b.type for b in message.content]
    assert kinds == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking == "Let me look at the file first."
    assert message.content[0].signature == auto_signature("Let me look at the file first.")
    assert message.content[1].text == "I will read a.py for you now."
    assert message.content[2].input == {"file_path": "a.py"} and message.content[2].id.startswith("toolu_")
    assert message.stop_reason == "tool_use" and message.model == MODEL
    assert seen.count("text") > 2 and "thinking" in seen and "signature" in seen and "input_json" in seen
    assert request_id.startswith("req_")
    usage = message.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 1
    assert usage.cache_read_input_tokens == 0 and usage.cache_creation_input_tokens == 0


def test_redacted_and_omitted_thinking_stream_and_usage_overrides_apply():
    script = reply(redacted_thinking("EmwKopaque"), thinking("", "sig-omitted"), text("done"),
                   usage={"output_tokens": 77}, stop_reason="max_tokens")
    with FakeAnthropic([script]) as fake:
        message, seen, _ = stream(fake)
    assert message.content[0].type == "redacted_thinking" and message.content[0].data == "EmwKopaque"
    assert message.content[1].thinking == "" and message.content[1].signature == "sig-omitted"
    assert message.usage.output_tokens == 77 and message.stop_reason == "max_tokens"
    assert "thinking" not in seen   # omitted display: a signature only


def test_non_streaming_create_and_count_tokens():
    async def go(fake):
        client = anthropic.AsyncAnthropic(api_key="test", base_url=fake.base_url, max_retries=0)
        message = await client.messages.create(model=MODEL, max_tokens=100, messages=[user("hi")])
        counted = await client.messages.count_tokens(model=MODEL, messages=[user("hi")])
        return message, counted
    with FakeAnthropic([reply(text("plain"), tool_use("read", {"file_path": "x"}, id="toolu_given"))]) as fake:
        message, counted = asyncio.run(go(fake))
        assert fake.rejections == [] and fake.pending == []
    assert message.content[0].text == "plain" and message.content[1].id == "toolu_given"
    assert counted.input_tokens > 0


def test_continuing_a_tool_turn_with_replayed_thinking_is_accepted():
    with FakeAnthropic([reply(thinking("plan"), tool_use("read", {"file_path": "a"})), reply(text("fine"))]) as fake:
        first, _, _ = stream(fake, tools=TOOLS)
        call_id = first.content[1].id
        history = [user("hi"), assistant([as_param(b) for b in first.content]), user([result(call_id)])]
        second, _, _ = stream(fake, tools=TOOLS, messages=history)
        assert fake.rejections == [] and second.content[0].text == "fine"
        raw = [r["raw"] for r in fake.requests]
        assert all(isinstance(r, bytes) and json.loads(r) == q["body"] for r, q in zip(raw, fake.requests))


def test_echoing_sdk_model_dump_is_rejected_by_the_sdk_path():
    with FakeAnthropic([reply(tool_use("read", {"file_path": "a"}))]) as fake:
        first, _, _ = stream(fake, tools=TOOLS)
        history = [user("hi"), assistant([b.model_dump() for b in first.content]),
                   user([result(first.content[0].id)])]
        with pytest.raises(anthropic.BadRequestError) as caught:
            stream(fake, tools=TOOLS, messages=history)
        assert "tool_use.caller: Extra inputs are not permitted" in caught.value.message
        assert fake.rejections[0]["status"] == 400 and fake.rejections[0]["index"] == 1


def test_temperature_is_rejected_through_the_sdk():
    with FakeAnthropic([reply(text("unused"))]) as fake:
        with pytest.raises(anthropic.BadRequestError) as caught:
            stream(fake, extra_body={"temperature": 0.5})
        assert caught.value.status_code == 400 and caught.value.type == "invalid_request_error"
        assert "temperature: Extra inputs are not permitted" in caught.value.message
        assert fake.pending, "a rejected request must not consume the script"


def test_auth_accepts_bearer_and_x_api_key_and_rejects_missing_or_bad_keys():
    with FakeAnthropic([reply(text("a")), reply(text("b"))]) as fake:
        assert call_raw(fake, headers={"x-api-key": "k"})[0] == 200
        assert call_raw(fake, headers={"authorization": "Bearer k"})[0] == 200
        status, body = call_raw(fake)
        assert status == 401 and body["error"]["type"] == "authentication_error"
        with pytest.raises(anthropic.AuthenticationError):
            asyncio.run(anthropic.AsyncAnthropic(api_key="bad-key", base_url=fake.base_url, max_retries=0)
                        .messages.create(model=MODEL, max_tokens=10, messages=[user("hi")]))
        assert [r["status"] for r in fake.rejections] == [401, 401]
        assert len(fake.requests) == 4


# ---------------------------------------------------------------- scripted failures -> SDK exceptions
def test_rate_limit_error_carries_retry_after():
    with FakeAnthropic([error("rate_limit_error", "slow down", retry_after="7")]) as fake:
        with pytest.raises(anthropic.RateLimitError) as caught:
            stream(fake)
        assert caught.value.response.headers["retry-after"] == "7" and fake.rejections == []


def test_overloaded_and_exhausted_script_map_to_their_sdk_classes():
    with FakeAnthropic([error("overloaded_error", "Overloaded")]) as fake:
        with pytest.raises(anthropic.OverloadedError) as caught:
            stream(fake)
        assert caught.value.status_code == 529
        with pytest.raises(anthropic.InternalServerError) as caught:
            stream(fake)
        assert caught.value.status_code == 500 and "fake script exhausted" in caught.value.message
        assert caught.value.response.headers["x-should-retry"] == "false"


def test_mid_stream_error_is_a_bare_status_200_api_error():
    with FakeAnthropic([{"content": [text("partial")], "stream_error": {"type": "overloaded_error",
                                                                        "message": "Overloaded"}}]) as fake:
        with pytest.raises(anthropic.APIStatusError) as caught:
            stream(fake)
    assert caught.value.status_code == 200 and caught.value.type == "overloaded_error"
    assert not isinstance(caught.value, anthropic.OverloadedError)


def test_dropped_connection_is_a_transport_error():
    with FakeAnthropic([{"content": [text("x" * 200)], "drop_after_events": 4}]) as fake:
        # SDK 2.17 wraps a transport failure after the stream began; earlier releases did not
        with pytest.raises((httpx2.RemoteProtocolError, anthropic.APIConnectionError)):
            stream(fake)


def test_stall_past_the_read_timeout_is_a_read_timeout():
    with FakeAnthropic([{"content": [text("slow")], "stall_after_events": 2, "stall_seconds": 5}]) as fake:
        started = time.monotonic()
        with pytest.raises((httpx2.ReadTimeout, anthropic.APITimeoutError)):
            stream(fake, timeout=0.3)
        assert time.monotonic() - started < 3


# ---------------------------------------------------------------- usage, caching, context, matching
def test_second_request_with_the_same_prefix_reads_the_cache():
    system = [{"type": "text", "text": "You are a careful agent. " * 40, "cache_control": {"type": "ephemeral"}}]
    with FakeAnthropic([reply(text("one")), reply(text("two")), reply(text("three"))]) as fake:
        first, _, _ = stream(fake, system=system)
        second, _, _ = stream(fake, system=system, messages=[user("something else entirely")])
        other_model, _, _ = stream(fake, system=system, model="claude-haiku-5-5")
    assert first.usage.cache_read_input_tokens == 0 and first.usage.cache_creation_input_tokens > 200
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    assert other_model.usage.cache_read_input_tokens == 0, "the cache is per model"


def test_moving_breakpoint_reads_the_earlier_prefix_and_writes_the_rest():
    cache = PromptCache()
    marked = {"type": "text", "text": "first question", "cache_control": {"type": "ephemeral"}}
    body = request(user([marked]))
    usage, writes, total = cache.account(body)
    cache.commit(writes)
    follow = request(user("first question"), assistant("answer"),
                     user([{"type": "text", "text": "second", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]))
    usage2, _, total2 = cache.account(follow)
    assert usage2["cache_read_input_tokens"] == usage["cache_creation_input_tokens"] > 0
    assert usage2["cache_creation"]["ephemeral_1h_input_tokens"] == usage2["cache_creation_input_tokens"] > 0
    assert sum(usage2[k] for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")) == total2


def test_a_cache_entry_expires_five_minutes_after_its_last_use():
    now = [0.0]
    cache = PromptCache(clock=lambda: now[0])
    body = request(user([{"type": "text", "text": "question " * 300, "cache_control": {"type": "ephemeral"}}]))

    def send(at):
        now[0] = at
        usage, writes, _ = cache.account(body)
        cache.commit(writes)
        return usage["cache_read_input_tokens"]
    assert send(0) == 0
    assert send(290) > 0 and send(580) > 0, "a read keeps the entry alive for another five minutes"
    assert send(881) == 0, "idle for more than five minutes: written again"
    assert send(900) > 0


def test_prompt_too_long_above_max_context_tokens():
    with FakeAnthropic([reply(text("never"))], max_context_tokens=50) as fake:
        with pytest.raises(anthropic.BadRequestError) as caught:
            stream(fake, messages=[user("word " * 400)])
        message = caught.value.body["error"]["message"]
        assert message.startswith("prompt is too long: ") and message.endswith(" tokens > 50 maximum")
        assert fake.rejections[0]["message"] == message


def test_matched_response_waits_for_its_model():
    summary = reply(text("summary"), match={"model": "claude-haiku-5-5"})
    with FakeAnthropic([summary, reply(text("main"))]) as fake:
        main, _, _ = stream(fake)
        aux, _, _ = stream(fake, model="claude-haiku-5-5")
    assert main.content[0].text == "main" and aux.content[0].text == "summary"


def test_bad_script_items_fail_at_enqueue():
    with FakeAnthropic() as fake:
        with pytest.raises(ValueError):
            fake.enqueue({"contents": []})
        with pytest.raises(ValueError):
            fake.enqueue(reply({"type": "image"}))


def test_runs_as_a_process_with_port_file_and_log(tmp_path):
    script, port_file, log = tmp_path / "script.json", tmp_path / "port", tmp_path / "log.jsonl"
    script.write_text(json.dumps([reply(text("from a file"))]))
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fake_api.py")), "--script", str(script),
                             "--port-file", str(port_file), "--log", str(log)], stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 5
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)

        class Remote:
            base_url = f"http://127.0.0.1:{port_file.read_text()}"
        status, body = call_raw(Remote, headers={"x-api-key": "k"})
        assert status == 200 and body["content"] == [{"type": "text", "text": "from a file"}]
        assert call_raw(Remote, headers={"x-api-key": "k"})[0] == 500
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["status"] for line in lines] == [200, 500] and lines[0]["body"]["model"] == MODEL
    assert lines[0]["headers"]["x-api-key"] == "<redacted>"


# ---------------------------------------------------------------- validate(): one rule per case
VALID = request(user("read a"), assistant([{"type": "text", "text": "sure"}, CALL]),
                user([result("toolu_1", [{"type": "text", "text": "contents"}]), {"type": "text", "text": "and?"}]),
                system=[{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}], tools=TOOLS,
                thinking={"type": "adaptive"}, stream=True)

def block(body, i, j):
    """messages[i].content[j] of a request body."""
    return body["messages"][i]["content"][j]


def mark(*blocks):
    for b in blocks:
        b["cache_control"] = {"type": "ephemeral"}


EPHEMERAL = {"type": "ephemeral"}
REJECTED = [   # (case, mutation of a copy of VALID, part of the expected 400 message)
    ("temperature", lambda b: b.update(temperature=1.0), "temperature: Extra inputs are not permitted"),
    ("top_p", lambda b: b.update(top_p=0.9), "top_p: Extra inputs are not permitted"),
    ("top_k", lambda b: b.update(top_k=5), "top_k: Extra inputs are not permitted"),
    ("unknown field", lambda b: b.update(foo=1), "foo: Extra inputs are not permitted"),
    ("no model", lambda b: b.pop("model"), "model: Field required"),
    ("no max_tokens", lambda b: b.pop("max_tokens"), "max_tokens: Field required"),
    ("no messages", lambda b: b.pop("messages"), "messages: Field required"),
    ("max_tokens too big", lambda b: b.update(max_tokens=200_000), "max_tokens: 200000 > 128000"),
    ("bad role", lambda b: b["messages"][0].update(role="tool"), "messages.0.role: Input should be"),
    ("extra message key", lambda b: b["messages"][0].update(name="x"), "messages.0.name: Extra inputs"),
    ("empty string content", lambda b: b["messages"][0].update(content=""),
     "messages.0: all messages must have non-empty content"),
    ("empty list content", lambda b: b["messages"][0].update(content=[]),
     "messages.0: all messages must have non-empty content"),
    ("empty text block", lambda b: block(b, 1, 0).update(text=""), "messages: text content blocks must be non-empty"),
    ("empty system text", lambda b: b["system"][0].update(text=""), "system: text content blocks must be non-empty"),
    ("whitespace text", lambda b: block(b, 2, 1).update(text="  \n"), "must contain non-whitespace text"),
    ("citations null", lambda b: block(b, 1, 0).update(citations=None),
     "messages.1.content.0.text.citations: Extra inputs are not permitted"),
    ("parsed_output", lambda b: block(b, 1, 0).update(parsed_output=None), "text.parsed_output: Extra inputs"),
    ("tool_use caller", lambda b: block(b, 1, 1).update(caller=None),
     "messages.1.content.1.tool_use.caller: Extra inputs are not permitted"),
    ("tool_use no input", lambda b: block(b, 1, 1).pop("input"), "tool_use.input: Field required"),
    ("tool_use bad id", lambda b: block(b, 1, 1).update(id="bad id!"), "tool_use.id: String should match"),
    ("unknown block", lambda b: b["messages"][0].update(content=[{"type": "video"}]), "Input tag 'video'"),
    ("tool_result in assistant", lambda b: b["messages"][1]["content"].append(result("toolu_1")),
     "not permitted in `assistant`"),
    ("unanswered tool_use", lambda b: b["messages"][2].update(content="no result"),
     "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1."),
    ("orphan tool_result", lambda b: b["messages"][0].update(content=[result("toolu_9")]),
     "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_9."),
    ("wrong tool_result id", lambda b: block(b, 2, 0).update(tool_use_id="toolu_2"),
     "unexpected `tool_use_id` found in `tool_result` blocks: toolu_2"),
    ("text before tool_result", lambda b: b["messages"][2]["content"].reverse(),
     "messages.2: Did not find 1 tool_result block(s) at the beginning of this message"),
    ("system message between", lambda b: b["messages"].insert(2, {"role": "system", "content": "note"}),
     "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1"),
    ("user text message between", lambda b: b["messages"].insert(2, user("wait")),
     "messages.2: Did not find 1 tool_result block(s)"),
    ("error result without content", lambda b: block(b, 2, 0).update(content="", is_error=True),
     "content cannot be empty if `is_error` is true"),
    ("prefill", lambda b: b["messages"].append(assistant("I think")), "does not support assistant message prefill"),
    ("cache_control on thinking", lambda b: b["messages"][1]["content"].insert(0, {
        "type": "thinking", "thinking": "t", "signature": "s", "cache_control": EPHEMERAL}),
     "messages.1.content.0.thinking.cache_control: Extra inputs"),
    ("bad cache_control", lambda b: b["system"][0].update(cache_control={"type": "persistent"}),
     "system.0.text.cache_control: Input should be {'type': 'ephemeral'"),
    ("five breakpoints", lambda b: mark(b["tools"][0], block(b, 1, 0), block(b, 1, 1), block(b, 2, 1)),
     "A maximum of 4 blocks with cache_control may be provided. Found 5."),
    ("top-level breakpoint counts", lambda b: mark(b, b["tools"][0], block(b, 1, 1), block(b, 2, 1)), "Found 5."),
    ("nested breakpoint counts", lambda b: mark(b["tools"][0], block(b, 1, 1), block(b, 2, 0)["content"][0],
                                                block(b, 2, 1)), "Found 5."),
    ("tool without schema", lambda b: b["tools"][0].pop("input_schema"),
     "tools.0.custom.input_schema: Field required"),
    ("schema not object", lambda b: b["tools"][0]["input_schema"].update(type="array"),
     "input_schema.type: Input should be 'object'"),
    ("bad tool name", lambda b: b["tools"][0].update(name="read file"), "tools.0.custom.name: String should match"),
    ("duplicate tool", lambda b: b["tools"].append(copy.deepcopy(TOOLS[0])), "Tool names must be unique"),
    ("tool extra key", lambda b: b["tools"][0].update(parameters={}), "tools.0.custom.parameters: Extra inputs"),
    ("forced tool choice", lambda b: b.update(tool_choice={"type": "any"}),
     'tool_choice: type "tool" and "any" are not supported'),
    ("enabled thinking", lambda b: b.update(thinking={"type": "enabled", "budget_tokens": 2000}),
     '"thinking.type.enabled" is not supported'),
    ("bad image type", lambda b: b["messages"][0].update(content=[{"type": "image", "source": {
        "type": "base64", "media_type": "image/bmp", "data": "AA"}}]), "media_type: Input should be"),
]


def test_valid_conversation_passes():
    assert validate(copy.deepcopy(VALID)) is None
    assert validate({"model": MODEL, "messages": [user("hi")]}, endpoint="count_tokens") is None


@pytest.mark.parametrize("name,mutate,expected", REJECTED, ids=[case[0] for case in REJECTED])
def test_validate_rejects(name, mutate, expected):
    body = copy.deepcopy(VALID)
    mutate(body)
    problem = validate(body)
    assert problem is not None and expected in problem, problem


def test_count_tokens_refuses_max_tokens():
    assert validate(request(), endpoint="count_tokens") == "max_tokens: Extra inputs are not permitted"


def test_replayed_thinking_must_be_byte_identical():
    memory = Memory()
    sent = [{"type": "thinking", "thinking": "plan", "signature": "sig-1"},
            {"type": "redacted_thinking", "data": "opaque"}, dict(CALL)]
    memory.remember(sent)

    def check(blocks):
        return validate(request(user("go"), assistant(blocks), user([result("toolu_1")])), memory=memory)
    assert check(copy.deepcopy(sent)) is None
    edited = copy.deepcopy(sent)
    edited[0]["thinking"] = "plan, edited"
    assert check(edited).startswith("messages.1.content.0: `thinking` or `redacted_thinking` blocks in the latest "
                                    "assistant message cannot be modified.")
    assert "Invalid `signature`" in check([{"type": "thinking", "thinking": "x", "signature": "forged"}, dict(CALL)])
    assert "cannot be modified" in check([sent[1], dict(CALL)]), "dropping a thinking block is a modification"
    assert "redacted_thinking" in check([sent[0], {"type": "redacted_thinking", "data": "changed"}, dict(CALL)])
    auto = {"type": "thinking", "thinking": "self-signed", "signature": auto_signature("self-signed")}
    assert validate(request(user("go"), assistant([auto, text("t")]), user("more")), memory=Memory()) is None
