"""events.py: the event vocabulary, the append-only JSONL session log, the bus and the projections.

Owns: the envelope and line format, appending (one write per line, fsync at loop boundaries),
recovery of torn/bad lines, replay, and the pure folds from events to the Anthropic `messages`
history, the kernel's state and usage totals.
Must not: import any other khaelor module, touch the network, or rewrite a line once written
(the one exception: a torn final line, which was never a complete event, is cut off on open).
"""
import json
import os
import time
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path

SCHEMA_VERSION = 1

DURABLE = frozenset("""
    SessionCreated BaselineRecorded UserMessageCreated SteeringQueued SteeringInjected
    ModelTextBlockCompleted ModelThinkingBlockCompleted ToolRequested ModelResponseCompleted
    ModelRequestFailed PermissionRequested PermissionGranted PermissionDenied ToolStarted
    ToolCompleted ToolFailed ToolCancelled FileModified ProcessStarted ProcessExited ContextPruned
    ContextCompacted Interrupted VerificationRequested TaskCompleted TaskFailed SessionRenamed
    ModelChanged""".split())
EPHEMERAL = frozenset("ModelStarted TextDelta ThinkingDelta ToolInputDelta ToolOutput Status".split())

# Events that give a tool_use its tool_result. A denial is answered to the model like a result.
TOOL_RESULT_EVENTS = frozenset({"ToolCompleted", "ToolFailed", "ToolCancelled", "PermissionDenied"})
TURN_END_EVENTS = frozenset({"TaskCompleted", "TaskFailed", "Interrupted"})
# The doom-loop question goes through the permission panel under this pseudo-capability.
LOOP_CAPABILITY = "loop.continue"
LOST_RESULT = "[no result was recorded for this call: its line in the session log could not be read]"
PRUNED_PLACEHOLDER = "[old tool result removed to save context; run the tool again if you need it]"


class KhaelorError(Exception):
    """Base of every error khaelor reports to the user as one actionable line."""


class SessionFileError(KhaelorError):
    def __init__(self, path, problem):
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}")


# ---------------------------------------------------------------- locations

def khaelor_home() -> Path:
    return Path(os.environ.get("KHAELOR_HOME") or Path.home() / ".khaelor")


def sessions_dir(home: Path, project_root: Path) -> Path:
    """One folder per project: readable name plus a hash of the absolute path (names collide)."""
    root = str(Path(project_root).resolve())
    return home / "sessions" / f"{Path(root).name or 'root'}-{sha256(root.encode()).hexdigest()[:12]}"


def new_session_id() -> str:
    """Sorts by creation time (to the millisecond), with a random tail against collisions."""
    now = time.time()
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}-{os.urandom(3).hex()}"


def list_session_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.jsonl")) if directory.is_dir() else []


# ---------------------------------------------------------------- the store

