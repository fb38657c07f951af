"""fake_api.py: a scripted fake of the Anthropic Messages API for khaelor's tests, e2e runs and benches.

Owns: an HTTP server on 127.0.0.1 (stdlib only) that the REAL `anthropic` SDK talks to via `base_url`
or ANTHROPIC_BASE_URL; request validation as strict as the real API (`validate`, ANTHROPIC_API.md §3,
§8); canned responses streamed as SSE exactly as §2 describes; simulated usage and prompt caching;
a record of every request. Must not import khaelor modules or reach beyond 127.0.0.1. Error wordings
come from ANTHROPIC_API.md; the few it does not document are marked "wording not documented".

    with FakeAnthropic([reply(text("hi"))]) as fake:   # fake.base_url == "http://127.0.0.1:PORT"
        ...; assert fake.rejections == []
    python tests/fake_api.py --script script.json [--port 0] [--port-file PATH] [--log PATH] [--max-context-tokens N]

Script items are plain JSON dicts, one consumed per POST /v1/messages (the first whose "match" fits):
    {"content": [blocks], "stop_reason"?, "stop_sequence"?, "usage"? (overrides), "chunk"? (chars per
     delta, default 8), "delay"? (seconds between events), "match"? ({"model": ...}: only requests whose
     body has these values take it; it stays queued for them)}
      blocks: {"type":"text","text"}  {"type":"thinking","thinking","signature"?}  {"type":"tool_use",
              "name","input","id"?, "partial_json"? (streamed verbatim instead of the input:
              malformed or cut-off JSON)}  {"type":"redacted_thinking","data"}
      A request with thinking.display "omitted" gets its thinking blocks as a signature only ("").
    {"error": {"status"?, "type", "message", "headers"?}}       pre-stream JSON error
    {"stream_error": {"type", "message"}, "content": [...]}     the content, then `event: error`
     ("after_events"? N in stream_error: the first N events, then the error, mid-block)
    {"drop_after_events": N, "content": [...]}                  socket closed after N events
    {"stall_after_events": N, "stall_seconds": S, "content": [...]}   (fake.release() ends it sooner,
     as "release_file": PATH does once that file exists: how a test runs the server as a process)
    {"end_after_events": N, "content": [...]}                   a clean end of the body after N events
    {"split_data": True, "content": [...]}    each event's JSON over several `data:` lines (one per
                                              key), after an `id:` and a `:` comment line, as SSE allows
Events count from 1: message_start, ping, each block's start/deltas/stop, message_delta, message_stop.
An exhausted script answers 500 api_error "fake script exhausted" with x-should-retry: false.
"""
import argparse
import hashlib
import http.server
import json
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

# ---------------------------------------------------------------- constants (ANTHROPIC_API.md §1, §3, §4)
MESSAGE_FIELDS = {"model", "max_tokens", "messages", "system", "stream", "tools", "tool_choice", "thinking",
                  "output_config", "cache_control", "metadata", "stop_sequences", "service_tier", "speed",
                  "inference_geo", "container", "diagnostics"}
COUNT_TOKENS_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
                       "cache_control", "speed"}
# Fields accepted per block type. Deliberately strict: response-only fields that an SDK model_dump()
# echoes back (tool_use.caller, text.citations=None, parsed_output) are refused.
BLOCK_FIELDS = {"text": {"type", "text", "cache_control"}, "image": {"type", "source", "cache_control"},
                "document": {"type", "source", "cache_control", "citations", "context", "title"},
                "tool_use": {"type", "id", "name", "input", "cache_control"},
                "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
                "thinking": {"type", "thinking", "signature"}, "redacted_thinking": {"type", "data"}}
REQUIRED_FIELDS = {"text": ("text",), "image": ("source",), "document": ("source",),
                   "tool_use": ("id", "name", "input"), "tool_result": ("tool_use_id",),
                   "thinking": ("thinking", "signature"), "redacted_thinking": ("data",)}
ALLOWED_BLOCKS = {"user": {"text", "image", "document", "tool_result"}, "system": {"text"},
                  "assistant": {"text", "thinking", "redacted_thinking", "tool_use"},
                  "tool_result": {"text", "image", "document"}}   # inside tool_result.content
STRING_FIELDS = ("text", "id", "name", "tool_use_id", "thinking", "signature", "data")
TOOL_FIELDS = {"name", "description", "input_schema", "cache_control", "strict", "eager_input_streaming",
               "defer_loading", "input_examples", "allowed_callers", "type"}
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
MAX_CACHE_BREAKPOINTS = 4
CACHE_LOOKBACK_BLOCKS = 20
CACHE_TTL_S = {"5m": 300, "1h": 3600}   # a cache entry's lifetime, by its breakpoint's ttl
MAX_OUTPUT_TOKENS = 128_000   # every current model (§5.3)
# (model-id prefix, thinking types it accepts); the first matching prefix wins.  [§3.3]
THINKING_TYPES = [
    ("claude-opus-5-5", {"adaptive"}), ("claude-fable-5", {"adaptive"}), ("claude-mythos-5", {"adaptive"}),
    ("claude-sonnet-5-5", {"adaptive", "between_tools"}), ("claude-opus-5", {"adaptive", "disabled"}),
    ("claude-sonnet-5", {"adaptive", "disabled"}), ("claude-opus-4-8", {"adaptive", "disabled"}),
    ("claude-opus-4-7", {"adaptive", "disabled"}), ("claude-opus-4-6", {"adaptive", "disabled", "enabled"}),
    ("claude-sonnet-4-6", {"adaptive", "disabled", "enabled"}), ("claude-opus-4-5", {"enabled", "disabled"}),
    ("claude-sonnet-4-5", {"enabled", "disabled"}), ("claude-haiku-4-5", {"enabled", "disabled"})]
