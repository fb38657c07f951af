"""The kernel's pure parts: derive_next over real logs, and the stream reducer over wire events."""
import contextlib
import json
import os
import signal

import pytest

import events
import sandbox
import tools
from kernel import StreamReducer, derive_next

USAGE = {"input_tokens": 1, "output_tokens": 1, "cache_read_tokens": 0, "cache_write_tokens": 0}


def log_of(*items):
    return [{"v": 1, "seq": seq, "id": str(seq), "ts": 0, "session": "s", "type": kind, **payload}
            for seq, (kind, payload) in enumerate(items, 1)]


def call(tid, name="bash", **tool_input):
    return ("ToolRequested", {"tool_use_id": tid, "name": name, "input": tool_input or {"command": "ls"}})


def completed(stop="tool_use"):
    return ("ModelResponseCompleted", {"message_id": "m", "model": "x", "stop_reason": stop, "usage": USAGE})


def step(*items, max_turns=None):
    return derive_next(events.replay(log_of(*items)), max_turns)


def test_derive_next_follows_the_conversation():
    user = ("UserMessageCreated", {"text": "go"})
    assert step() == "idle"
    assert step(user) == "call-model"
    assert step(user, call("t1")) == "call-model"             # response not complete: ask again
    assert step(user, call("t1"), completed()) == "execute-tools"
    done_tool = ("ToolCompleted", {"tool_use_id": "t1", "name": "bash", "output": "x", "meta": {}})
    assert step(user, call("t1"), completed(), done_tool) == "call-model"
    assert step(user, call("t1"), completed(), done_tool, completed("end_turn")) == "done"
    assert step(user, completed("end_turn"), ("TaskCompleted", {"evidence": {}})) == "idle"


def test_steering_is_injected_after_tool_results_and_before_the_next_call():
    items = [("UserMessageCreated", {"text": "go"}), call("t1"), completed(), ("SteeringQueued", {"text": "faster"})]
    assert step(*items) == "execute-tools"
    items.append(("ToolCompleted", {"tool_use_id": "t1", "name": "bash", "output": "x", "meta": {}}))
    assert step(*items) == "inject-steering"
    items.append(("SteeringInjected", {"text": "faster"}))
    assert step(*items) == "call-model"


def test_max_turns_and_failures_end_the_turn():
    user = ("UserMessageCreated", {"text": "go"})
    done_tool = ("ToolCompleted", {"tool_use_id": "t1", "name": "bash", "output": "x", "meta": {}})
    assert step(user, call("t1"), completed(), done_tool, max_turns=1) == "max-turns"
    failed = ("ModelRequestFailed", {"kind": "auth", "status": 401, "message": "no", "retrying": False})
    assert step(user, failed) == "failed"
    retrying = ("ModelRequestFailed", {"kind": "retryable", "status": 529, "message": "x", "retrying": True})
    assert step(user, retrying) == "call-model"


def test_three_identical_calls_in_a_row_pause_the_run():
    items = [("UserMessageCreated", {"text": "go"})]
    for i in range(3):
        items += [call(f"t{i}"), completed()]
        if i < 2:
            items.append(("ToolCompleted", {"tool_use_id": f"t{i}", "name": "bash", "output": "x", "meta": {}}))
    assert step(*items) == "ask-user"
    items[-2] = call("t2", command="ls -la")
    assert step(*items) == "execute-tools"


def wire(*events_):
    reducer, out = StreamReducer(), []
    for event in events_:
        out += reducer.feed(event)
    return out


def test_the_reducer_turns_wire_events_into_deltas_and_completed_blocks():
    out = wire(
        {"type": "message_start", "message": {"id": "msg_1", "model": "m", "usage": {
            "input_tokens": 10, "cache_read_input_tokens": 7, "cache_creation_input_tokens": 3, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s1"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hel"}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "lo"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "tu", "name": "read", "input": {}}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"file_path": "a'}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '.py"}'}},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 20}},
        {"type": "message_stop"},
    )
    durable = [(k, p) for k, p in out if k in events.DURABLE]
    assert durable == [
        # what the request cost so far, before any block: a kill -9 keeps it (counted once)
        ("TextCheckpoint", {"index": -1, "text": "", "model": "m", "message_id": "msg_1", "usage": {
            "input_tokens": 10, "output_tokens": 1, "cache_read_tokens": 7, "cache_write_tokens": 3}}),
        ("ModelThinkingBlockCompleted", {"thinking": "hm", "signature": "s1"}),
        ("ModelTextBlockCompleted", {"text": "Hello"}),
        ("ToolRequested", {"tool_use_id": "tu", "name": "read", "input": {"file_path": "a.py"}}),
        ("ModelResponseCompleted", {"message_id": "msg_1", "model": "m", "stop_reason": "tool_use", "usage": {
            "input_tokens": 10, "output_tokens": 20, "cache_read_tokens": 7, "cache_write_tokens": 3}}),
    ]
    assert [p["text"] for k, p in out if k == "TextDelta"] == ["Hel", "lo"]