class SessionStore:
    """The JSONL log of one session, held in memory as `events` and appended to on disk."""

    def __init__(self, path: Path, session_id: str, events: list, warnings: list):
        self.path, self.session_id, self.events, self.warnings = path, session_id, events, warnings
        self._fd = None

    @classmethod
    def create(cls, directory: Path, session_id: str | None = None) -> "SessionStore":
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SessionFileError(directory, f"cannot create the sessions folder ({e.strerror}); "
                                   "point KHAELOR_HOME at a writable directory") from None
        session_id = session_id or new_session_id()
        return cls(directory / f"{session_id}.jsonl", session_id, [], [])

    @classmethod
    def open(cls, path: Path, read_only: bool = False) -> "SessionStore":
        """Replay a log. A torn last line is cut off (only ignored when read_only, for listings that
        must not touch a log another khaelor may be writing); a bad line in the middle is skipped."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise SessionFileError(path, f"cannot be read ({e.strerror})") from None
        events, warnings = [], []
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            warnings.append(f"{path}: the last line was cut off mid-write (a crash); dropped it "
                            f"({len(data) - keep} bytes)")
            if not read_only:
                _truncate(path, keep)
            data = data[:keep]
        for number, line in enumerate(data.splitlines(), 1):
            event = _parse_line(line)
            if event is None:
                warnings.append(f"{path}:{number} is not a valid event; skipped it, kept the rest")
                continue
            if event["v"] > SCHEMA_VERSION:
                raise SessionFileError(path, f"line {number} was written by a newer khaelor (schema "
                                       f"v{event['v']}, this one reads v{SCHEMA_VERSION}); upgrade khaelor to open it")
            events.append(event)
        return cls(path, path.stem, events, warnings)

    @property
    def next_seq(self) -> int:
        return self.events[-1]["seq"] + 1 if self.events else 1

    def append(self, event: dict) -> None:
        """One write of one whole line, so a crash can only tear the line being written. A full disk
        (or a file size limit) can take part of a line and refuse the rest: that part is cut off
        again, so the log on disk stays whole lines, and the event counts as not recorded."""
        line = (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        done = 0
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            while done < len(line):     # after a short write, the next one reports why (ENOSPC, EFBIG)
                done += os.write(self._fd, memoryview(line)[done:])
        except OSError as e:
            if done:
                try:
                    os.ftruncate(self._fd, os.fstat(self._fd).st_size - done)
                except OSError:
                    pass                # still safe: the next open drops a torn last line
            raise self._failed("cannot append to the session log", e) from None
        self.events.append(event)

    def sync(self) -> None:
        """fsync at loop boundaries (after a response, after a tool batch, at task end)."""
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError as e:
                raise self._failed("cannot save the session log to disk", e) from None

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            except OSError as e:
                raise self._failed("cannot save the session log to disk", e) from None
            finally:
                os.close(fd)

    def _failed(self, what: str, error: OSError) -> "SessionFileError":
        return SessionFileError(self.path, f"{what} ({error.strerror}); the session up to here is intact. "
                                "Free disk space or fix KHAELOR_HOME's permissions, then `khaelor -c` continues it")


def meta_path(log_path: Path) -> Path:
    return Path(log_path).with_suffix(".meta.json")


def read_meta(log_path: Path) -> dict | None:
    """The session's `.meta.json` cache, or None when it is missing, unreadable or stale (the log's
    size or mtime changed since the cache was written)."""
    try:
        stat = os.stat(log_path)
        meta = json.loads(meta_path(log_path).read_bytes())
    except (OSError, ValueError):
        return None
    fresh = isinstance(meta, dict) and meta.get("log_size") == stat.st_size and meta.get("log_mtime_ns") == stat.st_mtime_ns
    return meta if fresh else None


def write_meta(log_path: Path, meta: dict, stat: os.stat_result | None = None) -> None:
    """Atomically replace the cache, stamped with the log's size and mtime — `stat` taken before
    the log was read, when another khaelor may be appending to it. A cache that cannot be written
    is only a slower listing next time, so failures are ignored."""
    target = meta_path(log_path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        stat = stat or os.stat(log_path)
        tmp.write_text(json.dumps({**meta, "log_size": stat.st_size, "log_mtime_ns": stat.st_mtime_ns}))
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)


def _parse_line(line: bytes) -> dict | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    ok = isinstance(event, dict) and isinstance(event.get("v"), int) and isinstance(event.get("seq"), int)
    return event if ok and isinstance(event.get("type"), str) else None


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


# ---------------------------------------------------------------- the bus

class Bus:
    """Publishes events. A durable event is on disk before any subscriber sees it."""

    def __init__(self, store: SessionStore):
        self.store = store
        self._subscribers = []

    def subscribe(self, fn):
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn)

    def emit(self, type: str, **payload) -> dict:
        durable = type in DURABLE
        if not durable and type not in EPHEMERAL:
            raise ValueError(f"unknown event type {type!r}")
        event = {"v": SCHEMA_VERSION, "seq": self.store.next_seq if durable else 0,
                 "id": os.urandom(8).hex(), "ts": int(time.time() * 1000),
                 "session": self.store.session_id, "type": type, **payload}
        if durable:
            self.store.append(event)
        for fn in list(self._subscribers):
            fn(event)
        return event


# ---------------------------------------------------------------- projection: API history

def tool_result_text(event: dict) -> str:
    if event["type"] == "PermissionDenied":
        text = f"Permission denied: {event.get('reason') or 'the user declined this call'}."
        if event.get("feedback"):
            text += f" The user says: {event['feedback']}"
        return text
    if event["type"] == "ToolCancelled":
        return f"Cancelled: {event.get('reason') or 'the tool did not finish'}."
    return event.get("output") or "(no output)"


def history(events: list[dict]) -> list[dict]:
    """Fold durable events into the Anthropic `messages` list. Pure and deterministic: the same
    events always give the same bytes. A model response counts only once ModelResponseCompleted
    closes it; blocks of an attempt that failed or was cut off are not part of the conversation."""
    start, messages = 0, []
    for i, event in enumerate(events):
        if event["type"] == "ContextCompacted":
            start = next((j for j in range(i + 1) if events[j]["seq"] > event["cut_seq"]), i)
            messages = [{"role": "user", "content": [{"type": "text", "text": event["summary"]}]}]
    pruned = {tid for e in events if e["type"] == "ContextPruned" for tid in e["tool_use_ids"]}
    pending, open_ids = [], set()
    for event in events[start:]:
        kind = event["type"]
        if kind in TOOL_RESULT_EVENTS and any(b.get("id") == event["tool_use_id"] for b in pending):
            # The response's closing line was lost (a damaged log); a result proves the response completed.
            _close_calls(messages, open_ids)
            messages.append({"role": "assistant", "content": pending})
            open_ids, pending = {b["id"] for b in pending if b["type"] == "tool_use"}, []
        if kind in ("UserMessageCreated", "SteeringInjected", "VerificationRequested"):
            pending = []
            if event["text"]:
                _close_calls(messages, open_ids)
                _add_user_block(messages, {"type": "text", "text": event["text"]})
        elif kind == "ModelTextBlockCompleted":
            if event["text"]:
                pending.append({"type": "text", "text": event["text"]})
        elif kind == "ModelThinkingBlockCompleted":
            pending.append({"type": "redacted_thinking", "data": event["redacted"]} if "redacted" in event
                           else {"type": "thinking", "thinking": event["thinking"], "signature": event["signature"]})
        elif kind == "ToolRequested":
            pending.append({"type": "tool_use", "id": event["tool_use_id"], "name": event["name"],
                            "input": event["input"]})
        elif kind in ("ModelRequestFailed", "Interrupted"):
            pending = []
        elif kind == "ModelResponseCompleted":
            if pending:
                _close_calls(messages, open_ids)
                messages.append({"role": "assistant", "content": pending})
                open_ids = {b["id"] for b in pending if b["type"] == "tool_use"}
            pending = []
        elif kind in TOOL_RESULT_EVENTS and event["tool_use_id"] in open_ids:
            open_ids.discard(event["tool_use_id"])
            block = {"type": "tool_result", "tool_use_id": event["tool_use_id"],
                     "content": PRUNED_PLACEHOLDER if event["tool_use_id"] in pruned else tool_result_text(event)}
            if kind != "ToolCompleted":
                block["is_error"] = True
            _add_user_block(messages, block)
    return messages


def _close_calls(messages: list, open_ids: set) -> None:
    """Every tool_use is answered before the conversation moves on. The kernel records a result for
    each call, so this only acts on a damaged log (a skipped line held the result)."""
    for tool_use_id in sorted(open_ids):
        _add_user_block(messages, {"type": "tool_result", "tool_use_id": tool_use_id, "content": LOST_RESULT,
                                   "is_error": True})
    open_ids.clear()


def _add_user_block(messages: list, block: dict) -> None:
    """Consecutive user content shares one message: tool results first, then text (the API's rule)."""
    if messages and messages[-1]["role"] == "user":
        messages[-1]["content"].append(block)
    else:
        messages.append({"role": "user", "content": [block]})


# ---------------------------------------------------------------- projection: kernel state

@dataclass
class State:
    """What the kernel needs to decide its next step; every field is derived from the log."""
    turn_open: bool = False            # a user message arrived after the last turn end
    needs_model: bool = False          # the conversation ends on the user side
    pending_tools: list = field(default_factory=list)   # ToolRequested of completed responses, not answered yet
    started_tools: set = field(default_factory=set)      # tool_use_ids with ToolStarted and no result
    queued_steering: list = field(default_factory=list)  # SteeringQueued texts not yet injected
    responses_in_turn: int = 0         # ModelResponseCompleted since the turn's user message
    last_stop_reason: str | None = None
    recent_calls: list = field(default_factory=list)     # (name, input json) of the newest tool calls
    last_failure: dict | None = None   # the newest ModelRequestFailed of this turn that was not retried
    objective: str = ""                # the user message that opened the turn
    changes: list = field(default_factory=list)   # (seq, path) of this turn's FileModified
    commands: list = field(default_factory=list)  # this turn's bash runs and process starts: {seq, command, exit_code}
    nudges: int = 0                    # VerificationRequested in this turn
    suggested_checks: list = field(default_factory=list)   # the check commands those nudges named


def kernel_state(events: list[dict]) -> State:
    s = State()
    attempt = []    # ToolRequested of the response being streamed
    calls, loop_asks = {}, set()    # ToolRequested by id; ids of unanswered "continue the loop?" questions
    for event in events:
        kind = event["type"]
        if kind == "UserMessageCreated":
            s.turn_open, s.needs_model, s.responses_in_turn, s.last_failure = True, True, 0, None
            s.objective, s.changes, s.commands, s.nudges, s.suggested_checks = event["text"], [], [], 0, []
            attempt, s.recent_calls = [], []
        elif kind in TURN_END_EVENTS:
            s.turn_open, s.needs_model = False, False
        elif kind == "SteeringQueued":
            s.queued_steering.append(event["text"])
        elif kind == "SteeringInjected":
            if event["text"] in s.queued_steering:
                s.queued_steering.remove(event["text"])
            s.needs_model = True
        elif kind == "ToolRequested":
            attempt.append(event)
            calls[event["tool_use_id"]] = event
        elif kind == "ModelRequestFailed":
            attempt = []
            if not event.get("retrying"):
                s.last_failure = event
        elif kind == "ModelResponseCompleted":
            # Only calls of completed responses count: a retried stream repeats calls, the model did not.
            s.recent_calls = (s.recent_calls + [(t["name"], json.dumps(t["input"], sort_keys=True))
                                                for t in attempt])[-3:]
            s.pending_tools, attempt = attempt, []
            s.responses_in_turn += 1
            s.last_stop_reason = event["stop_reason"]
            s.needs_model = bool(s.pending_tools)
        elif kind == "ToolStarted":
            s.started_tools.add(event["tool_use_id"])
        elif kind in TOOL_RESULT_EVENTS:
            attempt = [t for t in attempt if t["tool_use_id"] != event["tool_use_id"]]   # (a damaged log)
            call = calls.get(event["tool_use_id"])
            if kind in ("ToolCompleted", "ToolFailed") and call and call["name"] == "bash":
                s.commands.append({"seq": event["seq"], "command": str(call["input"].get("command", "")),
                                   "exit_code": (event.get("meta") or {}).get("exit_code")})
            s.started_tools.discard(event["tool_use_id"])
            s.pending_tools = [t for t in s.pending_tools if t["tool_use_id"] != event["tool_use_id"]]
        elif kind == "ContextCompacted":
            s.needs_model = s.turn_open
        elif kind == "FileModified":
            s.changes.append((event["seq"], event["path"]))
        elif kind == "ProcessStarted":
            s.commands.append({"seq": event["seq"], "command": str(event.get("command", "")), "exit_code": None,
                               "process_id": event["process_id"]})
        elif kind == "ProcessExited":
            for command in s.commands:
                if command.get("process_id") == event["process_id"]:
                    command["exit_code"] = event.get("exit_code")
        elif kind == "VerificationRequested":
            s.nudges, s.needs_model = s.nudges + 1, True
            s.suggested_checks = s.suggested_checks + list(event.get("commands") or [])
        elif kind == "PermissionRequested" and event.get("capability") == LOOP_CAPABILITY:
            loop_asks.add(event["tool_use_id"])
        elif kind == "PermissionGranted" and event["tool_use_id"] in loop_asks:
            loop_asks.discard(event["tool_use_id"])
            s.recent_calls = []          # the user let the repeated call go on: count afresh
    return s


# ---------------------------------------------------------------- projection: usage

USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def usage_totals(events: list[dict]) -> dict:
    """Summed per model, from the API's own usage fields only."""
    totals = {}
    for event in events:
        if event["type"] == "ModelResponseCompleted":
            per_model = totals.setdefault(event.get("model") or "unknown", dict.fromkeys(USAGE_KEYS, 0))
            for key in USAGE_KEYS:
                per_model[key] += event["usage"].get(key) or 0
    return totals


def session_title(events: list[dict]) -> str:
    title = ""
    for event in events:
        if event["type"] == "SessionRenamed":
            title = event["title"]
        elif event["type"] == "UserMessageCreated" and not title:
            title = " ".join(event["text"].split())[:60]
    return title