# (model-id prefix, effort levels it accepts; None: effort refused); the first matching prefix wins.
# Models not listed (the 5.5 generation, 5.1, Haiku 5.5): levels not published, any is accepted. [§3.3a]
ALL_EFFORTS = ("low", "medium", "high", "xhigh", "max")
EFFORT_LEVELS = [
    ("claude-fable-5-2", None), ("claude-mythos-5-2", None), ("claude-fable-5-1", ALL_EFFORTS),
    ("claude-mythos-5-1", ALL_EFFORTS), ("claude-fable-5", ALL_EFFORTS), ("claude-mythos-5", ALL_EFFORTS),
    ("claude-opus-5-5", ALL_EFFORTS), ("claude-sonnet-5-5", ALL_EFFORTS), ("claude-haiku-5-5", ALL_EFFORTS),
    ("claude-opus-5", ALL_EFFORTS), ("claude-sonnet-5", ALL_EFFORTS), ("claude-opus-4-8", ALL_EFFORTS),
    ("claude-opus-4-7", ALL_EFFORTS), ("claude-mythos-preview", ("low", "medium", "high", "max")),
    ("claude-opus-4-6", ("low", "medium", "high", "max")), ("claude-sonnet-4-6", ("low", "medium", "high", "max")),
    ("claude-opus-4-5", ("low", "medium", "high")), ("claude-sonnet-4-5", None), ("claude-haiku-4-5", None)]
EFFORT_REFUSED = "output_config.effort: effort is not supported for this model."   # wording not documented
NO_FORCED_TOOL_CHOICE = ("claude-opus-5-5", "claude-sonnet-5-5", "claude-fable-5-1", "claude-mythos-5-1")
THINKING_TYPE_ERRORS = {
    "enabled": '"thinking.type.enabled" is not supported for this model. Use "thinking.type.adaptive" '
               'and "output_config.effort" to control thinking behavior.',
    "adaptive": "adaptive thinking is not supported on this model",
    "between_tools": '"thinking.type.between_tools" is not supported for this model.',
    "disabled": '"thinking.type.disabled" is not supported for this model.'}   # the last: wording not documented
PREFILL = "This model does not support assistant message prefill. The conversation must end with a user message."
THINKING_MODIFIED = ("`thinking` or `redacted_thinking` blocks in the latest assistant message cannot be modified. "
                     "These blocks must remain as they were in the original response.")
STATUS_OF = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
             "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
             "rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529}
AUTO_SIGNATURE_PREFIX = "fakesig_"
DEFAULT_CHUNK = 8
SCRIPT_BLOCKS = {"text", "thinking", "redacted_thinking", "tool_use"}
SCRIPT_KEYS = {"content", "stop_reason", "stop_sequence", "usage", "chunk", "delay", "match", "error",
               "stream_error", "drop_after_events", "stall_after_events", "stall_seconds", "end_after_events",
               "split_data", "release_file"}


# ---------------------------------------------------------------- script helpers
def text(s):
    return {"type": "text", "text": s}


def thinking(s, signature=None):
    """A thinking block; without a signature the server derives a self-verifying one (auto_signature)."""
    return {"type": "thinking", "thinking": s, **({} if signature is None else {"signature": signature})}


def redacted_thinking(data):
    return {"type": "redacted_thinking", "data": data}


def tool_use(name, input, id=None):   # noqa: A002  (the API's field names)
    return {"type": "tool_use", "name": name, "input": input, **({} if id is None else {"id": id})}


def reply(*blocks, **options):
    """A script item: reply(text("hi"), tool_use("read", {...}), chunk=4)."""
    return {"content": list(blocks), **options}


def error(type_, message, status=None, **headers):
    """A pre-stream error item; header names may use _ for - (retry_after="0")."""
    return {"error": {"status": status or STATUS_OF.get(type_, 500), "type": type_, "message": message,
                      "headers": {k.replace("_", "-"): str(v) for k, v in headers.items()}}}


def auto_signature(thinking_text):
    return AUTO_SIGNATURE_PREFIX + hashlib.sha256(thinking_text.encode()).hexdigest()[:32]


# ---------------------------------------------------------------- validation
class Memory:
    """What the server emitted, so replayed thinking can be checked byte for byte."""

    def __init__(self):
        self.thinking = {}      # signature -> thinking text
        self.redacted = set()   # redacted_thinking data
        self.turns = {}         # tool_use id -> that response's thinking/redacted blocks, in order
        self.bound = {}         # signature -> the request it was made for (binding models, §3.3)

    def remember(self, content, body=None):
        reasoning = [b for b in content if b["type"] in ("thinking", "redacted_thinking")]
        for block in reasoning:
            if block["type"] == "thinking":
                self.thinking[block["signature"]] = block["thinking"]
                if body is not None and body["model"].startswith(BINDING_MODELS):
                    self.bound[block["signature"]] = _binding_key(body, len(body["messages"]))
            else:
                self.redacted.add(block["data"])
        self.turns.update((b["id"], reasoning) for b in content if b["type"] == "tool_use")


