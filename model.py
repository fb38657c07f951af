"""model.py: the model client over anthropic.AsyncAnthropic — streaming, typed errors, retries.

Owns: the only `import anthropic` in khaelor (lazily, inside `_sdk()`), the retry policy (the SDK's
own retries are off so every attempt is visible here), the error taxonomy the kernel branches on,
and the thinking and effort table (the price table and cost are events.py's). Events leave here as
plain dicts with only the fields the API defined.
Must not: import kernel/tools/ui/context, touch files, or estimate usage (usage is the API's).
"""
import asyncio
import gc
import json
import random
import re
import sys
import threading
import time
from typing import NamedTuple

from events import KhaelorError

DEFAULT_MODEL = "claude-sonnet-5-5"
DEFAULT_AUX_MODEL = "claude-haiku-5-5"
# What --model and /model take for each family's current model, as Claude Code's names.
MODEL_ALIASES = {"opus": "claude-opus-5-5", "sonnet": "claude-sonnet-5-5",
                 "haiku": "claude-haiku-5-5"}
MAX_ATTEMPTS = 5            # one call plus four retries
BASE_DELAY_S = 0.5          # jittered exponential: 0.5, 1, 2, 4 … capped below
MAX_DELAY_S = 30.0          # also caps a server's retry-after, so a run never sleeps for hours
# no byte (not even a ping) for this long: the stream is stalled (env KHAELOR_READ_TIMEOUT)
READ_TIMEOUT_S = 120.0

# Thinking and effort by model family, exactly as ANTHROPIC_API.md §3.3 and §3.3a give them;
# requests are built from this table only, so they are legal by construction. Per family: the
# `thinking.type`s it accepts (None: not documented, so no `thinking` is sent and the model's
# default stands), the `output_config.effort` levels (None: no effort is sent; UNLISTED: effort
# is accepted but its levels are not published, so only the level the user asked for is sent),
# and its output limit (None: not documented). A dated id (claude-opus-4-5-20251101) is its
# family's.
EFFORTS = ("low", "medium", "high", "xhigh", "max")
THINKING_MODES = ("off", "adaptive", "always")
UNLISTED = "unlisted"
NO_XHIGH = ("low", "medium", "high", "max")
ADAPTIVE_OR_OFF = frozenset({"adaptive", "disabled"})
BUDGETED = frozenset({"enabled", "disabled"})
REASONING = {
    "claude-opus-5-5": (frozenset({"adaptive"}), UNLISTED, 128_000),
    "claude-sonnet-5-5": (frozenset({"adaptive", "between_tools"}), UNLISTED, 128_000),
    "claude-haiku-5-5": (None, UNLISTED, 128_000),
    "claude-fable-5-2": (None, None, 128_000),
    "claude-mythos-5-2": (None, None, None),
    "claude-fable-5-1": (frozenset({"adaptive"}), UNLISTED, None),
    "claude-mythos-5-1": (frozenset({"adaptive"}), UNLISTED, None),
    "claude-fable-5": (frozenset({"adaptive"}), EFFORTS, None),
    "claude-mythos-5": (frozenset({"adaptive"}), EFFORTS, None),
    "claude-mythos-preview": (None, NO_XHIGH, None),
    "claude-opus-5": (ADAPTIVE_OR_OFF, EFFORTS, 128_000),
    "claude-sonnet-5": (ADAPTIVE_OR_OFF, EFFORTS, 128_000),
    "claude-opus-4-8": (ADAPTIVE_OR_OFF, EFFORTS, 128_000),
    "claude-opus-4-7": (ADAPTIVE_OR_OFF, EFFORTS, 128_000),
    "claude-opus-4-6": (ADAPTIVE_OR_OFF | {"enabled"}, NO_XHIGH, 128_000),
    "claude-sonnet-4-6": (ADAPTIVE_OR_OFF | {"enabled"}, NO_XHIGH, 128_000),
    "claude-opus-4-5": (BUDGETED, ("low", "medium", "high"), 64_000),
    "claude-sonnet-4-5": (BUDGETED, None, None),
    "claude-haiku-4-5": (BUDGETED, None, 64_000),
}
# Opus 5 turns thinking off only at effort high or below (§3.3).
OFF_UP_TO_HIGH = ("claude-opus-5",)
MIN_BUDGET_TOKENS = 1024    # `enabled` thinking: budget_tokens >= 1024 and < max_tokens
# Transient failures the API itself tells clients to retry (ANTHROPIC_API.md §4.2).
RETRYABLE_STATUS = {408, 409, 429}
RETRYABLE_TYPES = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}
# §3.2's overflow messages, where a 400's message starts (one naming the window is no overflow)
OVERFLOW_MESSAGE = re.compile(r"prompt is too long"
                              r"|input length and `max_tokens` exceed context limit")