def test_a_thinking_block_says_how_long_the_model_thought():
    reducer = StreamReducer()
    start = {"type": "content_block_start", "index": 0,
             "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
    assert reducer.feed(start, 10.0) == [("ThinkingDelta", {"text": ""})]
    closed = reducer.feed({"type": "content_block_stop", "index": 0}, 14.2)
    assert closed == [("ModelThinkingBlockCompleted", {"thinking": "", "signature": "", "duration_ms": 4200})]


def test_a_tool_input_cut_off_by_max_tokens_is_recorded_with_an_input_error():
    out = wire(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "tu", "name": "write", "input": {}}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"file_path": "a.py", "cont'}},
        {"type": "content_block_stop", "index": 0},
    )
    kind, payload = out[-1]
    assert kind == "ToolRequested" and payload["input"] == {} and "not valid JSON" in payload["input_error"]


def test_a_tool_input_with_nan_or_infinity_is_an_input_error_not_a_session_that_cannot_send():
    """Python reads NaN and Infinity, which are not JSON, and 1e999 as infinity: kept in the
    tool_use, every later request of the session failed to serialize ("Out of range float values
    are not JSON compliant")."""
    for literal in ("NaN", "Infinity", "-Infinity", "1e999"):
        out = wire(
            {"type": "content_block_start", "index": 0,
             "content_block": {"type": "tool_use", "id": "tu", "name": "read", "input": {}}},
            {"type": "content_block_delta", "index": 0,
             "delta": {"type": "input_json_delta", "partial_json": '{"file_path": "a.py", "limit": ' + literal + "}"}},
            {"type": "content_block_stop", "index": 0},
        )
        kind, payload = out[-1]
        assert kind == "ToolRequested" and payload["input"] == {} and "not valid JSON" in payload["input_error"]


# ---------------------------------------------------------------- the supervised turn (real wiring, fake API)