# Models on which a replayed thinking block is valid only while system, tools and the earlier
# messages are unchanged (ANTHROPIC_API.md §3.3, enforced for accounts made after 2026-08-31).
BINDING_MODELS = ("claude-fable-5-1", "claude-opus-5-5", "claude-sonnet-5-5")
BOUND_ELSEWHERE = "Invalid `signature` in `thinking` block. The block is bound to a different conversation."


def _binding_key(body, n_messages):
    """system, tools and the first n messages, cache breakpoints aside."""
    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if k != "cache_control"}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value
    return json.dumps(plain([body.get("system"), body.get("tools"), body["messages"][:n_messages]]),
                      sort_keys=True)


def check_binding(body, memory):
    """The 400 for a thinking block of this turn replayed after the messages before it changed."""
    messages = body["messages"]
    opening = 0
    for i, message in enumerate(messages):
        blocks = _blocks(message["content"])
        if message["role"] == "user" and not any(b.get("type") == "tool_result" for b in blocks):
            opening = i
    for i in range(opening, len(messages)):
        for j, block in enumerate(_blocks(messages[i]["content"])):
            bound = memory.bound.get(block.get("signature")) if block.get("type") == "thinking" else None
            if bound is not None and bound != _binding_key(body, i):
                return f"messages.{i}.content.{j}: {BOUND_ELSEWHERE}"
    return None


def validate(body, *, endpoint="messages", memory=None):
    """The 400 message the real API gives for this request body, or None if it is valid.
    endpoint: "messages" or "count_tokens"; memory: a Memory (None skips replayed-thinking checks)."""
    if not isinstance(body, dict):
        return "body: Input should be a valid dictionary"
    allowed = MESSAGE_FIELDS if endpoint == "messages" else COUNT_TOKENS_FIELDS
    required = ("model", "max_tokens", "messages") if endpoint == "messages" else ("model", "messages")
    problem = _check_fields(body, "", allowed, required)
    if problem:
        return problem.lstrip(".")
    if not isinstance(body["model"], str) or not body["model"]:
        return "model: Input should be a valid string"
    max_tokens = body.get("max_tokens", 0)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        return "max_tokens: Input should be a valid integer greater than or equal to 0"
    if max_tokens > MAX_OUTPUT_TOKENS:
        return (f"max_tokens: {max_tokens} > {MAX_OUTPUT_TOKENS}, which is the maximum allowed number of "
                f"output tokens for {body['model']}")
    for check in (_check_system, _check_tools, _check_model_options, _check_effort, _check_messages):
        problem = check(body, memory)
        if problem:
            return problem
    found = len(_breakpoints(_cache_units(body), body))
    if found > MAX_CACHE_BREAKPOINTS:
        return f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {found}."
    return None


def _check_fields(obj, path, allowed, required):
    """Unknown keys, missing keys and a well-formed cache_control, on any dict-shaped API object."""
    extra = next((key for key in obj if key not in allowed), None)
    if extra is not None:
        return f"{path}.{extra}: Extra inputs are not permitted"
    missing = next((key for key in required if key not in obj), None)
    if missing is not None:
        return f"{path}.{missing}: Field required"
    mark = obj.get("cache_control")
    if mark is not None and not (isinstance(mark, dict) and mark.get("type") == "ephemeral"
                                 and set(mark) <= {"type", "ttl"} and mark.get("ttl", "5m") in ("5m", "1h")):
        return f"{path}.cache_control: Input should be {{'type': 'ephemeral', 'ttl'?: '5m' | '1h'}}"
    return None


def _check_system(body, memory):
    system = body.get("system")
    if system is None or isinstance(system, str):
        return None
    if not isinstance(system, list):
        return "system: Input should be a valid string or list"
    return next(filter(None, (_check_block(b, f"system.{i}", "system", memory) for i, b in enumerate(system))), None)


def _check_tools(body, _memory):
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        return "tools: Input should be a valid list of dictionaries"
    for i, tool in enumerate(tools):
        path = f"tools.{i}.custom"
        if tool.get("type") not in (None, "custom"):   # a server / Anthropic-defined tool: name only
            problem = None if isinstance(tool.get("name"), str) else f"tools.{i}.name: Field required"
        else:
            problem = _check_fields(tool, path, TOOL_FIELDS, ("name", "input_schema"))
        if problem:
            return problem
        if not isinstance(tool["name"], str) or not TOOL_NAME.match(tool["name"]):
            return f"{path}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
        schema = tool.get("input_schema", {"type": "object"})
        if not isinstance(schema, dict) or schema.get("type") != "object":
            return f"{path}.input_schema.type: Input should be 'object'"
        if not isinstance(schema.get("properties", {}), dict):
            return f"{path}.input_schema.properties: Input should be a valid dictionary"
    if len({tool["name"] for tool in tools}) != len(tools):
        return "tools: Tool names must be unique."
    return None


