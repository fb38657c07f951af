"""kernel.py: the state-derived agent loop.

Owns: `derive_next` (a pure function of the log's projection), the stream reducer (SDK stream
events → our events, pure), the tool runtime (permission gate → execute → record), steering,
interruption, the turn budget, the doom-loop question and the verification gate (ADR-12). Every
decision is re-derived from the log on each iteration, so a crash resumes mid-conversation.
Must not: import ui, touch files or processes itself (tools.py does), or keep anything that
matters only in loop-local variables.
"""
import asyncio
import json
import re
import time
import traceback
from dataclasses import replace

import context
import events
import permissions
import tools
from model import ModelError, merge_usage, refused_field

# byte-identical consecutive tool calls before the run pauses
DOOM_LOOP_REPEATS = 3
# a streaming text block reaches the log this often, and a kill -9 loses at most this much of it
CHECKPOINT_INTERVAL_S = 0.25
# and reaches the disk this often (what a power cut loses)
CHECKPOINT_SYNC_S = 1.0
# or as soon as this much new text has arrived
CHECKPOINT_CHARS = 4096
# reminders to run a check before an answer is delivered as it is (ADR-12)
VERIFY_NUDGES = 2
# @path in a message (events.mentions): attached, up to ATTACH_MAX of them, a file by its first
# ATTACH_LINES lines (the model pages on with read).
ATTACH_MAX = 5
ATTACH_LINES = 500
# why an @mention was not attached, as the user is told: by the rules' answer or read's error kind
NOT_ATTACHED = {"ask": "reading it asks; the model can read it with its tools, after asking",
                "deny": "reading it is denied", "not_found": "no such file or folder",
                "binary": "a binary file (only text is attached)"}
# the request fields a 400 may refuse (model.refused_field), as the user knows them
REFUSED_SETTINGS = {"thinking": "thinking setting", "output_config": "effort setting"}


# ---------------------------------------------------------------- deciding

def derive_next(state: events.State, max_turns: int | None = None,
                budget: str | None = None) -> str:
    """One of: execute-tools, inject-steering, prune, compact, call-model, ask-user, verify,
    max-turns, failed, done, idle. `budget` is the context engine's word on the next request:
    None (it fits), "prune" or "compact" (Context.plan)."""
    if not state.turn_open:
        return "idle"
    if state.last_failure is not None:
        return "failed"
    if state.pending_tools:
        calls = state.recent_calls
        one_call = len(set(calls)) == 1
        doom_loop = len(calls) == DOOM_LOOP_REPEATS and one_call
        if doom_loop and not state.started_tools:
            return "ask-user"
        return "execute-tools"
    if state.steering_now:
        return "inject-steering"
    if state.needs_model:
        if out_of_turns(state, max_turns):
            return "max-turns"
        if budget is not None:
            return budget
        return "call-model"
    if gate_holds(state, max_turns):
        return "verify"
    return "done"


def out_of_turns(state: events.State, max_turns: int | None) -> bool:
    """The turn budget (--max-turns) is spent."""
    return max_turns is not None and state.responses_in_turn >= max_turns


# ---------------------------------------------------------------- the verification gate (ADR-12)

DOC_SUFFIXES = (
    ".md", ".markdown", ".rst", ".txt", ".adoc",
    # data and settings no check covers (manifests that builds read are in NOT_DOCS)
    ".csv", ".tsv", ".jsonl", ".ndjson",
    ".svg", ".png", ".jpg", ".jpeg", ".gif", ".ico",
    ".ini", ".env",
    ".gitignore", ".gitattributes", ".editorconfig", ".dockerignore",
)
DOC_DIRS = ("docs/", "doc/")
DOC_NAMES = ("license", "licence", "authors", "changelog", "notice")
# .txt files that are build input, not documentation
NOT_DOCS = ("cmakelists.txt", "requirements.txt", "constraints.txt")
# Commands that check work: test runners, type checkers, linters, builds (matched anywhere).
CHECK_COMMAND = re.compile(r"""(?x)(?:^|[\s;&|(/])(?:
      pytest | py\.test | tox | nox
    | mypy | pyright | ruff | flake8 | pylint | unittest
    | py_compile | compileall
    | (?:npm|pnpm|yarn|bun)\s+(?:run\s+)?
      (?:test|lint|typecheck|type-check|check|build)\b
    | jest | vitest | mocha | tsc | eslint | biome | playwright
    | node\s+--test
    | deno\s+(?:test|check|lint)
    | make(?:\s+-\S+)*\s+(?:test|tests|check|lint)\b
    | cargo\s+(?:test|check|clippy|build|nextest)
    | go\s+(?:test|vet|build) | gofmt | golangci-lint
    | (?:\./)?gradlew?\s+(?:test|check|build)
    | mvnw?\s+(?:test|verify)
    | ctest | rspec | phpunit | rake\s+test
    | dotnet\s+test | swift\s+test | shellcheck
)(?:$|[\s;&|)])""")
# A script run directly whose name says test: `python tests/test_app.py`, `./run_tests.sh`.
TEST_SCRIPT = re.compile(r"(?:^|[;&|(]\s*)"
                         r"(?:(?:python3?|node|bash|sh|ruby|perl)\s+)?"
                         r"\S*test\S*")


def gate_holds(state: events.State, max_turns: int | None) -> bool:
    """The model ended its turn: hold the answer back while changed code has no check after
    it, at most VERIFY_NUDGES times, and never past the turn budget."""
    if state.last_stop_reason != "end_turn":
        return False
    if state.nudges >= VERIFY_NUDGES:
        return False
    # the user said no (to the check, or to running anything): no more asking
    if state.user_denied:
        return False
    if out_of_turns(state, max_turns):
        return False
    return bool(unverified_changes(state))