class ModelError(KhaelorError):
    """kind: retryable | context_overflow | auth | invalid_request."""

    def __init__(self, kind: str, message: str, status: int | None = None):
        self.kind, self.status = kind, status
        super().__init__(message)


_import_lock = threading.Lock()


def _sdk():
    """Import the SDK on first use (≈2 s, ~3,500 modules), never at start-up."""
    with _import_lock:
        first = "anthropic" not in sys.modules
        import anthropic
        if first:
            # What is loaded by now lives as long as the process: out of the collector's sight, a
            # full collection no longer walks the SDK's objects (it held the loop 65-70 ms).
            gc.freeze()
        return anthropic


def preload() -> None:
    """Start importing the SDK in a background thread so it is ready when the first request goes.
    Not a daemon: an exit during the import waits for it, because finalizing the interpreter under
    a daemon thread that is inside the SDK's native extension aborts the process (SIGABRT)."""
    threading.Thread(target=_sdk, name="khaelor-sdk-import").start()


class Reasoning(NamedTuple):
    """A thinking setting as one model takes it: the request fields (max_tokens, and thinking and
    output_config where they apply) and what to tell the user where it could not be had as asked."""
    fields: dict
    notes: list


def family_of(model: str) -> str | None:
    """The REASONING key of a model id (a date suffix dropped), or None for a model not in it."""
    base = re.sub(r"-\d{8}$", "", model)
    return base if base in REASONING else None


def reasoning(model: str, thinking: str = "adaptive", effort: str | None = None,
              show: bool = True, max_tokens: int = 32_000) -> Reasoning:
    """The fields for `thinking` (THINKING_MODES) at `effort` (None: the model's default), legal for
    `model` by REASONING; `show`: the thinking is summarized for the user, else omitted."""
    family = family_of(model)
    types, levels, limit = REASONING.get(family, (None, None, None))
    notes = []
    if limit is not None and max_tokens > limit:
        notes.append(f"max_output_tokens {max_tokens} is above {model}'s limit; {limit} is used")
        max_tokens = limit
    asked = effort
    if thinking == "always" and _rank(effort) < _rank("high"):
        effort = "high"
    if thinking == "off" and types is not None and "disabled" not in types:
        notes.append(f"{model} cannot turn thinking off; it thinks adaptively at effort low")
        thinking, effort = "adaptive", "low"
    if thinking == "off" and family in OFF_UP_TO_HIGH and _rank(effort) > _rank("high"):
        notes.append(f"{model} turns thinking off only at effort high or below; high is used")
        effort = "high"
    if types is None and thinking != "adaptive":
        notes.append(f"{model}'s thinking settings are not documented; its default thinking stands")
    fields = {"max_tokens": max_tokens}
    config = _thinking_config(types, thinking, show, max_tokens)
    if config is not None:
        fields["thinking"] = config
    level = _effort_level(levels, effort)
    if level is not None:
        fields["output_config"] = {"effort": level}
    if asked is not None and level not in (asked, effort):
        notes.append(f"{model} takes effort {describe_efforts(levels)}; "
                     f"{level or 'its default'} is used")
    return Reasoning(fields, notes)


def describe_efforts(levels) -> str:
    if levels is None:
        return "no level (none documented)"
    if levels == UNLISTED:
        return "levels that are not published (the one asked for is sent)"
    return ", ".join(levels)


def _rank(effort: str | None) -> int:
    """Effort levels in order; None (the model's default) counts as below low."""
    return EFFORTS.index(effort) if effort in EFFORTS else -1