def _check_model_options(body, _memory):
    """tool_choice and thinking, including what each model refuses (§3.3)."""
    choice = body.get("tool_choice", {"type": "auto"})
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        return "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'"
    if kind in ("any", "tool") and body["model"].startswith(NO_FORCED_TOOL_CHOICE):
        return 'tool_choice: type "tool" and "any" are not supported for this model.'
    config = body.get("thinking")
    kind = config.get("type") if isinstance(config, dict) else None
    if config is None:
        return None
    if not isinstance(kind, str) or kind not in THINKING_TYPE_ERRORS:
        return "thinking.type: Input should be 'adaptive', 'enabled', 'disabled' or 'between_tools'"
    accepted = next((types for prefix, types in THINKING_TYPES if body["model"].startswith(prefix)), None)
    if accepted is not None and kind not in accepted:   # a model not in the table accepts any type
        return THINKING_TYPE_ERRORS[kind]
    if kind == "enabled" and not (isinstance(config.get("budget_tokens"), int) and config["budget_tokens"] >= 1024):
        return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
    if kind == "enabled" and config["budget_tokens"] >= body["max_tokens"]:
        return "`max_tokens` must be greater than `thinking.budget_tokens`"   # wording not documented
    if config.get("display", "omitted") not in ("summarized", "omitted") or (kind in ("disabled", "between_tools")
                                                                            and "display" in config):
        return f"thinking.{kind}.display: Input should be 'summarized' or 'omitted'"
    if kind == "disabled" and body["model"].startswith("claude-opus-5") and not body["model"].startswith(
            "claude-opus-5-5") and _effort(body) in ("xhigh", "max"):
        return THINKING_TYPE_ERRORS["disabled"]   # Opus 5: disabled only at effort high or below
    return None


def _effort(body):
    return (body.get("output_config") or {}).get("effort")


def _check_effort(body, _memory):
    """output_config.effort: a known level, and one the model accepts (§3.3a)."""
    effort = _effort(body)
    if effort is None:
        return None
    if effort not in ALL_EFFORTS:
        return "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'"
    levels = next((levels for prefix, levels in EFFORT_LEVELS if body["model"].startswith(prefix)), ALL_EFFORTS)
    if levels is None:
        return EFFORT_REFUSED
    if effort not in levels:
        return f"output_config.effort: '{effort}' is not supported for this model."   # wording not documented
    return None