def is_code_path(path: str) -> bool:
    """Documentation (.md, .rst, .txt, docs/), data and settings files (.csv, images, .ini,
    .gitignore) need no check; everything else does."""
    lowered = path.replace("\\", "/").lower()
    name = lowered.rsplit("/", 1)[-1]
    if name in NOT_DOCS:
        return True
    in_docs = lowered.startswith(DOC_DIRS) or "/docs/" in lowered
    is_doc = lowered.endswith(DOC_SUFFIXES) or name in DOC_NAMES
    return not (is_doc or in_docs)


def is_check(command: str, suggested: list[str] = ()) -> bool:
    """Does this shell command check the work? Known runners, test scripts, or a suggested check."""
    text = " ".join(command.split())
    if CHECK_COMMAND.search(text) or TEST_SCRIPT.search(text):
        return True
    return any(check and " ".join(check.split()) in text for check in suggested)


def unverified_changes(state: events.State) -> list[str]:
    """Code files changed in this turn after the last check that ran."""
    last_check = max((command["seq"] for command in checks_run(state)), default=0)
    changed = [path for seq, path in state.changes if seq > last_check and is_code_path(path)]
    return list(dict.fromkeys(changed))


def checks_run(state: events.State) -> list[dict]:
    """The commands of this turn that checked the work, oldest first."""
    return [command for command in state.commands
            if is_check(command["command"], state.suggested_checks)]


def verification_nudge(changed: list[str], commands: list[str],
                       attempt: int) -> str:
    """The user-side text the model reads when its answer is held back."""
    files = events.listed(changed, 8)
    header = f"[Khaelor verification, reminder {attempt} of {VERIFY_NUDGES}]"
    lines = [f"{header} Your answer is held back: you changed {files}"
             " in this turn and no check has run since the last change."]
    if commands:
        lines.append("Run the relevant checks, fix what fails,"
                     " then give your final answer again:")
        lines += [f"- `{command}`" for command in commands]
    else:
        lines.append("No check command was found in this project."
                     " Run something that exercises the change"
                     " (its tests, a build, or at least compiling"
                     " or importing the changed files),"
                     " then give your final answer again.")
    lines.append("If a check cannot run here, give your final answer"
                 " and say why. (This message comes from Khaelor,"
                 " not from the user.)")
    return "\n".join(lines)


def completion(state: events.State) -> dict:
    """TaskCompleted's payload: the evidence, and, when the gate held an answer back, the answer
    to deliver (if the model never verified, the withheld answer comes first: never lost)."""
    checks = checks_run(state)
    unverified = unverified_changes(state)
    unresolved = open_problems(state, checks, unverified)
    ran = [{"command": context.clip(check["command"], 500), "exit_code": check["exit_code"]}
           for check in checks]
    preexisting = context.attribute_changes(state)["preexisting"]
    changed_files = [path for _, path in state.changes]
    evidence = {
        "objective": context.clip(state.objective, 2_000),
        "changed_files": list(dict.fromkeys(changed_files)),
        "checks": ran[-20:],
        "unresolved": unresolved,
        "preexisting_changes": preexisting[:50],
        "reminders": state.nudges,
        "stop_reason": state.last_stop_reason,
        "responses": state.responses_in_turn,
    }
    if not state.nudges:
        return {"evidence": evidence}
    # oldest first
    answers = [text for text in state.withheld + [state.last_text] if text] or [""]
    delivered = answers[-1:]
    if unverified:
        # gave up: the withheld answer, then the model's last word
        delivered = dict.fromkeys((answers[0], answers[-1]))
    return {"evidence": evidence, "answer": "\n\n".join(delivered)}


def open_problems(state: events.State, checks: list[dict],
                  unverified: list[str]) -> list[str]:
    """What the evidence lists as unresolved: changes no check ran after,
    and checks whose last run failed or was still running."""
    problems = []
    if unverified:
        names = ", ".join(unverified[:10])
        problem = f"no check ran after the last change to {names}"
        if state.nudges:
            problem += f" (not verified after {state.nudges} reminders)"
        problems.append(problem)
    # each command's last run
    last_runs = {check["command"]: check for check in checks}
    for command, run in last_runs.items():
        shown = context.clip(command, 200)
        if run["exit_code"] is None:
            problems.append(f"`{shown}` was still running")
        elif run["exit_code"] != 0:
            problems.append(f"`{shown}` failed (exit {run['exit_code']})")
    return problems