def test_a_turn_that_raises_ends_in_task_failed_and_the_session_goes_on(project, env, fake, monkeypatch):
    import asyncio
    from pathlib import Path

    import khaelor as cli
    from fake_api import reply, text, tool_use
    for key in ("KHAELOR_HOME", "ANTHROPIC_API_KEY", "ANTHROPIC_CONFIG_DIR"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    monkeypatch.chdir(project)
    fake.enqueue(reply(tool_use("bash", {"command": "touch made.txt"})), reply(text("second answer")))

    async def ask(request):
        raise RuntimeError("the permission panel broke")

    async def two_turns():
        home = Path(env["KHAELOR_HOME"])
        args = cli.parse_args(["-p", "x"])
        store = events.SessionStore.create(events.sessions_dir(home, project))
        agent = cli.build_kernel(args, cli.load_settings(args, home, project), store, events.Bus(store),
                                 home, project, ask)
        try:
            agent.submit("make a file")
            first = await agent.run()
            agent.submit("then just answer")
            return first, await agent.run(), store
        finally:
            await agent.toolbox.close()
            await agent.model.close()

    first, second, store = asyncio.run(two_turns())
    assert first == "failed" and second == "done"
    failed = [e for e in store.events if e["type"] == "TaskFailed"]
    assert len(failed) == 1 and failed[0]["reason"] == "internal error: RuntimeError: the permission panel broke"
    assert "Traceback" in failed[0]["traceback"]
    cancelled = [e for e in store.events if e["type"] == "ToolCancelled"]
    assert len(cancelled) == 1 and cancelled[0]["reason"].startswith("not run: internal error")
    assert not (project / "made.txt").exists()
    assert store.state.answer == "second answer" and not store.state.turn_open
    # The second request carried the first turn's call with its result: the history stayed valid.
    assert fake.rejections == []
    assert fake.requests[-1]["body"]["messages"][2]["content"][0]["tool_use_id"] == cancelled[0]["tool_use_id"]


def test_derive_next_decides_pruning_and_compaction_before_a_call():
    user = ("UserMessageCreated", {"text": "go"})
    state = events.replay(log_of(user))
    assert derive_next(state, budget="compact") == "compact"
    assert derive_next(state, budget="prune") == "prune"
    assert derive_next(state, max_turns=0, budget="compact") == "max-turns"
    with_calls = events.replay(log_of(user, call("t1"), completed()))
    assert derive_next(with_calls, budget="compact") == "execute-tools"    # results first


def test_a_streaming_text_block_is_checkpointed_about_four_times_a_second():
    from kernel import StreamReducer
    reducer = StreamReducer()
    reducer.feed({"type": "message_start", "message": {"id": "m1", "model": "m", "usage": {"input_tokens": 7}}})
    reducer.feed({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    saved, clock = [], 100.0
    for k in range(300):                       # 3 s of deltas, one every 10 ms
        reducer.feed({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f"w{k} "}})
        clock += 0.01
        if (payload := reducer.checkpoint(clock)) is not None:
            saved.append(payload["text"])
    assert 11 <= len(saved) <= 12
    final = reducer.checkpoint(None)           # cut off: the rest, and the usage reported so far
    assert "".join(saved) + final["text"] == "".join(f"w{k} " for k in range(300))
    assert final["usage"]["input_tokens"] == 7 and final["model"] == "m"


def test_the_log_is_fsynced_off_the_event_loop(kernel_turn, fake, project, monkeypatch):
    """fsync can take longer than a frame on a slow disk: the kernel's syncs run in a thread."""
    import os
    import threading

    from fake_api import reply, text, tool_use
    (project / "a.txt").write_text("a\n")
    fake.enqueue(reply(tool_use("read", {"file_path": "a.txt"})), reply(text("read it")))
    loop_thread = threading.get_ident()     # asyncio.run runs the loop in this thread
    threads = []
    real_fsync = os.fsync

    def fsync(fd):
        threads.append(threading.get_ident())
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    step, log = kernel_turn("read a.txt", ask=None)
    assert step == "done" and log[-1]["type"] == "TaskCompleted"
    assert len(threads) >= 3            # after the tool batch, after each response, at the end
    assert loop_thread not in threads


# ---------------------------------------------------------------- one truth: the log and memory agree

def test_a_message_of_only_whitespace_opens_no_turn(tmp_path):
    """A paste of blank lines sent as a message: nothing to ask, and a request would be refused."""
    import context
    import kernel
    store = events.SessionStore.create(tmp_path / "sessions")
    ctx = context.Context(project_root=tmp_path, cwd=tmp_path, home=tmp_path / "home",
                          model="claude-sonnet-5-5", tool_schemas=[])
    agent = kernel.Kernel(bus=events.Bus(store), model=None, toolbox=None, ctx=ctx, rules=[],
                          project_root=tmp_path, ask=None)
    agent.submit(" \n\n\t\n")
    assert store.events == [] and not store.state.turn_open


def test_a_command_files_model_holds_for_its_turn_and_a_model_chosen_meanwhile_is_kept(tmp_path):
    """The model of a request is recorded with its turn's message: a `/model` given while a command
    file's turn runs is not reverted in memory when the turn ends (the log keeps it too)."""
    import context
    import kernel
    store = events.SessionStore.create(tmp_path / "sessions")
    bus = events.Bus(store)
    ctx = context.Context(project_root=tmp_path, cwd=tmp_path, home=tmp_path / "home",
                          model="claude-sonnet-5-5", tool_schemas=[])
    agent = kernel.Kernel(bus=bus, model=None, toolbox=None, ctx=ctx, rules=[], project_root=tmp_path,
                          ask=None)
    bus.emit("SessionCreated", cwd="/p", project_root="/p", model="claude-sonnet-5-5",
             aux_model="claude-haiku-5-5", version="0")
    agent.submit("/commit", model="claude-haiku-5-5")
    assert store.events[-1]["model"] == "claude-haiku-5-5"
    assert ctx.build_request(store.state)["model"] == "claude-haiku-5-5"
    ctx.model = "claude-opus-5-5"                 # what /model does mid-turn
    bus.emit("ModelChanged", model="claude-opus-5-5")
    assert ctx.build_request(store.state)["model"] == "claude-haiku-5-5"    # the turn keeps its own
    bus.emit("TaskCompleted", evidence={})
    assert ctx.model_of(store.state) == "claude-opus-5-5"      # what the status line shows, idle
    agent.submit("and now?")
    assert ctx.build_request(store.state)["model"] == "claude-opus-5-5"
    assert "model" not in store.events[-1]
    assert ctx.model == store.state.model == events.replay(store.events).model == "claude-opus-5-5"


def test_repair_stops_a_process_left_running_only_if_it_is_the_very_one_started(tmp_path):
    """A server a killed khaelor left running holds its port with no khaelor to stop it: resume
    stops its group, named by pid and start time; a process that has the pid now but started at
    another time (the number used again), or a log without the start, is never touched."""
    import subprocess

    import kernel
    ours = subprocess.Popen(["sleep", "30"], start_new_session=True)
    also_ours = subprocess.Popen(["sleep", "30"], start_new_session=True)
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        store = events.SessionStore.create(tmp_path / "sessions")
        bus = events.Bus(store)
        bus.emit("ProcessStarted", process_id="p1", pid=ours.pid, command="npm run dev",
                 started_ticks=tools.started_ticks(ours.pid))
        bus.emit("ProcessStarted", process_id="p4", pid=also_ours.pid, command="make watch",
                 started_ticks=tools.started_ticks(also_ours.pid))
        bus.emit("ProcessStarted", process_id="p2", pid=stranger.pid, command="make watch",
                 started_ticks=tools.started_ticks(stranger.pid) - 1)
        bus.emit("ProcessStarted", process_id="p3", pid=stranger.pid, command="old log")
        toolbox = tools.Toolbox(tools.Workspace(tmp_path), tmp_path / "home", None, None)
        agent = kernel.Kernel(bus=bus, model=None, toolbox=toolbox, ctx=None, rules=[],
                              project_root=tmp_path, ask=None)
        agent.repair()
        assert ours.wait(timeout=5) == -15 and also_ours.wait(timeout=5) == -15
        assert stranger.poll() is None
        causes = {e["process_id"]: e["cause"] for e in store.events if e["type"] == "ProcessExited"}
        assert causes == {"p1": "lost: khaelor exited while it ran; stopped on resume",
                          "p4": "lost: khaelor exited while it ran; stopped on resume",
                          "p2": "lost: khaelor exited while it ran",
                          "p3": "lost: khaelor exited while it ran"}
    finally:
        for process in (ours, also_ours, stranger):
            process.kill()
            process.wait()


def test_repair_stops_the_children_a_shell_left_running_in_its_group(tmp_path):
    """`server &` in a background command: the shell that led the group exits, its children keep
    the group and the port. Resume stops them (started after the recorded leader); a leaderless
    group whose members are older than the recorded start is another's, never touched."""
    import subprocess

    import kernel

    def leaderless_group():
        shell = subprocess.Popen(["bash", "-c", "sleep 30 & echo $!; read"], start_new_session=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        child = int(shell.stdout.readline())
        ticks = tools.started_ticks(shell.pid)
        shell.stdin.close()
        shell.wait()
        return shell.pid, ticks, child
    ours, ours_ticks, ours_child = leaderless_group()
    other, other_ticks, other_child = leaderless_group()
    try:
        store = events.SessionStore.create(tmp_path / "sessions")
        bus = events.Bus(store)
        bus.emit("ProcessStarted", process_id="p1", pid=ours, command="server &",
                 started_ticks=ours_ticks)
        bus.emit("ProcessStarted", process_id="p2", pid=other, command="server &",
                 started_ticks=other_ticks + 10**6)
        toolbox = tools.Toolbox(tools.Workspace(tmp_path), tmp_path / "home", None, None)
        agent = kernel.Kernel(bus=bus, model=None, toolbox=toolbox, ctx=None, rules=[],
                              project_root=tmp_path, ask=None)
        agent.repair()
        assert not sandbox.pids_in_groups({ours})
        assert sandbox.pids_in_groups({other}) == [other_child]
        causes = {e["process_id"]: e["cause"] for e in store.events if e["type"] == "ProcessExited"}
        assert causes == {"p1": "lost: khaelor exited while it ran; stopped on resume",
                          "p2": "lost: khaelor exited while it ran"}
    finally:
        for child in (ours_child, other_child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def test_repair_stops_the_command_of_a_bash_call_a_killed_khaelor_left_running(tmp_path):
    """A build a bash call started runs on after a kill -9 of khaelor, writing the project while
    the user resumes: resume stops its group (CommandStarted named it), and says so."""
    import subprocess

    import kernel
    build = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        store = events.SessionStore.create(tmp_path / "sessions")
        bus = events.Bus(store)
        bus.emit("ToolStarted", tool_use_id="toolu_1", name="bash")
        bus.emit("CommandStarted", tool_use_id="toolu_1", pid=build.pid,
                 started_ticks=tools.started_ticks(build.pid))
        toolbox = tools.Toolbox(tools.Workspace(tmp_path), tmp_path / "home", None, None)
        agent = kernel.Kernel(bus=bus, model=None, toolbox=toolbox, ctx=None, rules=[],
                              project_root=tmp_path, ask=None)
        agent.repair()
        assert build.wait(timeout=5) == -15
        cancelled = [e for e in store.events if e["type"] == "ToolCancelled"]
        assert [e["reason"] for e in cancelled] == [
            "khaelor exited while the tool was running; its command was stopped on resume"]
        assert store.state.commands_running == {} and not store.state.started_tools
    finally:
        build.kill()
        build.wait()


def test_repair_closes_the_processes_the_log_still_calls_running(tmp_path):
    """After a kill -9 no khaelor manages the processes the log started: repair records that each
    ended, so the fold no longer lists them as running, now or when the log is read again."""
    import kernel
    store = events.SessionStore.create(tmp_path / "sessions")
    bus = events.Bus(store)
    bus.emit("ProcessStarted", process_id="p1", pid=101, command="npm run dev")
    bus.emit("ProcessStarted", process_id="p2", pid=102, command="make watch")
    bus.emit("ProcessExited", process_id="p2", exit_code=0, cause="exited")
    assert list(store.state.processes) == ["p1"]
    store.close()
    store = events.SessionStore.open(store.path)
    # what the toolbox kept of their output (none here: they were only logged)
    toolbox = tools.Toolbox(tools.Workspace(tmp_path), tmp_path / "home", None, None)
    agent = kernel.Kernel(bus=events.Bus(store), model=None, toolbox=toolbox, ctx=None, rules=[],
                          project_root=tmp_path, ask=None)
    agent.repair()
    exited = [e for e in store.events if e["type"] == "ProcessExited"]
    assert [(e["process_id"], e["exit_code"]) for e in exited] == [("p2", 0), ("p1", None)]
    assert store.state.processes == {}
    agent.repair()                                  # nothing left to close
    assert len(store.events) == 4
    store.close()
    assert events.SessionStore.open(store.path, read_only=True).state.processes == {}


def test_process_write_is_judged_against_the_command_the_log_recorded(kernel_turn, fake):
    """Issue 21 item 6: the command a background process runs comes from the log's fold
    (ProcessStarted), so text written to an interpreter asks, as code no one has read."""
    from fake_api import reply, text, tool_use
    fake.enqueue(reply(tool_use("process", {"action": "start", "command": "python3 -i"})),
                 reply(tool_use("process", {"action": "write", "id": "p1",
                                            "input": "print(6 * 7)\n"})),
                 reply(text("done")))
    asked = []

    async def ask(request):
        asked.append(request["descriptor"])
        return "once", ""

    step, log = kernel_turn("run python", ask)
    assert step == "done"
    assert any(descriptor.startswith("python3 ← print(6 * 7)") for descriptor in asked), asked


def test_a_tool_declared_in_tools_py_alone_is_judged_by_its_declared_subject(kernel_turn, fake,
                                                                              project, monkeypatch):
    """Issue 21 item 5: a tool added to tools.py's tables alone (schema, view, runner) is judged
    through Kernel.decide on the subject it declares, with no change to permissions or kernel."""
    import tools
    from fake_api import reply, text, tool_use
    schema = tools._schema("peek", "Show a file.", ["file_path"], file_path=("string", "File."))

    async def peek(box, args, tool_use_id, confine):
        return tools.ToolResult(f"peeked {args['file_path']}")

    monkeypatch.setitem(tools.SCHEMA_OF, "peek", schema)
    monkeypatch.setitem(tools.TOOLS, "peek", peek)
    monkeypatch.setitem(tools.TOOL_VIEWS, "peek", {
        "card": [("", "file_path")], "output": "head", "preview": None,
        "judged": lambda args: ("read", {"file_path": args.get("file_path")})})
    (project / "notes.txt").write_text("hi\n")
    (project / ".env").write_text("KEY=1\n")
    fake.enqueue(reply(tool_use("peek", {"file_path": "notes.txt"})),
                 reply(tool_use("peek", {"file_path": ".env"})),
                 reply(text("done")))
    asked = []

    async def ask(request):
        asked.append((request["capability"], request["descriptor"]))
        return "deny", ""

    step, log = kernel_turn("peek", ask)
    assert step == "done"
    assert asked == [("file.read", ".env")]         # a secret read asks; a plain one does not
    outputs = [e.get("output") for e in log if e["type"] == "ToolCompleted"]
    assert outputs == ["peeked notes.txt"]


def test_a_call_with_a_wrong_field_name_is_refused_before_any_question(kernel_turn, fake, project):
    """A write with `path` and `text` (not the schema's names) asked the user "Write ." before its
    input was checked: every tool's input is checked first, then judged, then asked about."""
    from fake_api import reply, text, tool_use
    calls = [("write", {"path": "a.txt", "text": "x\n"}), ("edit", {"file": "a.txt"}),
             ("bash", {"cmd": "touch made.txt"}), ("process", {"action": "start", "cmd": "ls"}),
             ("read", {"path": "/etc/hostname"}), ("grep", {"regex": "x", "path": "/"}),
             ("process", {"action": "start"}), ("process", {"action": "write", "input": "x"}),
             ("process", {"action": "write", "id": "p1"}), ("bash", {"command": " "})]
    fake.enqueue(*[reply(tool_use(name, tool_input)) for name, tool_input in calls],
                 reply(text("done")))
    asked = []

    async def ask(request):
        asked.append(request["descriptor"])
        return "once", ""

    step, log = kernel_turn("write a file", ask)
    assert step == "done" and asked == []
    failed = [e["output"] for e in log if e["type"] == "ToolFailed"]
    assert len(failed) == len(calls) and all("Invalid input for" in out for out in failed[:6])
    assert "did you mean 'file_path'" in failed[0] and not (project / "made.txt").exists()


def test_a_command_the_user_stops_keeps_what_it_printed_for_the_model_and_the_screen(
        project, env, fake, monkeypatch):
    """Esc while a long test run prints its failures: the card showed them, and "fix what failed"
    is the natural next message. The cancelled result carried only "interrupted by the user", so
    the model never saw the output, the card's lines vanished, and a resume showed none of it."""
    import asyncio
    from pathlib import Path

    import khaelor as cli
    import ui
    from fake_api import reply, text, tool_use
    for key in ("KHAELOR_HOME", "ANTHROPIC_API_KEY", "ANTHROPIC_CONFIG_DIR"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    monkeypatch.chdir(project)
    (project / ".env").write_text("DEPLOY_TOKEN=zq-unique-value-981\n")
    command = "printf 'test_a passed\\nFAILED test_b: 2 != 3\\n'; echo t=zq-unique-value-$((900 + 81)); sleep 30"
    fake.enqueue(reply(tool_use("bash", {"command": command})), reply(text("b fails: 2 != 3")))
    home = Path(env["KHAELOR_HOME"])

    async def stopped_then_asked():
        args = cli.parse_args(["-p", "x"])
        store = events.SessionStore.create(events.sessions_dir(home, project))
        bus = events.Bus(store)
        printed = []
        bus.subscribe(lambda e: printed.append(e) if e["type"] == "ToolOutput" else None)
        async def allow(request):
            return "once", ""
        kernel = cli.build_kernel(args, cli.load_settings(args, home, project), store, bus,
                                  home, project, allow)
        kernel.submit("run the tests")
        turn = asyncio.ensure_future(kernel.run())
        try:
            while "t=" not in "".join(e["text"] for e in printed):
                assert not turn.done()
                await asyncio.sleep(0.02)
            turn.cancel()                       # Esc
            with pytest.raises(asyncio.CancelledError):
                await turn
            kernel.submit("what failed?")
            assert await kernel.run() == "done"
            return store.events
        finally:
            await kernel.toolbox.close()
            await kernel.model.close()

    log = asyncio.run(stopped_then_asked())
    [cancelled] = [e for e in log if e["type"] == "ToolCancelled"]
    # masked as a finished command's output is
    assert "FAILED test_b: 2 != 3" in cancelled["output"] and "t=[redacted" in cancelled["output"]
    sent = json.dumps(fake.requests[-1]["body"]["messages"])
    assert "Cancelled: interrupted by the user. Its output until then:" in sent
    assert "FAILED test_b: 2 != 3" in sent
    shown = "\n".join(ui.render_transcript(log, 80))
    assert "cancelled (interrupted by the user)" in shown and "FAILED test_b: 2 != 3" in shown
    assert "FAILED test_b: 2 != 3" in cli.transcript_markdown(log)       # and /export
    assert not list(home.glob("spill/*/running-*"))    # kept only while it runs (for a kill -9)