def _thinking_config(types, thinking: str, show: bool, max_tokens: int) -> dict | None:
    display = "summarized" if show else "omitted"
    if types is None:
        return None
    if thinking == "off":
        return {"type": "disabled"}
    if "adaptive" in types:
        return {"type": "adaptive", "display": display}
    # an `enabled`-only family: `always` is a budget inside max_tokens; adaptive, its default (off)
    if thinking == "always" and max_tokens > MIN_BUDGET_TOKENS:
        budget = max(MIN_BUDGET_TOKENS, max_tokens // 2)
        return {"type": "enabled", "budget_tokens": budget, "display": display}
    return None


def _effort_level(levels, effort: str | None) -> str | None:
    """The level sent: as asked where accepted (or levels unpublished), else the highest below."""
    if effort is None or levels is None:
        return None
    if levels == UNLISTED or effort in levels:
        return effort
    lower = [level for level in levels if _rank(level) <= _rank(effort)]
    return lower[-1] if lower else levels[0]


def refused_field(message: str, request: dict) -> str | None:
    """The request field a 400 refuses when it names the thinking setting ("thinking") or the
    effort ("output_config"); None for anything else, such as an edited thinking block in
    `messages.N`, which dropping a field cannot fix."""
    lowered = message.lower()
    if re.search(r"\bmessages\.\d", lowered):
        return None
    if "thinking" in lowered and "thinking" in request:
        return "thinking"
    if ("effort" in lowered or "output_config" in lowered) and "output_config" in request:
        return "output_config"
    return None


class ModelClient:
    """One client per process. `stream(request)` yields plain event dicts; on a retryable failure
    after events were yielded it yields {"type": "restart", ...} and starts the request again."""

    def __init__(self, *, api_key: str | None = None, auth_token: str | None = None,
                 base_url: str | None = None, max_attempts: int = MAX_ATTEMPTS,
                 read_timeout: float = READ_TIMEOUT_S, on_status=None):
        self._api_key, self._auth_token, self._base_url = api_key, auth_token, base_url
        self.max_attempts, self.read_timeout = max_attempts, read_timeout
        self.on_status = on_status or (lambda text: None)
        self._client = None

    def _get_client(self):
        if self._client is None:
            sdk = _sdk()
            timeout = sdk.Timeout(self.read_timeout, connect=10.0)
            # An explicit credential also keeps the SDK from probing profiles and logging about
            # them.
            credential = {"api_key": self._api_key}
            if self._auth_token and not self._api_key:
                credential = {"auth_token": self._auth_token}
            self._client = sdk.AsyncAnthropic(**credential, base_url=self._base_url,
                                              max_retries=0, timeout=timeout)
        return self._client

    async def stream(self, request: dict):
        for attempt in range(1, self.max_attempts + 1):
            yielded = finished = False
            try:
                if self._client is None:
                    # the import (≈2 s) off the loop: keys, the spinner and Esc stay live meanwhile
                    await asyncio.to_thread(_sdk)
                client = self._get_client()
                # read raw: the SDK's typed events (a pydantic model a delta) cost half the CPU
                raw = client.messages.with_streaming_response.create(stream=True, **request)
                async with raw as response:
                    async for event in _server_events(response):
                        yielded, finished = True, event["type"] == "message_stop"
                        yield event
                if not finished:    # a proxy may close a chunked body cleanly mid-message
                    raise ModelError("retryable", "the stream ended before message_stop")
                return
            except Exception as exc:  # classified right here; nothing is swallowed (not a cancel)
                error = classify(exc)
                last = attempt == self.max_attempts
                delay = _retry_delay(exc, attempt)
                if error.kind != "retryable" or last or delay is None:
                    if error.kind == "retryable" and attempt > 1:
                        error = ModelError("retryable",
                                           f"{error} (gave up after {attempt} attempts)",
                                           error.status)
                    raise error from None
                self.on_status(f"{error} — retrying in {delay:.1f}s"
                               f" (attempt {attempt + 1} of {self.max_attempts})")
                if yielded:
                    yield {"type": "restart", "error": str(error), "status": error.status}
                await asyncio.sleep(delay)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def complete(self, request: dict) -> dict:
        """A whole response without tools (compaction summaries, titles): {"text", "usage",
        "model"}."""
        text, usage, model = [], {}, request.get("model")
        async for event in self.stream(request):
            if event["type"] == "restart":
                text = []
            elif event["type"] == "content_block_delta" and \
                    event["delta"].get("type") == "text_delta":
                text.append(event["delta"]["text"])
            elif event["type"] in ("message_start", "message_delta"):
                usage = merge_usage(usage, event)
        return {"text": "".join(text), "usage": usage, "model": model}


def merge_usage(usage: dict, event: dict) -> dict:
    """message_start carries the input side; message_delta's counts are cumulative (overwrite)."""
    raw = event.get("usage") or {}
    if event["type"] == "message_start":
        raw = event["message"]["usage"]
    merged = dict(usage)
    for ours, theirs in (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                         ("cache_read_tokens", "cache_read_input_tokens"),
                         ("cache_write_tokens", "cache_creation_input_tokens")):
        if raw.get(theirs) is not None:
            merged[ours] = raw[theirs]
    # the part of output_tokens that was thinking, where the stream says (already in output_tokens)
    details = raw.get("output_tokens_details") or {}
    if details.get("thinking_tokens") is not None:
        merged["thinking_tokens"] = details["thinking_tokens"]
    return merged


# the events a reply is made of; any other (ping, a kind added later) is skipped
STREAM_EVENTS = frozenset({"message_start", "content_block_start", "content_block_delta",
                           "content_block_stop", "message_delta", "message_stop"})


async def _server_events(response):
    """The STREAM_EVENTS of a response as the API sent them: the JSON of each server-sent event's
    data, which names its kind in "type". An event's data may span several `data:` lines (joined
    by newlines, as the SSE format has it); a blank line ends the event. An `error` event raises
    the SDK's APIStatusError, as the SDK's own stream does."""
    data = []
    async for line in response.iter_lines():
        if line.startswith("data:"):
            data.append(line[5:])
            continue
        if line or not data:    # `event:`, `id:`, a `:` comment, or a blank line after them
            continue
        event = json.loads("\n".join(data))
        data = []
        if event.get("type") == "error":
            raise _sdk().APIStatusError(f"{event}", response=response.http_response, body=event)
        if event.get("type") in STREAM_EVENTS:
            yield event


def classify(exc: BaseException) -> ModelError:
    sdk = _sdk()
    if isinstance(exc, ModelError):
        return exc
    if isinstance(exc, sdk.APIStatusError):
        status, err_type = exc.status_code, exc.type or ""
        message = exc.api_message or str(exc)
        label = f"API error {status}" + (f" ({err_type})" if err_type else "") + f": {message}"
        if status == 200:   # an `error` event in the middle of a stream
            label = f"stream error ({err_type}): {message}"
        if status in (401, 403):
            # the API's own reason stays: a 403 says what the key may not do
            return ModelError("auth", f"{label}; check ANTHROPIC_API_KEY", status)
        if status == 413 or (status == 400 and OVERFLOW_MESSAGE.match(message.strip().lower())):
            return ModelError("context_overflow", label, status)
        transient = status in RETRYABLE_STATUS or status >= 500 or err_type in RETRYABLE_TYPES
        # the server's own word decides, as for the SDK (ANTHROPIC_API.md §4.3)
        if transient or exc.response.headers.get("x-should-retry") == "true":
            return ModelError("retryable", label, status)
        return ModelError("invalid_request", label, status)
    import httpx2  # the SDK's transport
    cause = exc.__cause__
    if isinstance(exc, sdk.APIConnectionError) and not isinstance(cause, httpx2.ConnectError):
        # SDK 2.17 wraps a failure after the stream began too: say what it was, not "cannot reach"
        failed_later = isinstance(cause, httpx2.TransportError)
        if failed_later and not isinstance(cause, httpx2.ConnectTimeout):
            exc = cause
    if isinstance(exc, sdk.APIConnectionError):
        # which address: a wrong ANTHROPIC_BASE_URL is the usual cause
        url = getattr(getattr(exc, "request", None), "url", "")
        where = f" at {url}" if url else ""
        return ModelError("retryable", f"cannot reach the API{where}: {exc}")
    if isinstance(exc, TypeError) and "authentication" in str(exc):
        return ModelError("auth", "no API key: set ANTHROPIC_API_KEY")
    if isinstance(exc, httpx2.TimeoutException):
        return ModelError("retryable", f"the stream stalled ({type(exc).__name__}: no data within"
                          " the read timeout; KHAELOR_READ_TIMEOUT sets it)")
    if isinstance(exc, httpx2.TransportError):
        return ModelError("retryable",
                          f"the connection failed mid-stream ({type(exc).__name__}: {exc})")
    return ModelError("invalid_request", f"unexpected client error {type(exc).__name__}: {exc}")


def _retry_delay(exc: BaseException, attempt: int) -> float | None:
    """As the SDK has it (ANTHROPIC_API.md §4.3): retry-after-ms, else retry-after in seconds or
    as an HTTP date; a value not > 0 (retry-after: 0) backs off as no header does. None:
    `x-should-retry: false`, the server saying a retry cannot help."""
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    if str(headers.get("x-should-retry", "")).lower() == "false":
        return None
    try:
        value = float(headers.get("retry-after-ms")) / 1000
    except (TypeError, ValueError):
        value = _seconds_until(headers.get("retry-after"))
    if value is not None and value > 0:
        return min(value, MAX_DELAY_S)
    return min(BASE_DELAY_S * 2 ** (attempt - 1), MAX_DELAY_S) * random.uniform(0.75, 1.0)


def _seconds_until(retry_after: str | None) -> float | None:
    import email.utils
    try:
        return float(retry_after)
    except (TypeError, ValueError):
        pass
    try:
        return email.utils.parsedate_to_datetime(retry_after).timestamp() - time.time()
    except (TypeError, ValueError):
        return None