class StreamReducer:
    """Turns raw stream events (plain dicts) into (event type, payload) pairs. Durable block events
    are produced when a block closes, so a crash keeps every finished block in the log."""

    def __init__(self):
        # stream index -> the open block, its parts not joined yet
        self.blocks = {}
        self.usage = {}
        self.message_id = None
        self.model = None
        self.stop_reason = None
        # monotonic time of the last TextCheckpoint
        self.saved_at: float | None = None
        # monotonic time the open thinking block began
        self.thinking_since: float | None = None

    def reported_usage(self) -> dict:
        """The usage the API has reported so far, under every one of our keys (and the part of
        the output that was thinking, when the API says)."""
        usage = {key: self.usage.get(key, 0) for key in events.USAGE_KEYS}
        if "thinking_tokens" in self.usage:
            usage["thinking_tokens"] = self.usage["thinking_tokens"]
        return usage

    def with_usage(self, payload: dict | None = None) -> dict:
        """A TextCheckpoint payload that also carries the usage the API has reported so far (the
        fold counts a response's newest report once)."""
        return dict(payload or {"index": -1, "text": ""}, model=self.model,
                    message_id=self.message_id, usage=self.reported_usage())

    def checkpoint(self, now: float | None, force: bool = False) -> dict | None:
        """A TextCheckpoint payload: the text streamed into the open text block since the last one,
        once CHECKPOINT_INTERVAL_S or CHECKPOINT_CHARS have passed. now=None: the stream is being
        cut off, so whatever is unsaved, with the usage the API has reported so far. force: the
        unsaved text now, due or not. An open thinking block's is saved the same way, as
        `thinking` (for the screen: a kill -9's Interrupted shows its line; never sent)."""
        if self.saved_at is None:
            self.saved_at = now or 0.0
        payload = None
        for index, block in self.blocks.items():
            if block["type"] not in ("text", "thinking") or not block["unsaved_chars"]:
                continue
            # asked after every delta: join the parts only when a checkpoint is due
            due = force or now is None or now - self.saved_at >= CHECKPOINT_INTERVAL_S
            if due or block["unsaved_chars"] >= CHECKPOINT_CHARS:
                text = "".join(block["parts"][block["n_saved"]:])
                block["n_saved"] = len(block["parts"])
                block["unsaved_chars"] = 0
                payload = {"index": index, "text": text}
                if block["type"] == "thinking":
                    payload = {"index": index, "text": "", "thinking": text}
                    if None not in (now, self.thinking_since):
                        payload["thinking_ms"] = round((now - self.thinking_since) * 1000)
        if now is None and any(self.usage.values()):
            # cut off: the usage goes with the text, or alone
            payload = self.with_usage(payload)
        if payload is not None:
            self.saved_at = now
        return payload

    def cut_thinking(self, now: float) -> dict:
        """The thinking block streaming when the stream is cut off, as the screen showed it (its
        line stays there, so a replay draws it too); never sent: it has no signature."""
        for block in self.blocks.values():
            if block["type"] == "thinking" and self.thinking_since is not None:
                took = round((now - self.thinking_since) * 1000)
                return {"thinking": "".join(block["parts"]), "thinking_ms": took}
        return {}

    def feed(self, event: dict, now: float | None = None) -> list[tuple[str, dict]]:
        """`now` (monotonic): when the event arrived; a thinking block then says how long it took
        (duration_ms, the UI's "✻ Thinking · 4s")."""
        kind = event["type"]
        if kind == "message_start":
            message = event["message"]
            self.message_id = message.get("id")
            self.model = message.get("model")
            self.usage = merge_usage({}, event)
            if any(self.usage.values()):
                # the input is paid for once the request is read: recorded before any text, so
                # a kill -9 mid-reply does not lose it
                return [("TextCheckpoint", self.with_usage())]
        elif kind == "content_block_start":
            # the parts are joined once, at the stop
            block = dict(event["content_block"], parts=[], n_saved=0, unsaved_chars=0)
            self.blocks[event["index"]] = block
            if block["type"] == "thinking":
                self.thinking_since = now
                # thinking has begun, even when no text of it will stream (display omitted)
                return [("ThinkingDelta", {"text": ""})]
        elif kind == "content_block_delta":
            block = self.blocks[event["index"]]
            return self._delta(block, event["delta"])
        elif kind == "content_block_stop":
            closed = self._close(self.blocks.pop(event["index"]))
            thought = closed and closed[0][0] == "ModelThinkingBlockCompleted"
            if thought and None not in (now, self.thinking_since):
                closed[0][1]["duration_ms"] = round((now - self.thinking_since) * 1000)
                self.thinking_since = None
            return closed
        elif kind == "message_delta":
            stop_reason = event["delta"].get("stop_reason")
            self.stop_reason = stop_reason or self.stop_reason
            self.usage = merge_usage(self.usage, event)
        elif kind == "message_stop":
            completed = {"message_id": self.message_id,
                         "model": self.model,
                         "stop_reason": self.stop_reason,
                         "usage": self.reported_usage()}
            return [("ModelResponseCompleted", completed)]
        return []

    @staticmethod
    def _delta(block: dict, delta: dict) -> list:
        kind = delta.get("type")
        if kind == "text_delta":
            block["parts"].append(delta["text"])
            block["unsaved_chars"] += len(delta["text"])
            return [("TextDelta", {"text": delta["text"]})]
        if kind == "thinking_delta":
            block["parts"].append(delta["thinking"])
            block["unsaved_chars"] += len(delta["thinking"])
            return [("ThinkingDelta", {"text": delta["thinking"]})]
        if kind == "signature_delta":
            signature = block.get("signature", "") + delta["signature"]
            block["signature"] = signature
        elif kind == "input_json_delta":
            partial = delta["partial_json"]
            block["parts"].append(partial)
            payload = {"tool_use_id": block["id"], "partial_json": partial}
            return [("ToolInputDelta", payload)]
        return []

    @staticmethod
    def _close(block: dict) -> list:
        kind = block["type"]
        streamed = "".join(block["parts"])
        if kind == "text":
            text = block.get("text", "") + streamed
            return [("ModelTextBlockCompleted", {"text": text})]
        if kind == "thinking":
            thinking = block.get("thinking", "") + streamed
            payload = {"thinking": thinking,
                       "signature": block.get("signature", "")}
            return [("ModelThinkingBlockCompleted", payload)]
        if kind == "redacted_thinking":
            payload = {"redacted": block["data"]}
            return [("ModelThinkingBlockCompleted", payload)]
        if kind == "tool_use":
            payload = StreamReducer._tool_request(block, streamed)
            return [("ToolRequested", payload)]
        return []

    @staticmethod
    def _tool_request(block: dict, streamed: str) -> dict:
        """ToolRequested: input that is not one JSON object is an input_error the model reads."""
        payload = {"tool_use_id": block["id"], "name": block["name"],
                   "input": {}}
        try:
            parsed = json.loads(streamed) if streamed.strip() else {}
            # NaN, Infinity, 1e999: Python reads them, but no request carrying them can be sent
            json.dumps(parsed, allow_nan=False)
        except (ValueError, RecursionError) as e:
            # RecursionError: absurdly deep nesting
            problem = f"the input was not valid JSON ({str(e)[:200]})"
            payload["input_error"] = f"{problem}; it may have been cut off"
            return payload
        if isinstance(parsed, dict):
            payload["input"] = parsed
        else:
            payload["input_error"] = "the input must be a JSON object"
        return payload