def _blocks(content):
    """Message content as a block list (a string is shorthand for one text block)."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _check_messages(body, memory):
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        return "messages: Input should be a non-empty list"
    for i, message in enumerate(messages):
        problem = _check_message(i, message, memory)
        if problem:
            return problem
    if messages[-1]["role"] == "assistant":
        return PREFILL
    problem = _check_tool_pairing(messages)
    if problem is None and memory is not None:
        problem = _check_turn_reasoning(messages, memory)
    return problem


def _check_message(i, message, memory):
    if not isinstance(message, dict):
        return f"messages.{i}: Input should be a valid dictionary"
    problem = _check_fields(message, f"messages.{i}", ("role", "content"), ("role", "content"))
    if problem:
        return problem
    role, content = message["role"], message["content"]
    if role not in ("user", "assistant", "system"):
        return f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'"
    if not isinstance(content, (str, list)):
        return f"messages.{i}.content: Input should be a valid string or list"
    if not content:
        return (f"messages.{i}: all messages must have non-empty content except for the optional final "
                "assistant message")
    blocks = _blocks(content)
    return next(filter(None, (_check_block(b, f"messages.{i}.content.{j}", role, memory)
                              for j, b in enumerate(blocks))), None)


def _check_block(block, path, role, memory):
    """One content block at `path`, inside a message of `role` (or "system" / "tool_result")."""
    kind = block.get("type") if isinstance(block, dict) and isinstance(block.get("type"), str) else None
    if kind not in BLOCK_FIELDS or (role in ("system", "tool_result") and kind not in ALLOWED_BLOCKS[role]):
        tags = ", ".join(f"'{t}'" for t in sorted(ALLOWED_BLOCKS[role]))
        return f"{path}: Input tag '{kind}' found using 'type' does not match any of the expected tags: {tags}"
    if kind not in ALLOWED_BLOCKS[role]:
        return f"{path}.type: `{kind}` blocks are not permitted in `{role}` messages"   # wording not documented
    allowed = BLOCK_FIELDS[kind]
    if kind == "text" and role == "assistant" and block.get("citations"):
        allowed = allowed | {"citations"}   # real citations only ever come back on assistant text
    problem = _check_fields(block, f"{path}.{kind}", allowed, REQUIRED_FIELDS[kind])
    if problem:
        return problem
    not_str = next((k for k in STRING_FIELDS if k in block and not isinstance(block[k], str)), None)
    if not_str:
        return f"{path}.{kind}.{not_str}: Input should be a valid string"
    if kind == "text":
        if block["text"] == "":
            return f"{path.split('.')[0]}: text content blocks must be non-empty"
        return None if block["text"].strip() else f"{path}: text content blocks must contain non-whitespace text"
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if kind == "image" and source.get("type") == "base64" and source.get("media_type") not in IMAGE_TYPES:
        return f"{path}.image.source.base64.media_type: Input should be " + " or ".join(map(repr, IMAGE_TYPES))
    if kind == "tool_use":
        if not isinstance(block["id"], str) or not TOOL_ID.match(block["id"]):
            return f"{path}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
        if not isinstance(block["input"], dict):
            return f"{path}.tool_use.input: Input should be a valid dictionary"
        return None
    if kind == "tool_result":
        content = block.get("content")
        if block.get("is_error") and not content:
            return f"{path}.tool_result: content cannot be empty if `is_error` is true"
        if content is None or isinstance(content, str):
            return None
        if not isinstance(content, list):
            return f"{path}.tool_result.content: Input should be a valid string or list"
        return next(filter(None, (_check_block(b, f"{path}.tool_result.content.{k}", "tool_result", memory)
                                  for k, b in enumerate(content))), None)
    return _check_replayed_thinking(block, path, memory) if memory is not None else None


def _check_replayed_thinking(block, path, memory):
    if block["type"] == "redacted_thinking":
        known = block["data"] in memory.redacted
        return None if known else f"{path}: Invalid `data` in `redacted_thinking` block."   # wording not documented
    signature, thought = block["signature"], block["thinking"]
    if memory.thinking.get(signature) == thought or signature == auto_signature(thought):
        return None
    if signature in memory.thinking or signature.startswith(AUTO_SIGNATURE_PREFIX):
        return f"{path}: {THINKING_MODIFIED}"
    return f"{path}: Invalid `signature` in `thinking` block."


def _turns(messages):
    """Consecutive same-role messages merged, as the API merges them: [(role, [(i, j, block)])]."""
    turns = []
    for i, message in enumerate(messages):
        located = [(i, j, block) for j, block in enumerate(_blocks(message["content"]))]
        if turns and turns[-1][0] == message["role"]:
            turns[-1][1].extend(located)
        else:
            turns.append((message["role"], located))
    return turns


def _orphan_result(turns, n):
    """The error for a tool_result in turn n that answers no tool_use of turn n-1, if any."""
    offered = {b["id"] for _, _, b in turns[n - 1][1] if b["type"] == "tool_use"} if n else set()
    for i, j, block in turns[n][1]:
        if block["type"] == "tool_result" and block["tool_use_id"] not in offered:
            return (f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{block['tool_use_id']}. Each `tool_result` block must have a corresponding "
                    "`tool_use` block in the previous message.")
    return None


def _check_tool_pairing(messages):
    """No orphan tool_result; every tool_use answered first thing in the very next turn."""
    turns = _turns(messages)
    for n, (_role, located) in enumerate(turns):
        ids = [b["id"] for _, _, b in located if b["type"] == "tool_use"]
        problem = _orphan_result(turns, n) or (ids and n + 1 < len(turns) and _orphan_result(turns, n + 1))
        if problem:
            return problem
        if not ids or n + 1 == len(turns):
            continue
        where = next(i for i, _, b in located if b["type"] == "tool_use")
        if len(set(ids)) != len(ids):
            return f"messages.{where}: `tool_use` ids must be unique"   # wording not documented
        answer = turns[n + 1][1] if turns[n + 1][0] == "user" else []
        answered = {b["tool_use_id"] for _, _, b in answer if b["type"] == "tool_result"}
        missing = [x for x in ids if x not in answered]
        if missing:
            return (f"messages.{where}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` "
                    "block in the next message.")
        leading = next((k for k, (_, _, b) in enumerate(answer) if b["type"] != "tool_result"), len(answer))
        if leading < len(answered):
            return (f"messages.{answer[0][0]}: Did not find {len(ids)} tool_result block(s) at the beginning of "
                    "this message. Messages following tool_use blocks must begin with a matching number of "
                    "tool_result blocks.")
    return None


def _check_turn_reasoning(messages, memory):
    """An assistant turn we emitted must carry back all of its thinking blocks, in order, unchanged."""
    for i, message in enumerate(messages):
        blocks = _blocks(message["content"]) if message["role"] == "assistant" else []
        ids = [b["id"] for b in blocks if b["type"] == "tool_use" and b["id"] in memory.turns]
        emitted = memory.turns[ids[0]] if ids else None
        if emitted is None:
            continue
        sent = [(j, b) for j, b in enumerate(blocks) if b["type"] in ("thinking", "redacted_thinking")]
        for n in range(max(len(sent), len(emitted))):
            if n >= len(sent) or n >= len(emitted) or sent[n][1] != emitted[n]:
                return f"messages.{i}.content.{sent[n][0] if n < len(sent) else 0}: {THINKING_MODIFIED}"
    return None


# ---------------------------------------------------------------- usage and prompt caching
def _canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _without_cache_control(block):
    block = {k: v for k, v in block.items() if k != "cache_control"}
    if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        block["content"] = [_without_cache_control(b) if isinstance(b, dict) else b for b in block["content"]]
    return block


def _cache_units(body):
    """The request as the cache sees it, one unit per block in the order tools, system, messages:
    [(canonical text without cache_control, [the cache_control marks on or inside the block])]."""
    tagged = [("tool", tool) for tool in body.get("tools") or []]
    tagged += [("system", block) for block in (_blocks(body["system"]) if body.get("system") else [])]
    for i, message in enumerate(body.get("messages") or []):
        if isinstance(message, dict) and isinstance(message.get("content"), (str, list)):
            tagged += [(f"{i}:{message.get('role')}", block) for block in _blocks(message["content"])]
    units = []
    for tag, block in tagged:
        marks = []
        if isinstance(block, dict):
            inner = block.get("content") if block.get("type") == "tool_result" else None
            nested = inner if isinstance(inner, list) else []
            marks = [b["cache_control"] for b in [block, *nested] if isinstance(b, dict) and b.get("cache_control")]
            block = _without_cache_control(block)
        units.append((_canonical([tag, block]), marks))
    return units


def _breakpoints(units, body):
    """[(unit position, ttl)] per cache_control; the top-level (automatic) one marks the last unit."""
    points = [(n, mark.get("ttl", "5m")) for n, (_, marks) in enumerate(units) for mark in marks]
    if isinstance(body.get("cache_control"), dict) and units:
        points.append((len(units) - 1, body["cache_control"].get("ttl", "5m")))
    return points


class PromptCache:
    """Simulated prompt cache: hash of (model, every unit up to a breakpoint) -> (that prefix's tokens,
    when it expires). Tokens are canonical-JSON characters / 4, so every number is deterministic. An
    entry lives CACHE_TTL_S after the request that wrote or read it (§3.4); `clock` (seconds) may be
    simulated, as bench/bench_prune.py does."""

    def __init__(self, clock=time.monotonic):
        self.entries = {}
        self.clock = clock

    def account(self, body):
        """(usage, writes, total input tokens) for a request; commit(writes) once it is served."""
        units = _cache_units(body)
        digest = hashlib.sha256(body["model"].encode())
        hashes, tokens, length = [], [], 1
        for canonical, _marks in units:
            digest.update(canonical.encode() + b"\0")
            hashes.append(digest.hexdigest())
            length += len(canonical) + 1
            tokens.append(length // 4)
        total = length // 4 + 3   # + message framing, so a fully cached request still has input tokens
        usage = {"input_tokens": total, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                 "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}}
        points = _breakpoints(units, body)
        if not points:
            return usage, {}, total
        last, ttl = max(points)
        # a breakpoint finds an earlier entry written at any of the 20 blocks up to it (§3.4 lookback)
        looked_at = {q for p, _ in points for q in range(max(0, p - CACHE_LOOKBACK_BLOCKS + 1), p + 1)}
        now = self.clock()
        hits = [q for q in looked_at if self.entries.get(hashes[q], (0, now - 1, 0))[1] >= now]
        read = tokens[max(hits)] if hits else 0
        usage.update(input_tokens=total - tokens[last], cache_read_input_tokens=read,
                     cache_creation_input_tokens=tokens[last] - read)
        usage["cache_creation"][f"ephemeral_{ttl}_input_tokens"] = tokens[last] - read
        writes = {hashes[p]: (tokens[p], CACHE_TTL_S[t]) for p, t in points}
        if hits:   # a read refreshes the entry's lifetime
            writes.setdefault(hashes[max(hits)], (read, self.entries[hashes[max(hits)]][2]))
        return usage, writes, total

    def commit(self, writes):
        now = self.clock()
        self.entries.update((h, (tokens, now + life, life)) for h, (tokens, life) in writes.items())


# ---------------------------------------------------------------- responses and SSE
def _finalize(content, new_tool_id):
    """Script blocks -> the blocks the API returns (tool ids and thinking signatures filled in)."""
    final = []
    for block in content:
        if block["type"] == "thinking":
            signature = block.get("signature") or auto_signature(block["thinking"])
            block = {"type": "thinking", "thinking": block["thinking"], "signature": signature}
        elif block["type"] == "tool_use":
            raw = {"partial_json": block["partial_json"]} if "partial_json" in block else {}
            block = {"type": "tool_use", "id": block.get("id") or new_tool_id(), "name": block["name"],
                     "input": block.get("input", {}), **raw}
        final.append(dict(block))
    return final


def _omitted(block):
    """A thinking block as display "omitted" sends it: no text; a self-verifying signature stays one."""
    signature = block["signature"]
    if signature == auto_signature(block["thinking"]):
        signature = auto_signature("")
    return dict(block, thinking="", signature=signature)


def _pieces(s, chunk):
    return [s[k:k + chunk] for k in range(0, len(s), max(1, chunk))]


def _block_stream(block, chunk):
    """(content_block_start payload, [deltas]) for one finished block."""
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in _pieces(block["text"], chunk)]
    if kind == "thinking":   # thinking deltas (none when display is omitted), then one signature_delta
        deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(block["thinking"], chunk)]
        return ({"type": "thinking", "thinking": "", "signature": ""},
                deltas + [{"type": "signature_delta", "signature": block["signature"]}])
    if kind == "tool_use":   # input starts as {} and arrives as JSON fragments, the first often ""
        fragments = [""] + _pieces(block.get("partial_json", json.dumps(block["input"])), chunk)
        return ({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}},
                [{"type": "input_json_delta", "partial_json": p} for p in fragments])
    return dict(block), []   # redacted_thinking arrives whole in content_block_start


def sse_events(message, chunk=DEFAULT_CHUNK):
    """The (event name, data) sequence that streams a complete Message dict."""
    usage = message["usage"]
    start_usage = {k: v for k, v in usage.items() if k != "output_tokens_details"}
    head = dict(message, content=[], stop_reason=None, stop_sequence=None, usage=dict(start_usage, output_tokens=1))
    events = [("message_start", {"type": "message_start", "message": head}), ("ping", {"type": "ping"})]
    for index, block in enumerate(message["content"]):
        start, deltas = _block_stream(block, chunk)
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                   for delta in deltas]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    events.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    return events + [("message_stop", {"type": "message_stop"})]


def sse_frame(name, data, split, number):
    """One server-sent event; `split`: the JSON over one `data:` line per key, which a client must
    join with newlines, with an `id:` and a comment line among them (both to be ignored)."""
    if not split:
        return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
    lines = json.dumps(data, indent=0).split("\n")
    framed = [f"event: {name}", f"id: {number}", ": a comment"] + [f"data:{line}" for line in lines]
    return ("\n".join(framed) + "\n\n").encode()


# ---------------------------------------------------------------- the server
class Failure(NamedTuple):
    """An error answer. rejection=False: the script asked for it, so it is not in .rejections."""
    status: int
    type: str
    message: str
    headers: dict = {}
    rejection: bool = True


class FakeAnthropic:
    """The fake API, listening from construction until stop(); thread-safe. See the module docstring."""

    def __init__(self, script=None, max_context_tokens=None, *, port=0, log_path=None):
        self.max_context_tokens = max_context_tokens   # prompts estimated above this: "prompt is too long"
        self.requests = []      # [{"path", "headers", "body", "raw"}] for every request, rejected ones too
        self.rejections = []    # [{"index" (into requests), "status", "type", "message"}]
        self.memory = Memory()
        self.cache = PromptCache()
        self.log_path = log_path
        self._script, self._counter = [], 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._released = threading.Event()     # set: stalls end (release(), stop())
        self.enqueue(*(script or []))
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self._httpd.fake = self
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        # stop() waits for the serving loop's next poll: a server a test starts and stops costs
        # that wait once (~250 of them in the suite), and an idle poll costs microseconds
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.005}, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def enqueue(self, *items):
        for item in items:   # a typo in a script should fail loudly here, not as a puzzling stream
            kinds = {b.get("type") for b in item.get("content", [])} if isinstance(item, dict) else {None}
            if not isinstance(item, dict) or set(item) - SCRIPT_KEYS or kinds - SCRIPT_BLOCKS:
                raise ValueError(f"fake script: bad item {item!r} (keys: {sorted(SCRIPT_KEYS)})")
        with self._lock:
            self._script.extend(items)

    @property
    def pending(self):
        """Script items not consumed yet."""
        with self._lock:
            return list(self._script)

    def release(self):
        """End the stall in progress, and skip any later one: a test that waits for what a stall
        shows lets the stream go on once it has seen it (stall_seconds is then only a bound)."""
        self._released.set()

    def stalled(self, item) -> bool:
        """Stall as `item` says; whether the server is closing meanwhile (the stream then drops)."""
        deadline = time.monotonic() + item.get("stall_seconds", 0)
        release_file = item.get("release_file")
        while not self._released.is_set() and time.monotonic() < deadline:
            if release_file and Path(release_file).exists():
                break
            self._released.wait(0.02 if release_file else deadline - time.monotonic())
        return self._stopping.is_set()

    def stop(self):
        self._stopping.set()   # wakes stalled and delayed streams
        self._released.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- the handler's bookkeeping and decisions, kept free of socket I/O --
    def record(self, path, headers, body, raw):
        with self._lock:
            self.requests.append({"path": path, "headers": headers, "body": body, "raw": raw})
            return len(self.requests) - 1

    def new_id(self, prefix):
        with self._lock:
            self._counter += 1
            return f"{prefix}{self._counter:024d}"

    def finish(self, index, status, failure=None):
        """Note how request `index` was answered: in .rejections and in the --log file."""
        with self._lock:
            if failure and failure.rejection:
                self.rejections.append({"index": index, "status": status, "type": failure.type,
                                        "message": failure.message})
            if self.log_path:
                request = self.requests[index]
                headers = {k: "<redacted>" if k in ("authorization", "x-api-key") else v
                           for k, v in request["headers"].items()}   # a log file must not hold keys
                line = {"index": index, "path": request["path"], "headers": headers, "body": request["body"],
                        "status": status, "error": failure and failure.message}
                with open(self.log_path, "a", encoding="utf-8") as log:
                    log.write(json.dumps(line) + "\n")

    def serve(self, body):
        """The answer to a valid /v1/messages body: a Failure, or (script item, Message dict)."""
        with self._lock:
            usage, writes, total = self.cache.account(body)
            if self.max_context_tokens and total > self.max_context_tokens:
                return Failure(400, "invalid_request_error",
                               f"prompt is too long: {total} tokens > {self.max_context_tokens} maximum")
            item = next((it for it in self._script
                         if all(body.get(k) == v for k, v in it.get("match", {}).items())), None)
            if item is None:
                return Failure(500, "api_error", "fake script exhausted", {"x-should-retry": "false"})
            self._script.remove(item)
        if "error" in item:
            err = item["error"]
            return Failure(err.get("status") or STATUS_OF.get(err["type"], 500), err["type"],
                           err.get("message", ""), err.get("headers", {}), rejection=False)
        content = _finalize(item.get("content", []), lambda: self.new_id("toolu_fake"))
        usage["output_tokens"] = max(1, len(_canonical(content)) // 4)
        thoughts = [b["thinking"] for b in content if b["type"] == "thinking"]
        if thoughts:   # the part of output_tokens that was thinking (§5.1)
            usage["output_tokens_details"] = {"thinking_tokens": min(usage["output_tokens"],
                                                                    max(1, len("".join(thoughts)) // 4))}
        if (body.get("thinking") or {}).get("display") == "omitted":   # a signature only (§2.4)
            content = [_omitted(b) if b["type"] == "thinking" else b for b in content]
        usage.update(item.get("usage", {}))
        stop = item.get("stop_reason") or ("tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn")
        message = {"id": self.new_id("msg_fake"), "type": "message", "role": "assistant", "model": body["model"],
                   "content": content, "stop_reason": stop, "stop_sequence": item.get("stop_sequence"), "usage": usage}
        with self._lock:
            self.memory.remember(content, body)
            self.cache.commit(writes)
        return item, message

    def precheck(self, path, headers, body):
        """The Failure for a request the real API refuses before generating anything, or None."""
        endpoint = ("count_tokens" if path.endswith("/v1/messages/count_tokens")
                    else "messages" if path.endswith("/v1/messages") else None)
        key = headers.get("x-api-key")   # x-api-key wins when both are present
        if key is None and headers.get("authorization", "").lower().startswith("bearer "):
            key = headers["authorization"][7:]
        if endpoint is None:
            return Failure(404, "not_found_error", f"Not found: {path}")
        if not key or key == "bad-key":
            return Failure(401, "authentication_error", "invalid x-api-key" if key else "x-api-key header is required")
        if "anthropic-version" not in headers:
            return Failure(400, "invalid_request_error", "anthropic-version: header is required")
        if body is None:
            return Failure(400, "invalid_request_error", "There was an error parsing the body as JSON")
        try:
            problem = validate(body, endpoint=endpoint, memory=self.memory)
            if not problem and endpoint == "messages":
                problem = check_binding(body, self.memory)
        except (AttributeError, KeyError, TypeError) as exc:   # a shape validate() did not foresee
            problem = f"fake_api could not validate this body: {exc!r}"
        return Failure(400, "invalid_request_error", problem) if problem else None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive and chunked streams, like the real API

    def log_message(self, *args):
        pass

    def handle(self):
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):   # a client killed between keep-alive requests
            self.close_connection = True

    def do_POST(self):   # noqa: N802
        fake = self.server.fake
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        if len(raw) < length:
            # the client died while sending (a kill -9 mid-upload): the real API never sees a
            # whole request, so it answers nothing and records no rejection
            self.close_connection = True
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        index = fake.record(self.path, headers, body, raw)
        self.request_id = fake.new_id("req_fake")
        path = self.path.split("?")[0]
        try:
            outcome = fake.precheck(path, headers, body)
            if outcome is None and path.endswith("/count_tokens"):
                fake.finish(index, 200)
                return self._send_json(200, {"input_tokens": fake.cache.account(body)[2]})
            outcome = outcome or fake.serve(body)
            if isinstance(outcome, Failure):
                fake.finish(index, outcome.status, outcome)
                return self._send_error(outcome.status, outcome.type, outcome.message, outcome.headers)
            fake.finish(index, 200)
            (self._stream if body.get("stream") else self._reply)(*outcome)
        except (BrokenPipeError, ConnectionResetError):   # the client went away (cancel, read timeout)
            self.close_connection = True

    def _send_json(self, status, payload, headers=None):
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in {"content-type": "application/json", "content-length": str(len(data)),
                            "request-id": self.request_id, **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status, kind, message, headers=None):
        self._send_json(status, {"type": "error", "error": {"type": kind, "message": message},
                                 "request_id": self.request_id}, headers)

    def _reply(self, item, message):
        """Non-streaming: the whole Message as JSON (a stream_error becomes its HTTP status)."""
        stalled = "stall_after_events" in item and self.server.fake.stalled(item)
        if "drop_after_events" in item or stalled:
            return self._drop()
        if "stream_error" in item:
            err = item["stream_error"]
            return self._send_error(STATUS_OF.get(err["type"], 500), err["type"], err.get("message", ""))
        content = [{k: v for k, v in block.items() if k != "partial_json"} for block in message["content"]]
        self._send_json(200, dict(message, content=content))

    def _stream(self, item, message):
        stopping = self.server.fake._stopping
        events = sse_events(message, item.get("chunk", DEFAULT_CHUNK))
        if "stream_error" in item:   # the content went out; the error replaces message_delta/stop
            err = {"type": item["stream_error"]["type"], "message": item["stream_error"].get("message", "")}
            cut = item["stream_error"].get("after_events", len(events) - 2)
            events[cut:] = [("error", {"type": "error", "error": err})]
        self.send_response(200)
        for name, value in {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache",
                            "request-id": self.request_id, "transfer-encoding": "chunked"}.items():
            self.send_header(name, value)
        self.end_headers()
        for n, (name, data) in enumerate(events):
            stalled = n == item.get("stall_after_events") and self.server.fake.stalled(item)
            delayed = n and item.get("delay") and stopping.wait(item["delay"])
            if n == item.get("drop_after_events") or stalled or delayed:   # (stopping: the server is closing)
                return self._drop()
            if n == item.get("end_after_events"):
                break
            self._chunk(sse_frame(name, data, item.get("split_data", False), n))
        self._chunk(b"")   # the terminating zero-length chunk

    def _chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _drop(self):
        """Close the socket mid-body: the client sees an incomplete chunked read."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


# ---------------------------------------------------------------- running as a process
def main(argv=None):
    parser = argparse.ArgumentParser(description="Scripted fake Anthropic Messages API on 127.0.0.1.")
    parser.add_argument("--script", help="JSON file: a list of script items")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", help="the bound port is written here once listening")
    parser.add_argument("--log", help="every request is appended here as a JSON line")
    parser.add_argument("--max-context-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    script = json.loads(Path(args.script).read_text(encoding="utf-8")) if args.script else []
    fake = FakeAnthropic(script, args.max_context_tokens, port=args.port, log_path=args.log)
    if args.port_file:   # write, then rename: a reader never sees half a port
        Path(args.port_file + ".tmp").write_text(str(fake.port), encoding="utf-8")
        Path(args.port_file + ".tmp").replace(args.port_file)
    print(f"fake anthropic listening on {fake.base_url}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(0.2):
        pass
    fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