# ---------------------------------------------------------------- the loop

def _unattended(decision: permissions.Decision) -> permissions.Decision:
    """What --yes approves (see permissions._confine): project writes; the network only when
    every program of the line is known to need it; outside the project only an install's places;
    never the project's secret files."""
    confine = decision.confine
    if not confine:
        return decision
    network = confine.network and confine.unattended_network
    paths = confine.unattended_paths
    return replace(decision, confine=replace(confine, network=network, paths=paths,
                                             unattended=True))


class Kernel:
    """Runs turns of one session. `ask(request_event) -> (choice, feedback)` answers permission
    questions: choice is "once", "always", "deny" or "nobody" (no one to ask); `grant(rule)`
    persists an "always"."""

    def __init__(self, *, bus, model, toolbox, ctx, rules, project_root,
                 ask, grant=None, yes=False, max_turns=None,
                 permission_mode="default"):
        self.bus = bus
        self.emit = bus.emit
        self.model = model
        self.toolbox = toolbox
        self.ctx = ctx
        self.rules = rules
        self.project_root = project_root
        self.ask = ask
        self.grant = grant
        self.yes = yes
        self.max_turns = max_turns
        # "default", "acceptEdits" or "plan" (events.MODES)
        self.permission_mode = permission_mode
        self.busy = False
        # the log's last seq when Context.plan was last asked
        self.planned_seq = 0
        # the newest request sent (what a 400 refused)
        self.request = {}
        # the thinking an Esc cut off (StreamReducer.cut_thinking), for its Interrupted
        self.cut_thinking = {}

    @property
    def state(self) -> events.State:
        """The session's one projection, kept current by the store as events are appended."""
        return self.bus.store.state

    def cancel_pending(self, reason: str) -> None:
        """Every call still waiting for its result gets a cancelled one, saying why."""
        for call in list(self.state.pending_tools):
            self.emit("ToolCancelled", tool_use_id=call["tool_use_id"],
                      reason=reason)

    def submit(self, text: str, model: str | None = None, typed: str = "") -> None:
        """A user message; while a turn runs it is queued as steering instead. `model`: the one
        this turn's requests use (a command file's), recorded with the message; `typed`: the
        command file's line the user typed, shown instead of its template `text`. Only whitespace
        (a paste of blank lines) is no message: nothing to ask, and the API refuses it."""
        if not text.strip():
            return
        shown = {"typed": typed} if typed else {}
        chosen = {"model": model} if model else {}
        if self.busy:
            self.emit("SteeringQueued", text=text, **shown, **chosen)
            return
        self.cancel_pending("not run: the user sent a new message")
        # typed before an Esc: it goes first, in order
        for queued in list(self.state.queued_steering):
            self.emit("SteeringInjected", text=queued)
        self.emit("UserMessageCreated", text=text, **self.attachments(text), **chosen, **shown)

    def send_queued(self) -> bool:
        """Messages typed after the turn's last request (while it wrote its last checkpoint) were
        queued as steering that no step took: they start the next turn, the last as its message
        (or the first command file with a model: its turn has that model, the rest steer it).
        False: none waits, or a turn runs."""
        queued = self.state.queued_steering
        if not queued or self.busy:
            return False
        last = next((text for text in queued if text in self.state.queued_models), queued[-1])
        for text in queued[:queued.index(last)]:
            self.emit("SteeringInjected", text=text)
        # a command file's line, shown as when it was queued
        typed = next((event.get("typed") for event in reversed(self.bus.store.events)
                      if event["type"] == "SteeringQueued" and event["text"] == last), None)
        shown = {"typed": typed} if typed else {}
        model = self.state.queued_models.get(last)
        chosen = {"model": model} if model else {}
        self.emit("UserMessageCreated", text=last, **self.attachments(last), **shown, **chosen)
        return True

    def attachments(self, text: str) -> dict:
        """@path mentions the rules let the model read without asking, attached as read would
        show them (a file's first ATTACH_LINES lines, a folder's listing): no round trip."""
        mentions = events.mentions(text)[:ATTACH_MAX]
        if not mentions:
            return {}
        attached, skipped = [], []
        # what read_now saw: the log's fold then counts these files as read (an edit may follow)
        self.toolbox.seen = []
        for mention in mentions:
            tool_input = {"file_path": mention, "limit": ATTACH_LINES}
            decision = self.decide("read", tool_input)
            if decision.action != "allow" or decision.floor:
                answer = "deny" if decision.floor else decision.action
                skipped.append([mention, NOT_ATTACHED[answer]])
                continue
            self.toolbox.places = self.toolbox.workspace.places(decision.confine)
            try:
                result = tools.read_now(self.toolbox, tool_input)
            except (tools.ToolError, OSError) as e:
                why = NOT_ATTACHED.get(getattr(e, "meta", {}).get("error"))
                skipped.append([mention, why or getattr(e, "strerror", None) or str(e)])
                continue
            attached.append(f'<attached-file path="{mention}">\n{result.text}\n</attached-file>')
        made = {"attachments": attached, "seen": self.toolbox.seen} if attached else {}
        return {**made, "skipped": skipped} if skipped else made

    def repair(self) -> None:
        """On resume: a tool that was running when khaelor died gets a result, so the history is
        valid; a process the log still calls running is closed, and it and a bash call's command
        are stopped if they still run, since no khaelor manages them now (named by pid and start
        time: after a kill -9 the pid may be another program's). Synced at the turn's first loop
        boundary, or by close."""
        processes = list(self.state.processes.items())
        # still running (a dev server holding its port, a build writing the project): no khaelor
        # would ever stop them
        commands = self.state.commands_running
        left = [(p.get("pid"), p.get("started_ticks")) for _, p in processes]
        left += [commands[t] for t in self.state.started_tools if t in commands]
        stopped = tools.stop_orphans(left)
        for tool_use_id in sorted(self.state.started_tools):
            output = self.toolbox.output_when_lost(tool_use_id)
            reason = "khaelor exited while the tool was running"
            if commands.get(tool_use_id, (None,))[0] in stopped:
                reason += "; its command was stopped on resume"
            self.emit("ToolCancelled", tool_use_id=tool_use_id, reason=reason,
                      **({"output": output} if output else {}))
        for process_id, process in processes:
            started_by = self.state.started_by.get(process_id, "")
            output = self.toolbox.output_when_lost(started_by, process_id)
            cause = "lost: khaelor exited while it ran"
            if process.get("pid") in stopped:
                cause += "; stopped on resume"
            self.emit("ProcessExited", process_id=process_id, exit_code=None, cause=cause,
                      **({"output": output} if output else {}))
        attempt = self.state.attempt
        mid_reply = attempt.blocks or attempt.partial
        if self.state.turn_open and mid_reply:
            # It died mid-reply: the turn ends there; the text saved so far stays, and the line
            # of the thinking it was streaming.
            self.emit("Interrupted",
                      reason="khaelor exited while the reply was streaming",
                      **attempt.cut_thinking())

    def start(self) -> asyncio.Task:
        """The turn as a task (interactive). Busy from this moment, not from the task's first
        step, so a message sent in between is steering, never a second turn."""
        self.busy = True
        turn = asyncio.get_running_loop().create_task(self.run())
        self.newest_turn = turn

        def ended(_) -> None:
            # A task cancelled before its first step never runs run()'s finally. A turn a message
            # began while this one synced its log (after its last step) is its own: busy still.
            if self.newest_turn is turn:
                self.busy = False
        turn.add_done_callback(ended)
        return turn

    async def run(self) -> str:
        """Run until the turn ends; returns the final step ("done", "failed", "max-turns", …).
        The one supervisor of a turn, headless and interactive: an exception other than a cancel
        ends the turn with a durable TaskFailed that names it, and the session stays usable.
        Only a log that cannot be written any more (a full disk) raises past it."""
        self.busy = True
        try:
            return await self.steps()
        except asyncio.CancelledError:
            # Esc or Ctrl-C: every tool_use left open gets a cancelled result, then Interrupted
            self.cancel_pending("interrupted by the user")
            self.emit("Interrupted", **self.cut_thinking)
            self.cut_thinking = {}
            raise
        except Exception as error:
            self.fail(error)
            return "failed"
        finally:
            if self.state.unrecorded:
                # after the last step: what a rewind compares the tree with (still busy: a
                # /rewind waits for it)
                await self.checkpoint("", "after the turn")
            self.busy = False
            await self.bus.store.sync_off_loop()

    async def steps(self) -> str:
        while True:
            step = derive_next(self.state, self.max_turns, self.budget())
            if step == "call-model":
                await self.call_model()
            elif step == "execute-tools":
                await self.execute_tools()
            elif step == "inject-steering":
                for text in self.state.steering_now:
                    self.emit("SteeringInjected", text=text)
            elif step == "ask-user":
                await self.ask_to_continue()
            elif step == "verify":
                await self.request_verification()
            elif step in ("prune", "compact"):
                await self.keep_in_budget(step)
            else:
                return self.finish(step)

    def budget(self) -> str | None:
        """The context engine's plan for the next request, asked once per grown log: a prune or
        compaction that freed nothing is not tried again until the conversation moves on."""
        state = self.state
        if not state.needs_model:
            return None
        if state.last_seq == self.planned_seq:
            return None
        self.planned_seq = state.last_seq
        return self.ctx.plan(state)

    def fail(self, error: Exception) -> None:
        """A bug, or a world that broke under us: every open call gets a result, then TaskFailed."""
        what = str(error)
        if not isinstance(error, events.KhaelorError):
            what = f"internal error: {type(error).__name__}: {error}"
        self.cancel_pending(f"not run: {what}")
        trace = "".join(traceback.format_exception(error))
        self.emit("TaskFailed", reason=what, traceback=trace[-8_000:])

    def finish(self, step: str) -> str:
        state = self.state
        if step == "done":
            self.emit("TaskCompleted", **completion(state))
        elif step == "failed":
            self.emit("TaskFailed", reason=state.last_failure["message"])
        elif step == "max-turns":
            reason = (f"stopped after --max-turns {self.max_turns}"
                      " model responses")
            self.emit("TaskFailed", reason=reason)
        return step

    async def ask_to_continue(self) -> None:
        """Doom loop: the same call three times in a row. The user decides through the permission
        panel; "continue" lets it run, a denial with a message goes to the model as the call's
        result, a bare denial (or nobody to ask, headless) ends the turn."""
        call = self.state.pending_tools[-1]
        call_id = call["tool_use_id"]
        what = f"{call['name']} call"
        repeats = f"{DOOM_LOOP_REPEATS} identical {what}s in a row"
        choice, feedback = await self.ask_user(call, events.LOOP_CAPABILITY,
                                               f"continue after {repeats}", None)
        if choice in ("once", "always"):
            self.emit("PermissionGranted", tool_use_id=call_id, scope="once")
            return
        reason = (f"stopped: the model repeated the same {what}"
                  f" {DOOM_LOOP_REPEATS} times in a row")
        by = "user" if choice == "deny" else "nobody"
        self.emit("PermissionDenied", tool_use_id=call_id,
                  reason=reason, feedback=feedback, by=by)
        # the calls before it in the response (the denial answered it)
        self.cancel_pending("not run: " + reason)
        if not feedback:
            self.emit("TaskFailed", reason=f"{reason}; say how to continue")

    async def request_verification(self) -> None:
        """The gate: hold the answer back and remind the model, as user-side text, to run checks."""
        state = self.state
        changed = unverified_changes(state)
        # Off the loop: detection reads the project's files (pyproject, package.json, tests/).
        commands = await asyncio.to_thread(context.detect_checks,
                                           self.project_root, changed)
        attempt = state.nudges + 1
        self.emit("VerificationRequested", attempt=attempt,
                  changed_files=changed, commands=commands,
                  withheld=state.last_text,
                  text=verification_nudge(changed, commands, attempt))

    async def record_baseline(self, reason: str) -> None:
        """BaselineRecorded (ADR-15): git state, read-only, off the event loop."""
        payload = await asyncio.to_thread(context.git_baseline, self.toolbox.workspace)
        self.emit("BaselineRecorded", reason=reason, **payload)

    async def call_model(self) -> None:
        """One response. A context overflow is answered by pruning or compacting, then one retry;
        a 400 that refuses the thinking setting, by one retry without it (and never sending it to
        that model again this session)."""
        for attempt in (1, 2):
            try:
                await self.stream_response()
                break
            except ModelError as e:
                overflow = e.kind == "context_overflow"
                refused = None
                if e.status == 400:
                    refused = refused_field(str(e), self.request)
                retrying = bool(overflow or refused) and attempt == 1
                message = str(e)
                if refused:
                    setting = REFUSED_SETTINGS[refused]
                    message = f"the API refused the {setting} ({e})"
                    if retrying:
                        message += "; sent again without it"
                    self.ctx.refused.add((self.request["model"], refused))
                # a retry starts the reply again: the screen drops the thinking cut off
                cut, self.cut_thinking = self.cut_thinking, {}
                self.emit("ModelRequestFailed", kind=e.kind, status=e.status,
                          message=message, retrying=retrying, **({} if retrying else cut))
                if not retrying:
                    break
                if refused:
                    continue
                try:
                    plan = self.ctx.overflow_plan(self.state, str(e))
                    await self.keep_in_budget(plan)
                except ModelError as aux_error:
                    self.emit("ModelRequestFailed", kind=aux_error.kind,
                              status=aux_error.status,
                              message=f"compaction failed: {aux_error}",
                              retrying=False)
                    break
        await self.bus.store.sync_off_loop()

    def turn_needs_facts(self) -> bool:
        """Whether the turn's first request is next and its facts are not yet in the history
        (a retried first request sends the ones recorded)."""
        messages = self.state.messages
        if self.state.responses_in_turn or not messages or messages[-1]["role"] != "user":
            return False
        last = messages[-1]["content"][-1]
        return not str(last.get("text", "")).startswith(context.ENVIRONMENT_OPEN)

    async def stream_response(self) -> None:
        if self.turn_needs_facts():
            # Off the loop: the facts include `git status`, which takes a while in a big repository.
            processes = self.toolbox.running_processes()
            world_seq = self.state.world_seq
            facts = await asyncio.to_thread(self.ctx.volatile_facts,
                                            processes, world_seq, self.state.ended)
            if self.turn_mode() == "plan":
                # after the user's message: leaving plan mode keeps the cached system prompt valid
                facts += "\n" + context.PLAN_MODE
            self.emit("EnvironmentNoted", text=facts)
        request = self.ctx.build_request(self.state)
        self.request = request
        # what the thinking setting could not have as asked, told once
        while self.ctx.notes:
            self.emit("Status", text=self.ctx.notes.pop(0))
        self.emit("ModelStarted", model=request["model"])
        reducer = StreamReducer()
        # (a lambda: a retry replaces the reducer, and the saver must see the new one)
        saver = asyncio.create_task(self.save_while_streaming(lambda: reducer))
        self.bus.before_durable = lambda kind: self.save_text_before(reducer, kind)
        try:
            async for raw in self.model.stream(request):
                if raw["type"] == "restart":
                    self.emit("ModelRequestFailed", kind="retryable",
                              status=raw.get("status"),
                              message=raw["error"], retrying=True)
                    reducer = StreamReducer()
                    continue
                now = time.monotonic()
                for kind, payload in reducer.feed(raw, now):
                    if kind == "ToolRequested":
                        payload["card"] = tools.card_of(
                            payload["name"], payload["input"])
                    self.emit(kind, **payload)
                self.save_checkpoint(reducer, now)
        except (asyncio.CancelledError, ModelError):
            # Esc, or an error no retry follows: the text streamed so far is kept (run() syncs it
            # as the turn ends), and the thinking cut off goes in the event that ends the reply
            # (Interrupted, ModelRequestFailed), as the screen keeps its line.
            self.save_checkpoint(reducer, None)
            self.cut_thinking = reducer.cut_thinking(time.monotonic())
            raise
        finally:
            self.bus.before_durable = None
            saver.cancel()
            if saver.done() and not saver.cancelled() and saver.exception():
                raise saver.exception()     # the log could not be written

    async def save_while_streaming(self, current_reducer) -> None:
        """Saves the streaming text on a clock, not only when a delta arrives: a reply that pauses
        mid-sentence would otherwise keep the words on screen out of the log for the whole pause."""
        synced_at = time.monotonic()
        while True:
            await asyncio.sleep(CHECKPOINT_INTERVAL_S)
            now = time.monotonic()
            self.save_checkpoint(current_reducer(), now)
            if now - synced_at >= CHECKPOINT_SYNC_S:
                synced_at = now
                await self.bus.store.sync_off_loop()

    def save_text_before(self, reducer: StreamReducer, kind: str) -> None:
        """A command's answer, a model chosen, steering… logged while a text block streams: the
        text the screen shows above it is saved first (the UI shows such a line after the block)."""
        if kind != "TextCheckpoint":
            self.save_checkpoint(reducer, time.monotonic(), force=True)

    def save_checkpoint(self, reducer: StreamReducer,
                        now: float | None, force: bool = False) -> None:
        """The streaming text block, durably and at a low rate, so a crash or an Esc keeps it."""
        payload = reducer.checkpoint(now, force)
        if payload is not None:
            self.emit("TextCheckpoint", **payload)

    async def keep_in_budget(self, plan: str | None, focus: str = "", **typed) -> None:
        """Prune old tool results, or compact through the auxiliary model (both recorded; `typed`:
        /compact's line, on its ContextCompacted)."""
        if plan == "prune":
            self.emit("ContextPruned", **self.ctx.prune(self.state))
        elif plan == "compact":
            self.emit("Status", text="compacting the conversation…")
            payload = await context.compact(self.state, self.model.complete,
                                            focus=focus,
                                            aux_model=self.ctx.aux_model)
            if payload is not None:
                self.emit("ContextCompacted", **payload, **typed)

    async def execute_tools(self) -> None:
        for call in list(self.state.pending_tools):
            await self.run_tool(call)
        await self.bus.store.sync_off_loop()

    async def run_tool(self, call: dict) -> None:
        tool_use_id = call["tool_use_id"]
        name = call["name"]
        if call.get("input_error"):
            output = (f"Your {name} call could not be run:"
                      f" {call['input_error']}. Send the call again"
                      " with a complete JSON object as input.")
            doomed = tools.ToolResult(output, is_error=True)
        else:
            # off the loop: an edit's fuzzy matching in a big file takes up to 100 ms
            doomed = await asyncio.to_thread(self.toolbox.problem, name, call["input"])
        # no question for a call that cannot succeed (issue 14 item 6)
        if doomed is not None:
            self.emit("ToolFailed", tool_use_id=tool_use_id, name=name,
                      output=doomed.text, meta=doomed.meta)
            return
        kind, fields = tools.permission_subject(name, call["input"])
        decision = await self.permitted(call, kind, fields)
        if decision is None:
            return
        if kind == "write" and not self.state.edit_baseline:
            # what was already dirty is not ours
            await self.record_baseline("before first edit")
        if self.needs_checkpoint(call, kind, decision):
            await self.checkpoint(tool_use_id, f"before {name}")
        self.emit("ToolStarted", tool_use_id=tool_use_id, name=name)
        try:
            result = await self.toolbox.run(name, call["input"], tool_use_id,
                                            confine=decision.confine)
        except asyncio.CancelledError:
            output = self.toolbox.output_when_stopped(tool_use_id)
            self.emit("ToolCancelled", tool_use_id=tool_use_id,
                      reason="interrupted by the user", **({"output": output} if output else {}))
            raise
        kind = "ToolFailed" if result.is_error else "ToolCompleted"
        self.emit(kind, tool_use_id=tool_use_id, name=name,
                  output=result.text, meta=result.meta)

    async def permitted(self, call: dict, kind: str, fields: dict) -> permissions.Decision | None:
        """The gate: the hardline floor always refuses; an ask goes to the user (or --yes, except
        for what destroys work in the repository). Returns the decision the call runs under (its
        sandbox), or None when it must not run."""
        tool_use_id = call["tool_use_id"]
        # off the loop: a pathological command may take decide() its whole 50 ms budget
        decision = await asyncio.to_thread(self.decide, kind, fields)
        if decision.action == "allow" and not decision.floor:
            if self.yes and decision.confine and not decision.confine.write:
                # --yes's too: it reads .git/config without CI's token (tools.prepare)
                return replace(decision, confine=replace(decision.confine, unattended=True))
            return decision
        if decision.floor or decision.action == "deny":
            if decision.floor:
                why = f"refused by the {decision.reason}"
            else:
                why = decision.reason or "denied by a rule"
            self.emit("PermissionDenied", tool_use_id=tool_use_id,
                      reason=f"{decision.descriptor}: {why}", feedback="", by="policy")
            return None
        undoable = permissions.checkpoint_undoes(decision.destructive)
        if self.yes and decision.destructive and undoable:
            # what a rewind brings back: run once it can (no file left out)
            taken = await self.checkpoint(tool_use_id, "before a destructive step")
            undoable = taken and not self.state.checkpoints[-1]["skipped"]
        # a secret is a person's to open: read, its value could leave encoded past the masking
        confine = decision.confine
        secret = bool(confine and (confine.secrets or confine.rule_asked))
        # and so is a file git or the editor runs later, outside the sandbox (the bash guard puts
        # back what a command writes there; the write tool's is approved here or never)
        runs_later = kind == "write" and permissions.runs_later(
            decision.descriptor, tools.hooks_folder_now(self.project_root))
        if self.yes and (not decision.destructive or undoable) and not (secret or runs_later):
            self.emit("PermissionGranted", tool_use_id=tool_use_id,
                      scope="yes")
            return _unattended(decision)
        # (under --yes only what --yes does not approve is asked: say why)
        why = decision.reason if self.yes else ""
        if self.yes and secret and not decision.destructive:
            why = "it reads the project's secret files: asks every time, --yes never opens them"
        if self.yes and runs_later:
            why = "git or your editor runs what it writes later, unconfined: --yes never writes it"
        # (and no "always" for it: a saved grant would let later writes there go unasked)
        suggestion = None if runs_later else decision.suggestion
        choice, feedback = await self.ask_user(call, decision.capability,
                                               decision.descriptor, suggestion, why=why)
        if choice not in ("once", "always"):
            # "deny": a person said no; "nobody": there was no one to ask
            by = "user" if choice == "deny" else "nobody"
            reason = events.USER_DECLINED if choice == "deny" else events.NOT_ASKED
            if decision.destructive:
                reason += f" ({decision.reason})"
            self.emit("PermissionDenied", tool_use_id=tool_use_id,
                      reason=reason, feedback=feedback, by=by)
            return None
        if choice == "always" and decision.suggestion and self.grant:
            self.grant(decision.suggestion)
        self.emit("PermissionGranted", tool_use_id=tool_use_id, scope=choice)
        if decision.confine:
            # the user saw this very call: what it names, it may change (tools.guard_check)
            return replace(decision, confine=replace(decision.confine, attended=True))
        return decision

    async def ask_user(self, call: dict, capability: str, descriptor: str,
                       suggestion: dict | None, why: str = "") -> tuple[str, str]:
        """PermissionRequested for the call, then the user's (choice, feedback)."""
        # off the loop: an edit's diff is planned on the file (a fuzzy match may take 100 ms)
        preview = await asyncio.to_thread(self.toolbox.preview, call["name"], call["input"])
        request = self.emit("PermissionRequested", tool_use_id=call["tool_use_id"],
                            capability=capability, descriptor=descriptor,
                            suggestion=suggestion, preview=preview, **({"why": why} if why else {}))
        return await self.ask(request)

    def needs_checkpoint(self, call: dict, kind: str,
                         decision: permissions.Decision) -> bool:
        """Before a step that may change the work tree: a command run or text fed to a process,
        not proven read-only; a file write when this turn has none yet, or a command ran since
        the newest (its own file's versions are kept, but a rewind to before it needs the tree it
        started from, with what the command did)."""
        state = self.state
        newest = state.checkpoints[-1] if state.checkpoints else {}
        if newest.get("step") == call["tool_use_id"]:
            return False
        if kind == "write":
            turn_seq = state.user_texts[-1][0] if state.user_texts else 0
            command_unrecorded = any(step["changed"] is None for step in state.steps)
            return newest.get("seq", 0) < turn_seq or command_unrecorded
        return kind in ("bash", "feed") and not decision.read_only

    async def checkpoint(self, step: str, reason: str) -> bool:
        """CheckpointRecorded: the work tree in the shadow repository, off the event loop. A
        failure is said (Status) and the step goes on: --yes then runs nothing destructive."""
        previous = ""
        if self.state.checkpoints:
            previous = self.state.checkpoints[-1]["tree"]
        taking = asyncio.ensure_future(asyncio.to_thread(self.toolbox.checkpoints.take, previous))
        try:
            payload = await asyncio.shield(taking)
        except asyncio.CancelledError:
            # Esc while git runs: its thread cannot be stopped, and the turn's last checkpoint
            # (run's finally) must not race it in the shadow repository
            await asyncio.gather(taking, return_exceptions=True)
            raise
        except (tools.CheckpointError, OSError) as error:
            self.emit("Status", text=f"no checkpoint: {error}")
            return False
        self.emit("CheckpointRecorded", step=step, reason=reason,
                  **payload)
        return True

    def decide(self, kind: str, fields: dict) -> permissions.Decision:
        """permissions.decide on a call's subject (tools.permission_subject), with what only the
        session knows: whether commands are sandboxed, and for text fed to a process the command
        the process runs."""
        process_command = None
        if kind == "feed":
            # the command ProcessStarted recorded in the log
            running = self.state.processes.get(str(fields.get("id")))
            process_command = running and running["command"]
        return permissions.decide(kind, fields, self.project_root, self.rules,
                                  sandboxed=self.toolbox.sandboxed,
                                  process_command=process_command,
                                  mode=self.turn_mode())

    def turn_mode(self) -> str:
        """The permission mode as this turn began (a change waits for the next user message)."""
        return self.state.turn_mode or self.permission_mode
