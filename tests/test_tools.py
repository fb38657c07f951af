"""Tests for tools.py: real files in tmp_path, real subprocesses, no mocks of our own code."""

import asyncio
import base64
import collections
import errno
import json
import os
import re
import socket
import subprocess
import tempfile
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import events  # noqa: E402
import sandbox  # noqa: E402
import tools  # noqa: E402


class Box:
    """A Toolbox on a temp project, with its events recorded and a synchronous `call`."""

    def __init__(self, root: Path, home: Path):
        self.root, self.events = root, []
        self.loop = asyncio.new_event_loop()
        # what the kernel's log would fold from these calls: the read stamps, the process numbers
        self.state = events.State()
        self.toolbox = tools.Toolbox(tools.Workspace(root), home, self.record, lambda: self.state)

    def record(self, type_, **payload):
        event = {"type": type_, **payload}
        self.events.append(event)
        if type_ == "ProcessStarted":
            events.note_process(self.state, payload["process_id"])
        return event

    def call(self, name, confine=None, **tool_input) -> tools.ToolResult:
        result = self.loop.run_until_complete(self.toolbox.run(name, tool_input,
                                                               f"tu{len(self.events)}", confine))
        events.note_seen(self.state, result.meta)
        return result

    def of_type(self, type_):
        return [e for e in self.events if e["type"] == type_]

    def close(self):
        self.loop.run_until_complete(self.toolbox.close())
        self.loop.close()


@pytest.fixture
def box(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    made = Box(root, tmp_path / "home")
    yield made
    made.close()


def pid_alive(pid: int) -> bool:
    """True if the pid exists and is not a zombie (a non-reaping init may keep zombies around)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


def wait_gone(pid: int, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.02)
    return False


# ---------------------------------------------------------------- contract


def test_schemas_are_the_seven_tools_in_order_with_exact_parameters():
    box = tools.Toolbox(tools.Workspace(Path(".")), Path("/tmp"), lambda *a, **k: {}, tools.events.State)
    names = [s["name"] for s in box.schemas]
    assert names == ["read", "write", "edit", "grep", "glob", "bash", "process"]
    params = {s["name"]: sorted(s["input_schema"]["properties"]) for s in box.schemas}
    assert params == {
        "read": ["file_path", "limit", "offset"], "write": ["content", "file_path"],
        "edit": ["file_path", "new_string", "old_string", "replace_all"],
        "grep": ["include", "path", "pattern"],
        "glob": ["path", "pattern"], "bash": ["command", "timeout", "workdir"],
        "process": ["action", "command", "id", "input"],
    }
    for schema in box.schemas:
        assert set(schema) == {"name", "description", "input_schema"}
        assert not re.search(r"/tmp|/home|\d{4}-\d\d-\d\d", schema["description"])


def test_unknown_tool_is_an_error_result_naming_the_tools(box):
    result = box.call("delete_everything", path="/")
    assert result.is_error and "read, write, edit, grep, glob, bash, process" in result.text


@pytest.mark.parametrize("name, tool_input, expected", [
    ("read", {}, "missing required parameter 'file_path'"),
    ("read", {"path": "x"}, "did you mean 'file_path'"),
    ("read", {"file_path": "x", "offset": "3"}, "'offset' must be integer, got string"),
    ("read", {"file_path": "x", "limit": True}, "'limit' must be integer, got boolean"),
    ("edit", {"file_path": "x", "old_string": "a"}, "missing required parameter 'new_string'"),
    ("bash", {"command": ["ls"]}, "'command' must be string, got array"),
    ("process", {"action": "restart"}, "must be one of start, list, read, write, stop"),
    # JSON can carry what no path, command or file can: the model hears what, not "a khaelor bug"
    ("write", {"file_path": "a\0b", "content": "x"}, "'file_path' holds a NUL character"),
    ("bash", {"command": "echo a\0b"}, "'command' holds a NUL character"),
    ("grep", {"pattern": "h\0"}, "'pattern' holds a NUL character"),
    ("grep", {"pattern": "h", "include": "\0"}, "'include' holds a NUL character"),
    ("process", {"action": "start", "command": "echo\0"}, "'command' holds a NUL character"),
])
def test_malformed_input_explains_how_to_repair_the_call(box, name, tool_input, expected):
    result = box.call(name, **tool_input)
    assert result.is_error and expected in result.text
    assert f"Call {name} again" in result.text and f"{name}(" in result.text


def test_a_huge_string_a_message_quotes_back_is_cut_short(box):
    # a 100,000-character pattern that matched nothing came back whole: a result spilled to a file
    huge = "q" * 100_000
    calls = [(huge, {}), ("read", {huge: 1}), ("process", {"action": huge}),
             ("process", {"action": "read", "id": huge}), ("grep", {"pattern": huge}),
             ("grep", {"pattern": huge[1:] + "("}), ("glob", {"pattern": huge})]
    for name, tool_input in calls:
        result = box.call(name, **tool_input)
        cut = "qqq'… (100,000 characters)"
        assert len(result.text) < 1000 and cut in result.text, (name, result.text[:300])


def test_non_dict_input_and_null_optionals(box):
    result = box.loop.run_until_complete(box.toolbox.run("read", "a.txt", "tu"))
    assert result.is_error and "JSON object" in result.text
    (box.root / "a.txt").write_text("x\n")
    assert not box.call("read", file_path="a.txt", offset=None, limit=2.0).is_error


# ---------------------------------------------------------------- read


def test_read_numbers_lines_and_pages_with_a_continuation_hint(box):
    (box.root / "f.txt").write_text("".join(f"line {n}\n" for n in range(1, 3001)))
    whole = box.call("read", file_path="f.txt")
    assert whole.text.startswith("     1\tline 1\n")
    assert "Showing lines 1–2000 of 3000. Use offset=2001 to continue." in whole.text
    page = box.call("read", file_path="f.txt", offset=2999, limit=5)
    assert page.text.splitlines()[:2] == ["  2999\tline 2999", "  3000\tline 3000"]
    assert "end of file" in page.text and page.meta["lines"] == 3000


def test_a_missing_file_suggests_the_same_name_in_another_case_or_folder(box):
    """Peers' read tools point at the file meant: "readme.md" for README.md, "app.py" or a typo in
    the folder ("scr/app.py") for src/app.py. Only "use glob" was said for these."""
    (box.root / "README.md").write_text("hi\n")
    (box.root / "src").mkdir()
    (box.root / "src" / "app.py").write_text("x = 1\n")
    for asked, meant in [("readme.md", "README.md"), ("app.py", "src/app.py"),
                         ("scr/app.py", "src/app.py"), ("lib/APP.py", "src/app.py")]:
        missing = box.call("read", file_path=asked)
        assert missing.is_error and f"Did you mean: {meant}?" in missing.text, (asked, missing.text)
    outside = box.call("read", file_path="/no/such/place/app.py").text
    assert "Did you mean" not in outside           # a path outside is not looked for inside
    folder = box.call("glob", pattern="src/").text
    assert "No files match 'src/' under the project." in folder and "'src/**'" in folder


def test_read_failure_modes(box):
    (box.root / "config.yaml").write_text("a: 1\n")
    (box.root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    (box.root / "empty.txt").write_text("")
    assert "Did you mean: config.yaml" in box.call("read", file_path="config.yml").text
    assert "Did you mean: config.yaml" in box.call("read", file_path="/config.yaml").text
    binary = box.call("read", file_path="logo.png")
    assert binary.is_error and "PNG image" in binary.text
    assert "past the end" in box.call("read", file_path="config.yaml", offset=9).text
    assert "empty" in box.call("read", file_path="empty.txt").text
    assert box.call("read", file_path="config.yaml", offset=0).is_error


def test_a_trailing_slash_on_a_file_is_not_a_directory_as_the_os_says(box):
    # open("f.txt/") fails with ENOTDIR; khaelor's path normalising must not drop the "/".
    (box.root / "f.txt").write_text("secret-ish\n")
    for name, tool_input in [("read", {"file_path": "f.txt/"}),
                             ("read", {"file_path": f"{box.root}/f.txt/"}),
                             ("read", {"file_path": "f.txt/."}),
                             ("read", {"file_path": f"{box.root}/f.txt/../f.txt"}),
                             ("edit", {"file_path": "f.txt/.", "old_string": "s", "new_string": "t"}),
                             ("write", {"file_path": "f.txt/", "content": "x\n"}),
                             ("grep", {"pattern": "secret", "path": "f.txt/"})]:
        result = box.call(name, **tool_input)
        assert result.is_error and "not a directory" in result.text, (name, result.text)
        assert "secret-ish" not in result.text
    assert (box.root / "f.txt").read_text() == "secret-ish\n"
    # and grep on a file that lacks the pattern names that file, not its folder
    assert box.call("grep", pattern="absent", path="f.txt").text == "No matches for 'absent' in f.txt."
    assert box.call("write", file_path="new.txt/", content="x\n").is_error
    assert not (box.root / "new.txt").exists()


def test_a_control_character_in_a_file_name_reaches_no_result_raw(box):
    # A name holding ESC or a newline (a hostile repository's, or the model's own) is quoted in
    # every result, as read's errors and listings already quote it: never a raw escape sequence,
    # never a newline that splits "Created a" from "b.txt".
    for name in ["e\x1b[31mred.txt", "a\nb.txt"]:
        (box.root / name).write_text("unread\n")
        results = [box.call("write", file_path=name, content="x\n")]
        (box.root / name).unlink()
        results += [box.call("write", file_path=name, content="a\n"),
                   box.call("read", file_path=name, offset=9),
                   box.call("edit", file_path=name, old_string="a", new_string="b"),
                   box.call("edit", file_path=name, old_string="zzz", new_string="c"),
                   box.call("write", file_path=name, content="d\n")]
        for result in results:
            assert "\x1b" not in result.text and name not in result.text, result.text
            assert repr(name)[1:-1] in result.text.replace("\\u001b", "\\x1b"), result.text
        assert (box.root / name).read_text() == "d\n"


def test_a_space_at_either_end_of_a_name_is_shown_quoted(box):
    # "a.txt  does not exist. Did you mean: a.txt?": the model could not see what was wrong
    (box.root / "a.txt").write_text("x\n")
    (box.root / " lead.txt").write_text("x\n")
    missing = box.call("read", file_path="a.txt ")
    assert missing.is_error
    assert missing.text.startswith('"a.txt " does not exist. Did you mean: a.txt')
    assert '" lead.txt"' in box.call("glob", pattern="*lead*").text


def test_a_file_name_that_is_not_utf8_is_shown_as_a_name_the_tools_take_back(box):
    # b"caf\xe9.txt" was listed with U+FFFD (the log's stand-in for a lone surrogate), a name no
    # file has: read, glob and grep show \xe9, and read, edit, write, grep and glob take it back.
    raw = os.fsdecode(b"caf\xe9.txt")
    (box.root / raw).write_text("hello\n")
    (box.root / os.fsdecode(b"d\xff")).mkdir()
    (box.root / os.fsdecode(b"d\xff/in.txt")).write_text("inner\n")
    listing = box.call("read", file_path=".").text
    assert "caf\\xe9.txt" in listing and "d\\xff/" in listing, listing
    for engine in ENGINES:
        box.toolbox.ripgrep = tools.shutil.which("rg") if engine == "ripgrep" else None
        assert "caf\\xe9.txt" in box.call("glob", pattern="caf*").text
        assert box.call("glob", pattern="caf\\xe9*").text == "caf\\xe9.txt"
        assert box.call("grep", pattern="hello").text == "caf\\xe9.txt:1: hello"
        assert box.call("glob", pattern="*", path="d\\xff").text == "d\\xff/in.txt"
        assert box.call("grep", pattern="inner", path="d\\xff").text == "d\\xff/in.txt:1: inner"
    assert box.call("read", file_path="caf\\xe9.txt").text == "     1\thello"
    edited = box.call("edit", file_path="caf\\xe9.txt", old_string="hello", new_string="bye")
    assert not edited.is_error and "caf\\xe9.txt" in edited.text, edited.text
    assert box.call("write", file_path="caf\\xe9.txt", content="new\n").text.startswith(
        "Wrote caf\\xe9.txt")
    assert (box.root / raw).read_text() == "new\n"
    assert sorted(os.listdir(box.root)) == sorted([raw, os.fsdecode(b"d\xff")])
    assert tools.permission_subject("read", {"file_path": "caf\\xe9.txt"})[1]["file_path"] == raw


def test_count_messages_say_one_in_the_singular(box):
    created = box.call("write", file_path="one.txt", content="a\n")
    assert "Created one.txt (1 line)." in created.text
    assert "Wrote one.txt (1 line;" in box.call("write", file_path="one.txt", content="b\n").text
    assert "which has 1 line." in box.call("read", file_path="one.txt", offset=5).text
    (box.root / "many.txt").write_text("hit\n" * 150)
    assert "lines in 1 file," in box.call("grep", pattern="hit").text


def test_read_cuts_long_lines_and_caps_bytes(box):
    (box.root / "wide.txt").write_text("x" * 5000 + "\nshort\n")
    assert "line cut: 5,000 characters" in box.call("read", file_path="wide.txt").text
    (box.root / "big.txt").write_text(("y" * 1000 + "\n") * 500)
    result = box.call("read", file_path="big.txt")
    assert len(result.text) < tools.READ_BYTE_CAP + 200 and "Use offset=" in result.text


def test_read_directory_lists_entries(box):
    (box.root / "src").mkdir()
    (box.root / "README.md").write_text("hi")
    result = box.call("read", file_path=".")
    assert "src/" in result.text and "README.md" in result.text and not result.is_error


def test_read_pages_a_directory_as_it_pages_a_file(box, monkeypatch):
    # OpenCode's "does not mark final directory page as truncated": offset and limit were ignored,
    # and past its first 500 entries the rest could not be listed by read at all
    monkeypatch.setattr(tools, "READ_LINE_CAP", 6)
    for n in range(10):
        (box.root / "dir" / f"file-{n}.txt").parent.mkdir(exist_ok=True)
        (box.root / "dir" / f"file-{n}.txt").write_text("x")
    pages = {(1, None): "0 1 2 3 4 5", (7, None): "6 7 8 9", (6, 5): "5 6 7 8 9", (2, 2): "1 2"}
    for (offset, limit), numbers in pages.items():
        shown = box.call("read", file_path="dir", offset=offset, limit=limit).text
        assert re.findall(r"file-(\d)", shown) == numbers.split(), (offset, limit, shown)
        last = offset + len(numbers.split()) - 1
        assert (f"Use offset={last + 1} to continue" in shown) == (last < 10), shown
    past = box.call("read", file_path="dir", offset=11)
    assert past.is_error and "offset 11 is past the end of dir/, which has 10 items" in past.text


PEER_CASES = json.loads((Path(__file__).parent / "data" / "peer_tools.json").read_text())["cases"]


@pytest.mark.parametrize("case", PEER_CASES, ids=[case["name"] for case in PEER_CASES])
def test_peer_tool_case(box, case):
    """A case from a peer's tool tests (tests/data/peer_tools.json), called on our toolbox: the
    message and the files after it are what a demanding user expects ("disputed": ours kept)."""
    made = {**case.get("files", {}), **case.get("binary", {})}
    for rel, content in made.items():
        (box.root / rel).parent.mkdir(parents=True, exist_ok=True)
        data = base64.b64decode(content) if rel in case.get("binary", {}) else content.encode()
        (box.root / rel).write_bytes(data)
    for rel in case.get("read_first", []):
        assert not box.call("read", file_path=rel).is_error
    name, tool_input = case["call"]
    tool_input = json.loads(json.dumps(tool_input).replace("{root}", str(box.root)))
    started = time.monotonic()
    result = box.call(name, **tool_input)
    expect = case["expect"]
    assert result.is_error == expect.get("is_error", False), result.text
    for part in expect.get("contains", []):
        assert part in result.text, (part, result.text[:2000])
    for part in expect.get("absent", []):
        assert part not in result.text, (part, result.text[:2000])
    assert len(result.text) <= expect.get("max_chars", len(result.text))
    assert time.monotonic() - started < expect.get("seconds", 60)
    for rel, content in expect.get("files", {}).items():
        assert (box.root / rel).read_bytes() == content.encode(), rel


# ---------------------------------------------------------------- bash


def test_bash_reports_output_and_exit_code_and_streams_tool_output(box):
    result = box.call("bash", command="echo out; echo err >&2; exit 3")
    assert "out\nerr" in result.text and "Exit code: 3" in result.text
    assert result.meta["exit_code"] == 3 and not result.is_error
    assert "".join(e["text"] for e in box.of_type("ToolOutput")) == "out\nerr\n"


def test_bash_workdir_and_closed_stdin(box):
    (box.root / "sub").mkdir()
    assert "/sub" in box.call("bash", command="pwd", workdir="sub").text
    assert "got: []" in box.call("bash", command="read -r line; echo \"got: [$line]\"").text
    missing = box.call("bash", command="pwd", workdir="nope")
    assert missing.is_error and "does not exist" in missing.text


def test_bash_timeout_kills_the_whole_group_including_grandchildren(box):
    result = box.call("bash", command="(sleep 30 & echo child $!; wait) & wait", timeout=500)
    assert result.is_error and result.meta["timed_out"] and "Timed out after 0.5 s" in result.text
    assert "process" in result.text
    # a model that meant timeout=60 as seconds (OpenCode's and Claude Code's are ms too) is told
    assert "pass a larger timeout, in ms (max 600000)" in result.text
    pid = int(re.search(r"child (\d+)", result.text).group(1))
    assert wait_gone(pid), f"grandchild {pid} survived the timeout"


def test_bash_cancellation_kills_the_group(box):
    async def cancel_midway():
        task = asyncio.create_task(box.toolbox.run("bash", {"command": "sleep 30 & echo $!; wait"},
                                                   "tu"))
        while not box.of_type("ToolOutput"):
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    box.loop.run_until_complete(cancel_midway())
    pid = int(box.of_type("ToolOutput")[0]["text"].split()[0])
    assert wait_gone(pid)


class RecordedPopen(subprocess.Popen):
    """subprocess.Popen (the standard library's, not ours), noting the thread each command
    (bash -c) started in, and taking `delay` seconds before it forks."""
    threads: list = []
    delay = 0.0

    def __init__(self, argv, **options):
        if argv[1:2] == ["-c"]:
            RecordedPopen.threads.append(threading.get_ident())
            time.sleep(RecordedPopen.delay)
        super().__init__(argv, **options)


def test_a_command_starts_off_the_event_loop(box, monkeypatch):
    """The fork, with the sandbox set up in the child, returns once the child has exec'd: on the
    event loop it held the screen's redraws and the stream 30-50 ms per command in a 200 MB heap."""
    monkeypatch.setattr(subprocess, "Popen", RecordedPopen)
    monkeypatch.setattr(RecordedPopen, "threads", [])

    async def started_from():
        await box.toolbox.run("bash", {"command": "echo started"}, "tu")
        return threading.get_ident()
    loop_thread = box.loop.run_until_complete(started_from())
    assert box.of_type("ToolOutput")[0]["text"] == "started\n"
    assert RecordedPopen.threads and loop_thread not in RecordedPopen.threads


def test_a_bash_call_records_its_command_for_a_resumed_session_to_stop(box):
    """CommandStarted names the command's group by pid and start, while it runs (see repair)."""
    result = box.call("bash", command="echo $$")
    started = box.of_type("CommandStarted")
    assert [e["pid"] for e in started] == [int(result.text.split()[0])]
    assert started[0]["started_ticks"] > 0 and started[0]["tool_use_id"]


def test_a_command_cancelled_while_it_starts_is_stopped(box, monkeypatch):
    """Esc while a command is being started (Popen in its thread): the process it would have had
    is killed once it exists, and the turn is cancelled."""
    marker = box.toolbox.workspace.cwd / "ran"
    monkeypatch.setattr(subprocess, "Popen", RecordedPopen)
    monkeypatch.setattr(RecordedPopen, "threads", [])
    monkeypatch.setattr(RecordedPopen, "delay", 0.3)

    async def cancel_while_starting():
        command = f"sleep 1; touch {marker}"
        task = asyncio.create_task(box.toolbox.run("bash", {"command": command}, "tu"))
        while not RecordedPopen.threads:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(1.5)
    box.loop.run_until_complete(asyncio.wait_for(cancel_while_starting(), 10))
    assert not marker.exists()


@pytest.mark.parametrize("tool_name, tool_input, connect", [
    ("bash", {}, "connect_read_pipe"),
    ("process", {"action": "start"}, "connect_read_pipe"),
    ("process", {"action": "start"}, "connect_write_pipe")])
def test_a_command_cancelled_as_its_pipes_are_connected_is_stopped(box, monkeypatch, tool_name,
                                                                   tool_input, connect):
    """QA: Esc just after the command had started, while its output pipe (or a process's stdin)
    was connected to the event loop: the process ran on, in no group khaelor knew of."""
    marker = box.toolbox.workspace.cwd / "ran"
    box.call("bash", command="true")                # the workspace's own fds are made by now
    open_before = len(os.listdir("/proc/self/fd"))
    connect_pipe = getattr(box.loop, connect)

    async def cancelled_meanwhile(*args):
        # the Esc: the turn's task is cancelled as the loop connects the pipe
        asyncio.current_task().cancel()
        return await connect_pipe(*args)
    monkeypatch.setattr(box.loop, connect, cancelled_meanwhile)

    async def cancel_while_connecting():
        command = f"sleep 1; touch {marker}"
        with pytest.raises(asyncio.CancelledError):
            await box.toolbox.run(tool_name, {**tool_input, "command": command}, "tu")
        await asyncio.sleep(1.5)
    box.loop.run_until_complete(asyncio.wait_for(cancel_while_connecting(), 10))
    assert not marker.exists()
    assert len(os.listdir("/proc/self/fd")) == open_before, "a pipe end was left open"


class LatePopen(subprocess.Popen):
    """subprocess.Popen (the standard library's), returning `delay` seconds after the fork, as
    its thread does on a loaded machine."""
    delay = 0.0

    def __init__(self, argv, **options):
        super().__init__(argv, **options)
        time.sleep(LatePopen.delay)


def test_a_process_whose_leader_exits_at_once_is_known_on_resume(box, monkeypatch):
    """QA: `sh -c 'server &'` (its leader gone at once) was reaped before its start was read, so
    its ProcessStarted had no started_ticks, and a resume after a kill -9 of khaelor left the
    server running ("lost", not "stopped on resume")."""
    monkeypatch.setattr(subprocess, "Popen", LatePopen)
    monkeypatch.setattr(LatePopen, "delay", 0.3)
    box.call("process", action="start", command="sh -c 'sleep 30 & exit'")
    [started] = box.of_type("ProcessStarted")
    assert isinstance(started.get("started_ticks"), int), started
    leader = started["pid"]
    assert sandbox.pids_in_groups({leader}), "the sleep runs on in the leader's group"
    # what a resume does with the log's ProcessStarted once khaelor was killed
    assert tools.stop_orphans([(leader, started["started_ticks"])]) == {leader}
    assert not sandbox.pids_in_groups({leader})


def test_bash_stops_background_strays_when_the_command_ends(box):
    result = box.call("bash", command="sleep 30 > /dev/null & echo $!")
    assert "stopped" in result.text and result.meta["exit_code"] == 0
    assert wait_gone(int(result.text.split()[0]))


def test_bash_timeout_is_capped_and_validated(box):
    assert "capped" in box.call("bash", command="true", timeout=9_000_000).text
    assert box.call("bash", command="true", timeout=0).is_error
    assert box.call("bash", command="   ").is_error


def test_long_output_keeps_head_and_tail_and_spills_the_rest(box):
    result = box.call("bash", command="seq 1 200000")
    text = result.text
    assert text.startswith("1\n2\n3\n") and "200000" in text and "omitted" in text
    assert len(text) < tools.OUTPUT_BUDGET_CHARS + 1000
    spill = Path(result.meta["spill"])
    assert str(spill) in text and spill.parent == box.toolbox.spill_dir
    assert spill.read_text().splitlines()[-1] == "200000"
    assert "longer than the 2,000 characters" not in text      # short lines: read shows them


def test_a_spilled_output_of_huge_lines_says_how_to_see_them(box):
    """Minified JSON spilled whole: "read it with offset/limit" would show one line cut at 2,000
    characters, so the marker says how to see parts of a line."""
    text = box.call("bash", command="head -c 100000 /dev/zero | tr '\\0' x").text
    assert "longer than the 2,000 characters read shows of each" in text and "cut -c" in text


def test_ansi_and_progress_redraws_are_cleaned(box):
    text = box.call("bash", command=r"printf '\033[31mred\033[0m\n10%%\r50%%\r100%%\ndone\n'").text
    assert text.startswith("red\n100%\ndone")


def test_string_escapes_reach_the_model_without_their_payloads(box):
    """Issue 21 item 3: DCS, SOS, PM and APC strings, like OSC, are dropped whole (a terminal shows
    nothing of them, so neither may the model read what the user never saw); ESC 7 and ESC c too."""
    payloads = r"\033Pdcs-x\033\\ \033Xsos-x\033\\ \033^pm-x\033\\ \033_apc-x\007 \0337\033c"
    text = box.call("bash", command=f"printf '{payloads}seen\\n'").text
    assert text.startswith("    seen") and "-x" not in text and "\x1b" not in text


def test_spill_folder_is_pruned_oldest_first(tmp_path, monkeypatch):
    spill = tmp_path / "spill"
    spill.mkdir()
    for n in range(5):
        (spill / f"old{n}.txt").write_text("x" * 1000)
        os.utime(spill / f"old{n}.txt", (n, n))
    monkeypatch.setattr(tools, "SPILL_DIR_CAP_BYTES", 3500)
    monkeypatch.setattr(tools, "SPILL_FILE_CAP_BYTES", 1000)
    tools._prune_spill(spill)
    assert sorted(p.name for p in spill.iterdir()) == ["old3.txt", "old4.txt"]


def test_spill_files_of_the_flat_folder_before_projects_had_their_own_are_pruned_too(tmp_path, monkeypatch):
    spill = tmp_path / "spill"
    project_folder = spill / "0123456789ab"
    project_folder.mkdir(parents=True)
    for n, path in enumerate([spill / "flat0.txt", spill / "flat1.txt", project_folder / "new.txt"]):
        path.write_text("x" * 1000)
        os.utime(path, (n, n))
    monkeypatch.setattr(tools, "SPILL_DIR_CAP_BYTES", 3000)
    monkeypatch.setattr(tools, "SPILL_FILE_CAP_BYTES", 1000)
    tools._prune_spill(project_folder)
    assert sorted(p.name for p in spill.iterdir()) == ["0123456789ab", "flat1.txt"]
    assert (project_folder / "new.txt").exists()


# ---------------------------------------------------------------- process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_process_serves_http_and_is_read_back_then_stopped(box):
    port = free_port()
    (box.root / "index.html").write_text("<h1>khaelor</h1>")
    started = box.call("process", action="start",
                       command=f"{sys.executable} -u -m http.server {port} --bind 127.0.0.1")
    assert not started.is_error and started.meta["process_id"] == "p1"
    pid = started.meta["pid"]
    body = ""
    for _ in range(50):
        body = box.call("bash", command=f"curl -s http://127.0.0.1:{port}/index.html || true").text
        if "khaelor" in body:
            break
        time.sleep(0.1)
    assert "<h1>khaelor</h1>" in body
    log = box.call("process", action="read", id="p1").text
    assert "GET /index.html" in log
    assert "(no new output)" in box.call("process", action="read", id="p1").text
    assert box.toolbox.running_processes()[0]["pid"] == pid
    listing = box.call("process", action="list").text
    assert "p1  running" in listing
    stopped = box.call("process", action="stop", id="p1")
    assert "stopped" in stopped.text and wait_gone(pid)
    assert box.toolbox.running_processes() == []
    assert box.of_type("ProcessStarted")[0]["pid"] == pid
    assert box.of_type("ProcessExited")[0]["cause"] == "stopped"


def test_process_write_talks_to_a_repl_and_reports_natural_exit(box):
    box.call("process", action="start", command=f"{sys.executable} -u -i -q")
    reply = box.call("process", action="write", id="p1", input="print(6 * 7)\n")
    assert "42" in reply.text
    box.call("process", action="write", id="p1", input="raise SystemExit(4)\n")
    for _ in range(50):
        if box.of_type("ProcessExited"):
            break
        box.loop.run_until_complete(asyncio.sleep(0.05))
    assert box.of_type("ProcessExited") == [{"type": "ProcessExited", "process_id": "p1",
                                             "exit_code": 4, "cause": "exited"}]
    late = box.call("process", action="write", id="p1", input="1\n")
    assert late.is_error and "exited" in late.text


def test_process_failure_modes(box):
    assert "needs 'command'" in box.call("process", action="start").text
    blank = box.call("process", action="start", command="  ")
    assert blank.is_error and "command is empty" in blank.text
    assert "No process with id 'p9'" in box.call("process", action="read", id="p9").text
    assert "needs 'id'" in box.call("process", action="stop").text
    assert "No background processes" in box.call("process", action="list").text


def test_process_rolling_buffer_drops_old_output_with_a_marker(box, monkeypatch):
    monkeypatch.setattr(tools, "PROCESS_BUFFER_CHARS", 1000)
    box.call("process", action="start", command="sleep 0.6; seq 1 5000")
    for _ in range(50):
        if box.of_type("ProcessExited"):
            break
        box.loop.run_until_complete(asyncio.sleep(0.05))
    text = box.call("process", action="read", id="p1").text
    assert "earlier characters were dropped" in text and text.rstrip().endswith("5000")
    assert "\n1\n" not in text


def test_a_running_process_keeps_its_newest_output_in_a_file_until_it_exits(box, monkeypatch):
    """What a kill -9 of khaelor would leave for `repair` to read back: the file holds the newest
    output, at most twice the buffer of it (a server runs for days); once the process's end is in
    the log, the file goes."""
    monkeypatch.setattr(tools, "PROCESS_BUFFER_CHARS", 1000)
    box.call("process", action="start", command="seq 1 5000; sleep 30")
    [live] = box.toolbox.spill_dir.glob("running-*-p1.txt")
    for _ in range(100):
        if live.read_text().endswith("5000\n"):
            break
        box.loop.run_until_complete(asyncio.sleep(0.05))
    kept = live.read_text()
    assert kept.endswith("\n4999\n5000\n") and len(kept) <= 2000, len(kept)
    assert "".join(f"{n}\n" for n in range(1, 5001)).endswith(kept)
    box.call("process", action="stop", id="p1")
    assert not live.exists()


def test_process_live_cap(box, monkeypatch):
    monkeypatch.setattr(tools, "PROCESS_LIVE_CAP", 2)
    monkeypatch.setattr(tools, "PROCESS_SETTLE_S", 0.01)
    box.call("process", action="start", command="sleep 30")
    box.call("process", action="start", command="sleep 30")
    third = box.call("process", action="start", command="sleep 30")
    assert third.is_error and "limit is 2" in third.text


def test_processes_outlive_a_cancelled_turn_and_close_stops_them_all(tmp_path, monkeypatch):
    monkeypatch.setattr(tools, "PROCESS_STOP_GRACE_S", 0.3)
    root = tmp_path / "p"
    root.mkdir()
    box = Box(root, tmp_path / "home")

    async def turn():
        await box.toolbox.run("process", {"action": "start", "command": "sleep 60 & sleep 60"},
                              "t1")
        await box.toolbox.run("process", {"action": "start", "command": "trap '' TERM; sleep 60"},
                              "t2")
        await asyncio.sleep(30)

    async def interrupt():
        task = asyncio.create_task(turn())
        while len(box.toolbox.running_processes()) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    box.loop.run_until_complete(interrupt())
    pids = [p["pid"] for p in box.toolbox.running_processes()]
    assert len(pids) == 2 and all(pid_alive(pid) for pid in pids)
    group_members = subprocess.run(["pgrep", "-g", str(pids[0])], capture_output=True,
                                   text=True).stdout.split()
    assert len(group_members) >= 2
    box.close()
    for pid in pids + [int(p) for p in group_members]:
        assert wait_gone(pid), f"{pid} survived close()"
    exits = box.of_type("ProcessExited")
    assert sorted(e["process_id"] for e in exits) == ["p1", "p2"]
    assert {e["cause"] for e in exits} == {"khaelor exit"}


# ---------------------------------------------------------------- edit conformance table
# (name, file bytes, old_string, new_string, replace_all, expected file bytes or "ERROR: <text>",
#  strategy)
EDIT_CASES = [
    ("exact single line", b"a = 1\nb = 2\n", "b = 2", "b = 3", False, b"a = 1\nb = 3\n", "exact"),
    ("exact multi-line", b"def f():\n    return 1\n", "def f():\n    return 1",
     "def f():\n    return 2", False,
     b"def f():\n    return 2\n", "exact"),
    ("exact ambiguous cites lines", b"x\ny\nx\n", "x", "z", False,
     "ERROR: matches 2 places in f.py (lines 1, 3)", None),
    ("replace_all exact", b"x = 1\nx = 1\n", "x = 1", "x = 2", True, b"x = 2\nx = 2\n", "exact"),
    ("deleting a whole line takes its line break", b"import os\n    import sys\nx = 1\n",
     "import sys", "", False, b"import os\nx = 1\n", "exact"),
    ("deleting the end of a line keeps the line", b"x = 1  # note\ny = 2\n", "  # note", "",
     False, b"x = 1\ny = 2\n", "exact"),
    # Claude Code's edit: straight quotes typed for the file's curly ones, which new_string gets,
    # but only for a kind the replaced text has only curly (code's own ' stays straight).
    ("straight quotes for curly ones", "“Hi,” she said. It’s late.\n".encode(),
     "\"Hi,\" she said. It's late.", "\"Bye,\" she said. It's 'late'.", False,
     "“Bye,” she said. It’s ‘late’.\n".encode(), "quote_normalized"),
    ("curly quotes only where the file had them", "x = 'a'  # it’s\nx = 'a'  # it’s\n".encode(),
     "x = 'a'  # it's", "x = 'b'  # it's", True,
     "x = 'b'  # it's\nx = 'b'  # it's\n".encode(), "quote_normalized"),
    ("identical strings refused", b"a\n", "a", "a", False, "ERROR: identical", None),
    ("not found shows closest text", b"import os\ndef compute(a):\n    return a\n",
     "def compte(a, b):\n    return a",
     "x", False, "ERROR: most similar text starts at line 2", None),
    ("not found mentions line-number prefixes", b"x = 1\n", "     1\tx = 1", "x = 2", False,
     "ERROR: without read's line-number prefixes", None),
    ("line-trimmed: trailing whitespace", b"def f():  \n    return 1\t\n", "def f():\n    return 1",
     "def f():\n    return 2", False, b"def f():\n    return 2\n", "line_trimmed"),
    ("line-trimmed: indentation drift re-indents new_string",
     b"class A:\n    def f(self):\n        return 1\n",
     "def f(self):\n    return 1", "def f(self):\n    return 2", False,
     b"class A:\n    def f(self):\n        return 2\n", "line_trimmed"),
    ("line-trimmed: over-indented old_string", b"def f():\n    return 1\n",
     "        def f():\n            return 1",
     "        def f():\n            return 2", False, b"def f():\n    return 2\n", "line_trimmed"),
    ("line-trimmed: trailing newline in old_string", b"    a()\n    b()\n", "a()\nb()\n",
     "a()\nc()\n", False,
     b"    a()\n    c()\n", "line_trimmed"),
    ("line-trimmed: drift with blank lines", b"class A:\n    def f(self):\n\n        return 1\n",
     "def f(self):\n\n    return 1", "def f(self):\n\n    return 2\n    # done", False,
     b"class A:\n    def f(self):\n\n        return 2\n        # done\n", "line_trimmed"),
    ("block-anchor: middle line differs",
     b"def f(x):\n    y = x + 1\n    z = y * 2\n    return z\n",
     "def f(x):\n    y = x + 1\n    z = y * 3\n    return z", "def f(x):\n    return x", False,
     b"def f(x):\n    return x\n", "block_anchor"),
    ("block-anchor: most similar candidate wins",
     b"if a:\n    foo(1)\n    bar(1)\nend\nif a:\n    foo(2)\n    qux(9)\nend\n",
     "if a:\n    foo(2)\n    qux(8)\nend", "if a:\n    done()\nend", False,
     b"if a:\n    foo(1)\n    bar(1)\nend\nif a:\n    done()\nend\n", "block_anchor"),
    ("block-anchor: too dissimilar is not a match",
     b"def f():\n    alpha_beta_gamma()\n    return 1\n",
     "def f():\n    zzz\n    return 1", "x", False, "ERROR: not found", None),
    ("whitespace-normalized: inner spaces", b"x = foo(a,  b)\n", "x = foo(a, b)", "x = foo(a, c)",
     False,
     b"x = foo(a, c)\n", "whitespace_normalized"),
    ("whitespace-normalized: tabs and doubled spaces", b"if x:\n\treturn  1\n",
     "if x:\n    return 1",
     "if x:\n    return 2", False, b"if x:\n    return 2\n", "whitespace_normalized"),
    ("whitespace-normalized: unicode", "名前  =  '値'\n".encode(), "名前 = '値'", "名前 = '新'", False,
     "名前 = '新'\n".encode(), "whitespace_normalized"),
    ("indentation-flexible narrows an ambiguous trimmed match",
     b"def a():\n    if x:\n        foo()\n    bar()\ndef b():\n    if x:\n    foo()\n    bar()\n",
     "if x:\n    foo()\nbar()", "if x:\n    baz()\nbar()", False,
     b"def a():\n    if x:\n        baz()\n    bar()\ndef b():\n    if x:\n    foo()\n    bar()\n",
     "indentation_flexible"),
    ("escape-normalized: over-escaped quotes", b'print("hi")\n', 'print(\\"hi\\")',
     'print(\\"bye\\")', False,
     b'print("bye")\n', "escape_normalized"),
    ("escape-normalized: literal backslash-n", b"a\nb\n", "a\\nb", "a\\nc", False, b"a\nc\n",
     "escape_normalized"),
    ("escape-normalized: literal backslash-t", b"a\tb\n", "a\\tb", "a\\tc", False, b"a\tc\n",
     "escape_normalized"),
    ("escape-normalized: the file has the escape the model left out", b"    msg = 'it\\'s done'\n",
     "msg = 'it's done'", "msg = 'all done'", False, b"    msg = 'all done'\n",
     "escape_normalized"),
    ("whitespace-normalized: runs inside a line", b"    total  =  a +  b\n", "total = a + b",
     "total = a",
     False, b"    total = a\n", "whitespace_normalized"),
    ("whitespace-normalized: never joins lines", b"a\nb\n", "a b", "c", False, "ERROR: not found",
     None),
    ("BOM quoted in old_string", b"\xef\xbb\xbfx = 1\n", "\ufeffx = 1", "\ufeffx = 2", False,
     b"\xef\xbb\xbfx = 2\n", "exact"),
    ("identical once line endings are normalised", b"a\r\nb\r\n", "a\r\nb", "a\nb", False,
     "ERROR: identical", None),
    ("trimmed-boundary narrows a whitespace match", b"call(a  b)\ncall(a b)\n", " a b ", " c ",
     False,
     b"call(a  b)\ncall(c)\n", "trimmed_boundary"),
    ("context-aware: anchor repeats inside the block",
     b"def f():\n    a = 1\n    return a\n    b = 2\n    return a\n",
     "def f():\n    a = 1\n    x = 99999999\n    b = 2\n    return a", "def f():\n    return 0",
     False,
     b"def f():\n    return 0\n", "context_aware"),
    ("multi-occurrence: replace_all over whitespace variants",
     b"x = 1\n    x  =  1\nif y: x =\t1\n", "x = 1 ",
     "x = 2 ", True, b"x = 2\n    x = 2\nif y: x = 2\n", "multi_occurrence"),
    ("replace_all exact keeps each occurrence's surroundings", b"  a(1)\n\tb\n        a(1)\n",
     "a(1)\n", "a(2)\n",
     True, b"  a(2)\n\tb\n        a(2)\n", "exact"),
    ("replace_all with nothing to match", b"a\n", "zzz", "y", True, "ERROR: not found", None),
    ("fuzzy ambiguity cites lines", b"  foo()\nbar\n    foo()\n", "foo() ", "baz()", False,
     "ERROR: matches 2 places in f.py (lines 1, 3)", None),
    ("disproportionate fuzzy match refused", b"a" + b" " * 300 + b"b\n", "a b", "c", False,
     "ERROR: much more text than old_string", None),
    ("CRLF preserved", b"a\r\nb\r\nc\r\n", "a\nb", "a\nB", False, b"a\r\nB\r\nc\r\n", "exact"),
    ("CRLF old_string on CRLF file", b"a\r\nb\r\n", "a\r\nb", "x\r\ny", False, b"x\r\ny\r\n",
     "exact"),
    ("CRLF new lines inserted as CRLF", b"a\r\nb\r\n", "b", "b\nc", False, b"a\r\nb\r\nc\r\n",
     "exact"),
    ("BOM preserved", b"\xef\xbb\xbfx = 1\n", "x = 1", "x = 2", False, b"\xef\xbb\xbfx = 2\n",
     "exact"),
    ("BOM and CRLF together", b"\xef\xbb\xbfa\r\nb\r\n", "  b", "  c", False,
     b"\xef\xbb\xbfa\r\nc\r\n",
     "line_trimmed"),
    ("unicode exact", "naïve = '日本語'\nemoji = '🎉'\n".encode(), "emoji = '🎉'", "emoji = '✨'", False,
     "naïve = '日本語'\nemoji = '✨'\n".encode(), "exact"),
    ("not found names the invisible characters of the similar line",
     "x\u200by =\u00a01\n".encode(), "xy = 1", "xy = 2", False,
     "ERROR: U+00A0 NO-BREAK SPACE, U+200B ZERO WIDTH SPACE.", None),
    ("unicode-normalized: NFC old_string on an NFD file (macOS)",
     "name = 'cafe\u0301'\nx = 1\n".encode(), "name = 'caf\u00e9'", "name = 'tea'", False,
     b"name = 'tea'\nx = 1\n", "unicode_normalized"),
    ("unicode-normalized: NFD old_string on an NFC file, replace_all",
     "caf\u00e9 caf\u00e9\n".encode(), "cafe\u0301", "bar", True, b"bar bar\n",
     "unicode_normalized"),
    ("no trailing newline kept", b"x = 1", "x = 1", "x = 2", False, b"x = 2", "exact"),
    ("empty old_string on a non-empty file", b"x\n", "", "y", False, "ERROR: old_string is empty",
     None),
    ("empty old_string fills an empty file", b"", "", "hello\n", False, b"hello\n", "exact"),
    ("deletion with empty new_string", b"a\nb\nc\n", "b\n", "", False, b"a\nc\n", "exact"),
]


@pytest.mark.parametrize("name, before, old, new, replace_all, expected, strategy", EDIT_CASES,
                         ids=[case[0] for case in EDIT_CASES])
def test_edit_conformance(box, name, before, old, new, replace_all, expected, strategy):
    target = box.root / "f.py"
    target.write_bytes(before)
    box.call("read", file_path="f.py")
    result = box.call("edit", file_path="f.py", old_string=old, new_string=new,
                      replace_all=replace_all)
    if isinstance(expected, str):
        assert result.is_error, result.text
        assert expected.removeprefix("ERROR: ") in result.text
        assert target.read_bytes() == before
    else:
        assert not result.is_error, result.text
        assert target.read_bytes() == expected
        assert result.meta["strategy"] == strategy


def test_edit_conformance_table_covers_every_strategy_and_has_thirty_cases():
    assert len(EDIT_CASES) >= 30
    assert {case[6] for case in EDIT_CASES if case[6]} == {name for name, _, _ in tools.CASCADE}


# ---------------------------------------------------------------- write / edit safety and reporting


def test_edit_result_shows_a_numbered_snippet_and_emits_file_modified(box):
    (box.root / "m.py").write_text("".join(f"line{n}\n" for n in range(1, 21)))
    box.call("read", file_path="m.py")
    result = box.call("edit", file_path="m.py", old_string="line10\n", new_string="ten\nTEN\n")
    assert "    10\tten\n    11\tTEN" in result.text and "     6\tline6" in result.text
    assert "(+2 −1)" in result.text
    event = box.of_type("FileModified")[-1]
    assert event["path"] == "m.py" and not event["created"]
    assert event["added"] == 2 and event["removed"] == 1
    assert "@@ -7,7 +7,8 @@" in event["diff"] and "-line10\n+ten\n+TEN\n" in event["diff"]


def test_fuzzy_match_is_reported_to_the_model(box):
    (box.root / "f.py").write_text("x = foo(a,  b)\n")
    box.call("read", file_path="f.py")
    result = box.call("edit", file_path="f.py", old_string="x = foo(a, b)", new_string="x = 1")
    assert "whitespace-normalized strategy" in result.text


def test_write_and_edit_refuse_unread_or_changed_files(box):
    target = box.root / "user.py"
    target.write_text("mine = 1\n")
    for call in (dict(name="write", content="x"),
                 dict(name="edit", old_string="mine", new_string="yours")):
        name = call.pop("name")
        refused = box.call(name, file_path="user.py", **call)
        assert refused.is_error and "not read it" in refused.text
    box.call("read", file_path="user.py")
    time.sleep(0.01)
    target.write_text("mine = 2  # the user's concurrent edit\n")
    stale = box.call("edit", file_path="user.py", old_string="mine", new_string="yours")
    assert stale.is_error and "changed on disk" in stale.text
    assert target.read_text() == "mine = 2  # the user's concurrent edit\n"
    box.call("read", file_path="user.py")
    assert not box.call("edit", file_path="user.py", old_string="mine", new_string="yours").is_error
    again = box.call("edit", file_path="user.py", old_string="yours", new_string="ours")
    assert not again.is_error, "the model's own write counts as seen"


def test_what_the_model_read_and_the_process_numbers_come_from_the_log(tmp_path):
    """Issue 21 item 6: the toolbox keeps no copy of the log's facts. A read counts once its
    result is in the log (a resumed session replays the same fold), and process numbers go on
    from the newest ProcessStarted the log holds."""
    import events
    root = tmp_path / "project"
    root.mkdir()
    (root / "a.txt").write_text("one\n")
    home = tmp_path / "home"
    store = events.SessionStore.create(events.sessions_dir(home, root))
    bus = events.Bus(store)
    bus.emit("ProcessStarted", process_id="p7", pid=1, command="an older server")
    box = tools.Toolbox(tools.Workspace(root), home, bus.emit, lambda: bus.store.state)
    loop = asyncio.new_event_loop()
    try:
        read = loop.run_until_complete(box.run("read", {"file_path": "a.txt"}, "t1"))
        edit = {"file_path": "a.txt", "old_string": "one", "new_string": "two"}
        early = loop.run_until_complete(box.run("edit", edit, "t2"))
        assert early.is_error and early.meta["error"] == "not_read", "no read in the log yet"
        bus.emit("ToolCompleted", tool_use_id="t1", name="read", output=read.text, meta=read.meta)
        resumed = events.replay(store.events)
        assert resumed.stamps == bus.store.state.stamps, "a resumed session knows the same"
        assert not loop.run_until_complete(box.run("edit", edit, "t3")).is_error
        started = loop.run_until_complete(box.run("process", {"action": "start",
                                                              "command": "sleep 5"}, "t4"))
        assert started.meta["process_id"] == "p8"
    finally:
        loop.run_until_complete(box.close())
        loop.close()
        store.close()


SLIPS = [
    # (file, old_string, new_string, file after): issue 22 item 17
    ("msg = 'it\\'s done'\n", "msg = 'it's done'", "msg = 'all done'", "msg = 'all done'\n"),
    ("def f():\n    total  =  a +   b   \n", "total = a + b", "total = a - b",
     "def f():\n    total = a - b\n"),
    ("\ufeffname = 1\r\nother = 2\r\n", "\ufeffname = 1", "name = 3",
     "\ufeffname = 3\r\nother = 2\r\n"),
]


@pytest.mark.parametrize("before, old, new, after", SLIPS, ids=["escape", "spaces", "bom"])
def test_a_models_small_slips_do_not_break_an_edit(box, before, old, new, after):
    """The escape- and whitespace-normalised strategies match as OpenCode's replacers do (the
    whole line is the span), and an old_string carrying the file's BOM matches: in the tool and
    in the kernel's check before it asks (problem)."""
    (box.root / "f.py").write_bytes(before.encode())
    box.call("read", file_path="f.py")
    call = {"file_path": "f.py", "old_string": old, "new_string": new}
    assert box.toolbox.problem("edit", call) is None
    result = box.call("edit", **call)
    assert not result.is_error, result.text
    assert (box.root / "f.py").read_bytes() == after.encode()


def test_an_edits_preview_is_the_diff_it_will_make_in_every_place(box):
    """The permission panel showed old_string and new_string alone: a replace_all's other places,
    a fuzzy match's real lines and the surrounding code were not what the user approved."""
    (box.root / "f.py").write_text("def f():\n    x = 1\n    return x\n\nx = 1\n")
    box.call("read", file_path="f.py")
    call = {"file_path": "f.py", "old_string": "x = 1", "new_string": "x = 2", "replace_all": True}
    diff = box.toolbox.preview("edit", call).splitlines()
    assert diff[:2] == ["--- a/f.py", "+++ b/f.py"]
    assert diff.count("-    x = 1") == 1 and diff.count("-x = 1") == 1
    assert diff.count("+    x = 2") == 1 and diff.count("+x = 2") == 1
    assert " def f():" in diff and "     return x" in diff
    spaced = {"file_path": "f.py", "old_string": "return  x", "new_string": "return -x"}
    assert "-    return x" in box.toolbox.preview("edit", spaced).splitlines()
    # what cannot be planned yet (a new file, a file never read) shows the strings themselves
    new_file = {"file_path": "new.py", "old_string": "", "new_string": "y = 1"}
    assert box.toolbox.preview("edit", new_file) == "- \n+ y = 1"
    (box.root / "unread.py").write_text("z = 1\n")
    unread = {"file_path": "unread.py", "old_string": "z", "new_string": "w"}
    assert box.toolbox.preview("edit", unread) == "- z\n+ w"
    assert (box.root / "f.py").read_text().count("x = 1") == 2, "a preview changes nothing"


def test_an_edit_that_changes_only_line_endings_is_refused_as_no_change(box):
    (box.root / "f.txt").write_bytes(b"a\r\nb\r\n")
    box.call("read", file_path="f.txt")
    call = {"file_path": "f.txt", "old_string": "a\r\nb", "new_string": "a\nb"}
    doomed = box.toolbox.problem("edit", call)
    assert doomed is not None and doomed.meta["error"] == "no_change"
    result = box.call("edit", **call)
    assert result.is_error and result.meta["error"] == "no_change"
    assert (box.root / "f.txt").read_bytes() == b"a\r\nb\r\n"


def test_a_fuzzy_match_that_already_reads_as_new_string_is_no_change(box):
    # "x = 1 " matched "x = 1" (trimmed) and new_string was "x = 1": "Edited a.py: 1 replacement
    # (+0 −0)", a version kept and the file rewritten for nothing
    (box.root / "a.py").write_text("x = 1\ny = 2\n")
    box.call("read", file_path="a.py")
    call = {"file_path": "a.py", "old_string": "x = 1 ", "new_string": "x = 1"}
    assert box.toolbox.problem("edit", call).meta["error"] == "no_change"
    result = box.call("edit", **call)
    assert result.is_error and "a.py already reads as this edit would leave it" in result.text
    assert not box.of_type("FileModified")


def test_write_creates_parents_and_keeps_mode_crlf_and_bom(box):
    created = box.call("write", file_path="deep/er/new.txt", content="a\nb\n")
    assert "Created deep/er/new.txt (2 lines)" in created.text
    assert box.of_type("FileModified")[-1]["created"] is True
    script = box.root / "run.sh"
    script.write_bytes(b"\xef\xbb\xbfecho 1\r\n")
    script.chmod(0o755)
    box.call("read", file_path="run.sh")
    box.call("write", file_path="run.sh", content="echo 2\necho 3\n")
    assert script.read_bytes() == b"\xef\xbb\xbfecho 2\r\necho 3\r\n"
    assert script.stat().st_mode & 0o777 == 0o755
    assert not list(box.root.glob(".run.sh.*")), "no temp file left behind"


# OpenCode's write tests (packages/opencode/test/tool/write.test.ts): path, content; the bytes
# written must be the content's, a new file 0644 under umask 022. Its overwrite cases are
# test_write_creates_parents_and_keeps_mode_crlf_and_bom and the read-only test below (ours, as
# Claude Code's, overwrites only a file read first).
OPENCODE_WRITES = [
    ("writes content to new file", "newfile.txt", "Hello, World!"),
    ("creates parent directories if needed", "nested/deep/file.txt", "nested content"),
    ("writes binary-safe content", "binary.bin", "Hello\x00World\x01\x02\x03"),
    ("writes empty content", "empty.txt", ""),
    ("writes multi-line content", "multiline.txt", "Line 1\nLine 2\nLine 3\n"),
    ("handles different line endings", "crlf.txt", "Line 1\r\nLine 2\r\nLine 3"),
]


@pytest.mark.parametrize("path, content", [case[1:] for case in OPENCODE_WRITES],
                         ids=[case[0] for case in OPENCODE_WRITES])
def test_opencode_write_case(box, path, content):
    old_umask = os.umask(0o022)
    try:
        result = box.call("write", file_path=path, content=content)
    finally:
        os.umask(old_umask)
    assert not result.is_error and result.text.startswith(f"Created {path} ("), result.text
    assert (box.root / path).read_bytes() == content.encode()
    assert (box.root / path).stat().st_mode & 0o777 == 0o644


def test_write_failure_modes(box):
    (box.root / "d").mkdir()
    assert "is a directory" in box.call("write", file_path="d", content="x").text
    (box.root / "same.txt").write_text("x\n")
    box.call("read", file_path="same.txt")
    assert "nothing changed" in box.call("write", file_path="same.txt", content="x\n").text


def test_edit_failure_modes(box):
    assert "does not exist" in box.call("edit", file_path="nope.py", old_string="a",
                                        new_string="b").text
    (box.root / "latin.txt").write_bytes(b"caf\xe9\n")
    box.call("read", file_path="latin.txt")
    assert "not UTF-8" in box.call("edit", file_path="latin.txt", old_string="caf",
                                   new_string="bar").text
    created = box.call("edit", file_path="brand_new.py", old_string="", new_string="x = 1\n")
    assert not created.is_error and (box.root / "brand_new.py").read_text() == "x = 1\n"


def test_write_and_edit_leave_a_read_only_file_alone(box):
    """A file the user made read-only (chmod a-w) was overwritten: the temp file renamed over it
    needs only the folder's permission, where Claude Code's open() fails with EACCES (and
    OpenCode's write test "throws error when OS denies write access")."""
    locked = box.root / "locked.txt"
    locked.write_text("keep\n")
    locked.chmod(0o444)
    box.call("read", file_path="locked.txt")
    for call in ({"name": "write", "content": "changed\n"},
                 {"name": "edit", "old_string": "keep", "new_string": "changed"}):
        result = box.call(call.pop("name"), file_path="locked.txt", **call)
        assert result.is_error and result.meta["error"] == "read_only", result.text
        assert "is read-only (mode 444)" in result.text
    assert locked.read_text() == "keep\n" and locked.stat().st_mode & 0o777 == 0o444


def test_writing_back_a_file_that_is_not_utf8_with_its_replacement_characters_is_refused(box):
    """read shows a Latin-1 file's é as U+FFFD; a write of that text back replaced every such
    byte with EF BF BD, for good. (edit already refused a file that is not UTF-8.)"""
    latin = box.root / "latin.txt"
    latin.write_bytes(b"caf\xe9\nline 2\n")
    shown = box.call("read", file_path="latin.txt").text
    assert "caf\ufffd" in shown
    result = box.call("write", file_path="latin.txt", content="caf\ufffd\nline 2 changed\n")
    assert result.is_error and result.meta["error"] == "encoding", result.text
    assert latin.read_bytes() == b"caf\xe9\nline 2\n"
    assert not box.call("write", file_path="latin.txt", content="café\n").is_error


@pytest.mark.parametrize("bom, codec", [(b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be")],
                         ids=["le", "be"])
def test_a_utf16_file_is_read_edited_and_written_as_utf16(box, bom, codec):
    """OpenCode's encoding tests ("edits a utf-16le/be file with BOM in place"), and Claude Code
    reads and writes UTF-16 too: read refused Windows' "Unicode" files as binary and edit said
    "not UTF-8". Now each keeps the file's byte-order mark, UTF-16 and CRLF."""
    wide = box.root / "notes.txt"
    wide.write_bytes(bom + "你好世界\r\nline 2\r\n".encode(codec))
    read = box.call("read", file_path="notes.txt")
    assert not read.is_error and read.text == "     1\t你好世界\n     2\tline 2"
    edited = box.call("edit", file_path="notes.txt", old_string="你好世界", new_string="再见世界")
    assert not edited.is_error, edited.text
    assert wide.read_bytes() == bom + "再见世界\r\nline 2\r\n".encode(codec)
    assert "-你好世界\r\n+再见世界\r\n" in box.of_type("FileModified")[-1]["diff"]
    assert not box.call("write", file_path="notes.txt", content="new\n").is_error
    assert wide.read_bytes() == bom + "new\r\n".encode(codec)


def test_edit_through_a_symlink_keeps_the_link(box):
    (box.root / "real.txt").write_text("a\n")
    (box.root / "link.txt").symlink_to("real.txt")
    box.call("read", file_path="link.txt")
    assert not box.call("edit", file_path="link.txt", old_string="a", new_string="b").is_error
    assert (box.root / "link.txt").is_symlink() and (box.root / "real.txt").read_text() == "b\n"


def test_each_write_and_edit_keeps_the_versions_a_rewind_needs(box):
    box.call("write", file_path="u.py", content="v1\n")
    box.call("edit", file_path="u.py", old_string="v1", new_string="v2")
    modified = box.of_type("FileModified")
    load = box.toolbox.load_version
    befores = [e["before_version"] and load(e["before_version"]) for e in modified]
    afters = [load(e["after_version"]) for e in modified]
    # under KHAELOR_HOME/versions
    assert befores == [None, b"v1\n"] and afters == [b"v1\n", b"v2\n"]


def age_days(path: Path, days: float) -> None:
    """Set a file's mtime (not following a symlink) to `days` ago."""
    then = time.time() - days * 86_400
    os.utime(path, (then, then), follow_symlinks=False)


def test_prune_versions_removes_only_old_sha256_blobs_directly_in_versions(tmp_path):
    home = tmp_path / "home"
    versions = home / "versions"
    versions.mkdir(parents=True)
    old, fresh = versions / ("a" * 64), versions / ("b" * 64)
    old.write_bytes(b"old")
    fresh.write_bytes(b"fresh")
    age_days(old, 31)
    age_days(fresh, 29)
    not_hex = versions / "notes.txt"          # not a sha256 name: never removed, however old
    not_hex.write_text("mine")
    age_days(not_hex, 400)
    upper = versions / ("C" * 64)             # the hex alphabet is lower-case only
    upper.write_text("mine")
    age_days(upper, 400)
    # a symlink with a hash name: neither it nor its target goes
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    age_days(outside, 400)
    link = versions / ("d" * 64)
    link.symlink_to(outside)
    age_days(link, 400)
    nested = versions / ("e" * 64)            # a directory with a hash name is not a blob
    nested.mkdir()
    (nested / ("f" * 64)).write_text("inner")
    age_days(nested / ("f" * 64), 400)
    age_days(nested, 400)

    assert tools.prune_versions(home) == 1
    assert not old.exists() and fresh.read_bytes() == b"fresh"
    assert not_hex.exists() and upper.exists() and (nested / ("f" * 64)).exists()
    assert link.is_symlink() and outside.read_text() == "keep me"


def test_prune_versions_runs_at_most_once_a_day(tmp_path):
    home = tmp_path / "home"
    versions = home / "versions"
    versions.mkdir(parents=True)
    first, second = versions / ("1" * 64), versions / ("2" * 64)
    first.write_bytes(b"1")
    age_days(first, 40)
    assert tools.prune_versions(home) == 1
    marker = versions / tools.VERSIONS_PRUNE_MARKER
    assert marker.is_file()
    second.write_bytes(b"2")
    age_days(second, 40)
    assert tools.prune_versions(home) == 0 and second.exists()     # pruned less than a day ago
    age_days(marker, 1.1)
    assert tools.prune_versions(home) == 1 and not second.exists()
    assert time.time() - marker.stat().st_mtime < 60            # the marker records this run


def test_the_session_folders_of_killed_khaelors_are_removed_and_no_other(tmp_path, monkeypatch):
    """A kill -9 leaves the session's temp folder: the next khaelor removes it once its process
    is gone, never a live khaelor's, never through a link, never another name."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen(["true"])
    ended.wait()
    dead, alive = ended.pid, os.getpid()
    workspace = tools.Workspace(tmp_path)   # its folder lives as long as it does
    mine = workspace.session_temp()
    assert mine.name.startswith(f"khaelor-session-{alive}-")
    left = tmp_path / f"khaelor-session-{dead}-x1y2"
    (left / "sub").mkdir(parents=True)
    (left / "sub" / "out.txt").write_text("left by a killed khaelor")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("not ours")
    (tmp_path / f"khaelor-session-{dead}-link").symlink_to(elsewhere)
    other = tmp_path / f"khaelor-sessions-{dead}-x"
    other.mkdir()
    tools.remove_dead_session_temps()
    assert not left.exists()
    assert mine.is_dir() and other.is_dir() and (elsewhere / "keep").exists()
    assert (tmp_path / f"khaelor-session-{dead}-link").is_symlink()


def test_prune_versions_keep_days_and_what_it_never_raises_on(tmp_path):
    assert tools.prune_versions(tmp_path / "no-home") == 0         # nothing stored yet
    home = tmp_path / "home"
    versions = home / "versions"
    versions.mkdir(parents=True)
    blob = versions / ("a" * 64)
    blob.write_bytes(b"x")
    age_days(blob, 3)
    assert tools.prune_versions(home, keep_days=2) == 1 and not blob.exists()
    # A marker that is a symlink is not followed (nor written through): nothing is pruned.
    target = tmp_path / "elsewhere"
    target.write_text("t")
    age_days(target, 400)
    marker = versions / tools.VERSIONS_PRUNE_MARKER
    marker.unlink()
    marker.symlink_to(target)
    blob.write_bytes(b"x")
    age_days(blob, 40)
    assert tools.prune_versions(home) == 0 and blob.exists()
    assert target.read_text() == "t" and time.time() - target.stat().st_mtime > 300 * 86_400
    # versions/ itself a symlink: it is not followed.
    other = tmp_path / "other-home"
    other.mkdir()
    (other / "versions").symlink_to(versions)
    marker.unlink()
    assert tools.prune_versions(other) == 0 and blob.exists()


def test_storing_an_existing_version_again_keeps_it_fresh(box):
    box.call("write", file_path="v.txt", content="same\n")
    name = box.of_type("FileModified")[-1]["after_version"]
    blob = box.toolbox.versions_dir / name
    age_days(blob, 40)
    box.call("write", file_path="w.txt", content="same\n")     # the same content: the same blob
    assert time.time() - blob.stat().st_mtime < 60
    assert tools.prune_versions(box.toolbox.versions_dir.parent) == 0 and blob.exists()


def test_big_diff_is_capped(box):
    box.call("write", file_path="big.txt", content="".join(f"{n}\n" for n in range(20_000)))
    diff = box.of_type("FileModified")[-1]["diff"]
    assert len(diff) < tools.DIFF_CHAR_CAP + 200 and "diff cut" in diff


# ---------------------------------------------------------------- grep and glob (both engines)


def make_tree(root: Path, git: bool) -> None:
    files = {
        "src/a.py": "def foo():\n    return 1\n# TODO fix\n", "src/pkg/b.py": "import os\nfoo()\n",
        "docs/readme.md": "# Title\nTODO: docs\n", ".github/ci.yml": "name: ci TODO\n",
        "node_modules/lib/x.js": "x = 'TODO'\n", "build/out.txt": "TODO junk\n",
        "app.log": "TODO log\n",
        "src/c.ts": "TODO ts\n", "src/d.tsx": "tsx TODO\r\n",
        ".gitignore": "node_modules/\nbuild/\n*.log\n",
    }
    for n, (rel, text) in enumerate(files.items()):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, newline="")
        os.utime(root / rel, (1_000_000 + n, 1_000_000 + n))
    (root / "data.bin").write_bytes(b"bin\0TODO\n")
    if git:
        subprocess.run(["git", "init", "-q", str(root)], check=True)


# Both engines where ripgrep is installed; CI insists on it (the tests then fail without it).
RIPGREP = bool(tools.shutil.which("rg") or os.environ.get("KHAELOR_CI"))
ENGINES = ["python"] + (["ripgrep"] if RIPGREP else [])


@pytest.fixture(params=ENGINES)
def search_box(request, box):
    make_tree(box.root, git=True)
    if request.param == "python":
        box.toolbox.ripgrep = None
    assert request.param == "python" or box.toolbox.ripgrep, "ripgrep (rg) is needed: install it"
    return box


def test_glob_respects_gitignore_and_sorts_newest_first(search_box):
    assert search_box.call("glob", pattern="**/*.py").text.split() == ["src/pkg/b.py", "src/a.py"]
    assert search_box.call("glob", pattern="*.{ts,tsx}").text.split() == ["src/d.tsx", "src/c.ts"]
    everything = search_box.call("glob", pattern="*").text
    assert ".github/ci.yml" in everything
    assert "node_modules" not in everything and "app.log" not in everything
    assert search_box.call("glob", pattern="*.py", path="src/pkg").text == "src/pkg/b.py"
    assert "No files match" in search_box.call("glob", pattern="*.rs").text
    empty = search_box.call("glob", pattern=" ")
    assert empty.is_error and "pattern is empty" in empty.text
    assert search_box.call("glob", pattern="*", path="nowhere").is_error


def test_glob_patterns_list_what_ripgreps_glob_lists():
    """tests/data/globs.json: git's wildmatch cases and ripgrep's own glob and gitignore cases,
    against what `rg --files --glob PATTERN` lists (a pattern without "/" names a base name at any
    depth; an invalid one lists nothing), as both engines filter by the one matcher. Where ours
    differs on purpose (git's reading of a [class], which the path rules share) the case says why;
    the agreements are counted, so a lost one shows."""
    cases = json.loads((Path(__file__).parent / "data" / "globs.json").read_text())["cases"]
    agreed = 0
    for case in [case for case in cases if case["rg"] is not None]:
        try:
            listed = tools._glob_matcher(case["pattern"])(case["path"].removeprefix("./"))
        except re.error:
            listed = False
        if listed == case["rg"]:
            agreed += 1
        else:
            assert "rg" in case.get("disputed", {}), case
    assert agreed == 303


def test_glob_up_out_of_the_project_searches_the_folder_it_was_approved_for(search_box):
    # permission_subject judges "../*" on the parent folder: once that is approved, the glob must
    # search there, not match "../*" against the project's own paths and find nothing.
    root = search_box.root
    (root.parent / "sibling.txt").write_text("x")
    approved = sandbox.Confine(paths=(str(root.parent),))
    for tool_input in [{"pattern": "../*.txt"}, {"pattern": "../*"},
                       {"pattern": "../../*.txt", "path": "src"}]:
        found = search_box.loop.run_until_complete(
            search_box.toolbox.run("glob", tool_input, "tu", approved))
        assert str(root.parent / "sibling.txt") in found.text.split(), (tool_input, found.text)
    assert search_box.call("glob", pattern="../*.py", path="src/pkg").text.split() == ["src/a.py"]
    assert search_box.call("glob", pattern=f"{root}/src/*.py").text.split() == ["src/a.py"]


def test_grep_and_glob_up_through_a_link_are_refused_as_read_is(search_box, tmp_path):
    # "sub/../.." with sub -> a/b: permissions judge its real path (the project, no question
    # asked), normpath puts it in the project's parent. Both engines refuse it, as read does;
    # ripgrep found nothing there only because Landlock stopped it, where Landlock is.
    root = search_box.root
    (root / "a" / "b").mkdir(parents=True)
    (root / "sub").symlink_to(root / "a" / "b")
    (root.parent / "outside.txt").write_text("OUTSIDE\n")
    for name, tool_input in [("glob", {"pattern": "sub/../../*"}),
                             ("glob", {"pattern": "*", "path": "sub/../.."}),
                             ("grep", {"pattern": "OUTSIDE", "path": "sub/../.."})]:
        result = search_box.call(name, **tool_input)
        assert result.is_error and result.meta["error"] == "outside", (name, result.text)


def test_glob_with_an_absolute_pattern_searches_the_folder_it_names(search_box):
    # A model often globs with the absolute path it was shown: the pattern names its own folder
    # (as the permission check judged it), never the project's look-alike relative path.
    root = search_box.root
    found = search_box.call("glob", pattern=f"{root}/src/**/*.py").text.split()
    assert found == ["src/pkg/b.py", "src/a.py"]
    assert search_box.call("glob", pattern=f"{root}/src/a.py").text == "src/a.py"
    (root / "elsewhere").mkdir()
    (root / "elsewhere" / "src").mkdir()
    (root / "elsewhere" / "src" / "e.py").write_text("")
    found = search_box.call("glob", pattern="/src/*.py", path="elsewhere")
    assert found.is_error and "e.py" not in found.text


def test_grep_finds_lines_newest_files_first(search_box):
    result = search_box.call("grep", pattern="TODO")
    assert result.text.split("\n") == ["src/d.tsx:1: tsx TODO", "src/c.ts:1: TODO ts",
                                       ".github/ci.yml:1: name: ci TODO",
                                       "docs/readme.md:2: TODO: docs", "src/a.py:3: # TODO fix"]
    assert search_box.call("grep", pattern="TODO", include="*.log").text.startswith("No matches")
    found = search_box.call("grep", pattern=r"foo\(", include="src/pkg/*").text
    assert found == "src/pkg/b.py:2: foo()"
    found = search_box.call("grep", pattern="import", path="src/pkg/b.py").text
    assert found == "src/pkg/b.py:1: import os"
    bad = search_box.call("grep", pattern="(unclosed")
    assert bad.is_error and "Escape special characters" in bad.text


def test_grep_look_around_backreferences_and_line_anchors_match_in_both_engines(search_box):
    # ripgrep refused look-around and backreferences that the Python engine matched; the Python
    # engine missed "^foo" past a file's first line (its whole-file pre-check had no MULTILINE).
    result = search_box.call("grep", pattern=r"import (?=os)|(o)\1")
    assert result.text.split("\n") == ["src/pkg/b.py:1: import os", "src/pkg/b.py:2: foo()",
                                       "src/a.py:1: def foo():"], result.text
    assert search_box.call("grep", pattern="^foo").text == "src/pkg/b.py:2: foo()"
    assert search_box.call("grep", pattern="1$").text == "src/a.py:2:     return 1"
    bad = search_box.call("grep", pattern="(?<=a+)b")
    assert bad.is_error and "look-behind requires fixed-width" in bad.text


def test_grep_dollar_ends_a_crlf_line_too_in_both_engines(search_box):
    # OpenCode's "handles CRLF line endings": "TODO$" missed a Windows file's line (its "\r")
    found = search_box.call("grep", pattern="TODO$").text.split("\n")
    assert found == ["src/d.tsx:1: tsx TODO", ".github/ci.yml:1: name: ci TODO"]
    # a search for the files that end their lines with "\r" still finds them
    assert search_box.call("grep", pattern=r"\r$").text == "src/d.tsx:1: tsx TODO"


def test_a_pattern_that_cannot_match_one_line_says_why_it_found_nothing(search_box):
    # "$5" (a literal dollar meant) and "foo():\n" (two lines meant) found nothing, silently
    (search_box.root / "price.txt").write_text("cost: $5 each\n")
    for pattern in ["$5", r"def foo\(\):\n    return", "def foo():\n", "cost: $5"]:
        found = search_box.call("grep", pattern=pattern)
        assert found.text.startswith("No matches") and "escape $ as \\$" in found.text, pattern
    assert search_box.call("grep", pattern=r"\$5").text == "price.txt:1: cost: $5 each"
    for pattern in ["nothing$", "(a$|b$)", r"\$5 each$"]:
        assert "escape $" not in search_box.call("grep", pattern=pattern).text, pattern


def test_grep_takes_posix_classes_in_both_engines(search_box):
    # Python's re read [[:alpha:]] as a nested set: no match, and a FutureWarning on the terminal
    found = search_box.call("grep", pattern=r"^[[:lower:]]+ [[:lower:]_]|[^[:space:]]+\(\)$")
    assert found.text.split("\n") == ["src/pkg/b.py:1: import os", "src/pkg/b.py:2: foo()",
                                       "src/a.py:1: def foo():"], found.text
    assert search_box.call("grep", pattern="[:alpha:]", path="src/a.py").text.count(":") == 3


def test_search_results_are_capped_with_a_notice(search_box):
    for n in range(130):
        (search_box.root / f"gen/f{n:03}.txt").parent.mkdir(exist_ok=True)
        (search_box.root / f"gen/f{n:03}.txt").write_text("needle\nneedle\n")
    globbed = search_box.call("glob", pattern="gen/*.txt")
    assert globbed.text.count("\n") < 104
    assert "Showing the 100 most recently modified of 130" in globbed.text
    grepped = search_box.call("grep", pattern="needle")
    assert "Showing 100 of 260 matching lines in 130 files" in grepped.text
    assert grepped.meta["truncated"]


@pytest.mark.skipif(not RIPGREP, reason="ripgrep (rg) is not installed: engines not compared")
def test_ripgrep_and_python_fallback_agree(box):
    assert tools.shutil.which("rg"), "ripgrep (rg) is needed to compare the engines: install it"
    for git in (True, False):
        root = box.root / ("repo" if git else "plain")
        root.mkdir()
        make_tree(root, git)
        for name, tool_input in [("glob", {"pattern": "*"}), ("glob", {"pattern": "src/**"}),
                                 ("grep", {"pattern": "TODO"}),
                                 ("grep", {"pattern": "o", "include": "*.py"}),
                                 ("grep", {"pattern": r"\w+\(\)"}),
                                 ("grep", {"pattern": r"(?<=def )\w+|(o)\1"}),
                                 ("grep", {"pattern": "^", "path": "src"}),
                                 ("grep", {"pattern": "TODO$"})]:
            tool_input = {**tool_input, "path": root.name}
            box.toolbox.ripgrep = tools.shutil.which("rg")
            fast = box.call(name, **tool_input)
            box.toolbox.ripgrep = None
            slow = box.call(name, **tool_input)
            assert fast.text == slow.text, (git, name, tool_input)


def test_one_lister_for_search_and_mentions_walks_plain_files_outside_git(tmp_path):
    root = tmp_path / "project"
    for rel in ("src/a.py", ".venv/lib/x.py", ".git/config", "node_modules/m.js"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x\n")
    (root / "link.py").symlink_to(root / "src" / "a.py")
    ws = tools.Workspace(root)
    assert tools.project_files(ws) == [".venv/lib/x.py", "node_modules/m.js", "src/a.py"]
    junk = {"node_modules"}
    skipped = tools.project_files(ws, skip=lambda name: name.startswith(".") or name in junk)
    assert skipped == ["src/a.py"]
    assert len(tools.project_files(ws, limit=2)) == 2


def test_git_runs_when_the_users_environment_carries_git_config_entries(box, monkeypatch):
    """GIT_CONFIG_COUNT=1 in the user's environment: khaelor numbered its own entries after it,
    but the command never gets the user's entry 0, so every git command failed ("missing config
    key GIT_CONFIG_KEY_0")."""
    for name, value in {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "color.ui",
                        "GIT_CONFIG_VALUE_0": "never"}.items():
        monkeypatch.setenv(name, value)
    subprocess.run(["git", "init", "-q", str(box.root)], check=True)
    result = box.call("bash", command="git status --short && echo git-ran")
    assert "git-ran" in result.text and "missing config key" not in result.text, result.text


def test_a_repository_whose_files_git_all_ignores_lists_none_of_them(tmp_path):
    """git listing nothing was taken for "no git" and the tree was walked: grep without ripgrep
    and @-completion then read node_modules and the rest of what the user's ignore rules hide."""
    root = tmp_path / "project"
    (root / "node_modules" / "m").mkdir(parents=True)
    (root / "node_modules" / "m" / "index.js").write_text("x\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".git" / "info" / "exclude").write_text("*\n")
    assert tools.project_files(tools.Workspace(root)) == []


def test_neither_search_engine_follows_a_link_out_of_the_project(box, tmp_path):
    """ripgrep never follows a link it meets; the Python fallback must not either, or a
    committed link would carry grep and glob to any file the user can read."""
    outside = tmp_path / "outside.txt"
    outside.write_text("TODO outside-secret-value\n")
    for git in (True, False):
        root = box.root / ("linked-repo" if git else "linked-plain")
        root.mkdir()
        (root / "in.txt").write_text("TODO inside\n")
        (root / "out.txt").symlink_to(outside)
        (root / "same.txt").symlink_to("in.txt")
        if git:
            subprocess.run(["git", "init", "-q"], cwd=root, check=True)
            subprocess.run(["git", "add", "-A"], cwd=root, check=True)
        for name, tool_input in [("grep", {"pattern": "TODO"}), ("glob", {"pattern": "*"})]:
            tool_input = {**tool_input, "path": root.name}
            box.toolbox.ripgrep = tools.shutil.which("rg")
            fast = box.call(name, **tool_input)
            box.toolbox.ripgrep = None
            slow = box.call(name, **tool_input)
            assert fast.text == slow.text, (git, name)
            assert "in.txt" in slow.text and "out.txt" not in slow.text
            assert "outside-secret-value" not in slow.text



def test_a_quoted_env_value_with_a_comment_after_it_is_masked(box):
    """KEY="value" # note: the value was taken with its quotes, so the value itself, as a program
    reads and prints it, was shown unmasked."""
    (box.root / ".env").write_text('API_KEY="quoted-s3cret-77" # prod\nOLD=\'single-s3cret-88\'  # x\n')
    shown = box.call("bash", command="echo quoted-s3cret-77 single-s3cret-88")
    assert "quoted-s3cret-77" not in shown.text and "single-s3cret-88" not in shown.text
    assert shown.text.count(tools.DOTENV_MASK) == 2


def test_a_nested_env_files_values_are_masked_and_stay_masked(box):
    """Only the .env files at the root were read for masking: a monorepo's packages/api/.env
    reached the model whole once a person approved reading it. And a value stays masked once
    known, when its folder turns unreadable for a while or the file goes."""
    (box.root / "packages" / "api").mkdir(parents=True)
    (box.root / "packages" / "api" / ".env").write_text("DB_PASSWORD=nested-s3cret-99\n")
    (box.root / "deploy" / "prod").mkdir(parents=True)
    (box.root / "deploy" / "prod" / "app.env").write_text("TOKEN=deep-s3cret-token-7\n")
    shown = box.call("bash", command="echo nested-s3cret-99 deep-s3cret-token-7").text
    assert "nested-s3cret-99" not in shown and "deep-s3cret-token-7" not in shown
    assert shown.count(tools.DOTENV_MASK) == 2
    (box.root / "packages" / "api").chmod(0)
    try:
        again = box.call("bash", command="echo nested-s3cret-99").text
    finally:
        (box.root / "packages" / "api").chmod(0o755)
    assert "nested-s3cret-99" not in again
    (box.root / "deploy" / "prod" / "app.env").unlink()
    assert "deep-s3cret-token-7" not in box.call("bash", command="echo deep-s3cret-token-7").text


def test_a_secret_files_past_values_and_private_keys_are_masked_in_gits_history(box):
    """`git log -p` (read-only: it runs unasked) printed the values a .env held before, which the
    masking of today's .env does not know, and a private key committed once and deleted."""
    def git(*args):
        subprocess.run(["git", *args], cwd=box.root, check=True, capture_output=True)
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (box.root / ".env").write_text("DB_PASSWORD=old-s3cret-value-1\nexport TOKEN='old-t0ken-2'\n")
    (box.root / "deploy.key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA"
                                        "\nMARKERkeybody\n-----END OPENSSH PRIVATE KEY-----\n")
    (box.root / "app.cfg").write_text("timeout: 30\n")
    git("add", "-A")
    git("commit", "-qm", "one")
    (box.root / ".env").write_text("DB_PASSWORD=new-s3cret-value-3\n")
    (box.root / "deploy.key").unlink()
    (box.root / "app.cfg").write_text("timeout: 45\n")
    git("commit", "-qam", "two")
    for command in ("git log -p", "git log -p --no-prefix", "git show HEAD~1", "git diff HEAD~1"):
        shown = box.call("bash", command=command).text
        for secret in ("old-s3cret-value-1", "old-t0ken-2", "new-s3cret-value-3", "MARKERkeybody"):
            assert secret not in shown, (command, secret, shown)
        assert "+timeout: " in shown, shown             # another file's values stay as they are
    assert tools.PRIVATE_KEY_MASK in box.call("bash", command="git log -p").text


def test_a_secret_files_past_values_are_masked_in_colored_word_and_renamed_diffs(box):
    """Colors before each line (color.ui=always), --word-diff's lines without a mark, and a .env
    renamed to its template (the header names .env.example last) showed the values it held; the
    messages of the commits after such a diff stay as they are."""
    def git(*args):
        subprocess.run(["git", *args], cwd=box.root, check=True, capture_output=True)
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    rest = "PORT=8080\nHOST=localhost\nMODE=dev\n"
    (box.root / ".env").write_text("DB_PASSWORD=old-s3cret-value-1\nTOKEN='old-t0ken-2'\n" + rest)
    git("add", "-A")
    git("commit", "-qm", "fix: the timeout")
    (box.root / ".env").write_text("DB_PASSWORD=new-s3cret-value-3\nTOKEN='old-t0ken-2'\n" + rest)
    git("commit", "-qam", "two")
    git("mv", ".env", ".env.example")
    (box.root / ".env.example").write_text("DB_PASSWORD=changeme\nTOKEN='changeme'\n" + rest)
    git("commit", "-qam", "three")
    box.call("bash", command="git -c color.ui=always log -p > colored.log")
    shown_by = {"read colored.log": box.call("read", file_path="colored.log").text}
    for command in ("git log -p --word-diff", "git log -p --color-words", "git show HEAD",
                    "git format-patch --stdout HEAD~3"):
        shown_by[command] = box.call("bash", command=command).text
    for command, shown in shown_by.items():
        for secret in ("old-s3cret-value-1", "old-t0ken-2", "new-s3cret-value-3"):
            assert secret not in shown, (command, secret, shown)
    assert "    fix: the timeout" in box.call("bash", command="git log -p").text


@pytest.mark.parametrize("token", [
    "sk-proj-" + "Ab1" * 16, "sk_live_" + "x9" * 12, "AKIA" + "ABCD2345EFGH6789", "AIza" + "y" * 35,
    "npm_" + "n1" * 18, "pypi-" + "AgEIcHlwaS5vcmc" * 4, "hf_" + "h4" * 16])
def test_tokens_of_known_formats_are_masked_and_words_that_look_alike_are_not(box, token):
    shown = box.call("bash", command=f"echo 'key={token}' disk-usage-report-generator-for-linux-x"
                                     " shelf_abcdefghijklmnopqrstuvwxyz01234").text
    assert token not in shown and tools.TOKEN_MASK in shown
    assert "disk-usage-report-generator-for-linux-x shelf_abcdefghijklmnopqrstuvwxyz01234" in shown


def test_an_authorization_header_is_masked_as_actions_checkout_leaves_it_in_git_config(box):
    """actions/checkout persists the job's token in .git/config as an extraheader (base64, so no
    token format matches it): `git config -l` in CI showed it to the model."""
    (box.root / ".git").mkdir()
    credential = "eC1hY2Nlc3MtdG9rZW46Z2hzX1NlY3JldFRva2VuVmFsdWU="
    bearer = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjaSJ9.c2lnbmF0dXJl"
    (box.root / ".git" / "config").write_text(
        '[http "https://github.com/"]\n'
        f"\textraheader = AUTHORIZATION: basic {credential}\n")
    (box.root / "trace.txt").write_text(f"> Authorization: Bearer {bearer}\n> Accept: */*\n")
    shown = box.call("bash", command="git config --file .git/config -l; cat trace.txt").text
    assert credential not in shown and bearer not in shown, shown
    assert f"AUTHORIZATION: basic {tools.AUTH_HEADER_MASK}" in shown and "Accept: */*" in shown
    written = box.call("write", file_path="curl.txt", content=shown)
    assert written.is_error and written.meta["error"] == "masked_secret"


def test_a_password_in_a_url_is_masked_and_a_masked_secret_is_never_written_back(box):
    """The model sees neither a remote's password nor a .env value, and writing back what it saw
    (a whole .env with its values masked) is refused, so no secret is lost."""
    (box.root / ".git").mkdir()
    remote = "https://ci-bot:hunter2-remote-pw@git.example.com/team/app.git"
    header = "AUTHORIZATION: basic eC1hY2Nlc3MtdG9rZW46Z2hzX0ZBS0U="     # actions/checkout's
    (box.root / ".git" / "config").write_text(f'[remote "origin"]\n\turl = {remote}\n'
                                              f'[http "https://github.com/"]\n\textraheader = {header}\n')
    (box.root / ".env").write_text("DB_PASSWORD=s3cret-value-42\nPORT=8000\n")
    token = "ghp_" + "T0ken" * 8
    (box.root / "deploy.cfg").write_text(f"push = https://{token}@github.com/team/app.git\n")
    shown = box.call("bash", command="git config --file .git/config -l; cat .git/config deploy.cfg")
    assert "hunter2-remote-pw" not in shown.text
    assert "ci-bot:[redacted]@git.example.com" in shown.text
    assert "eC1hY2Nlc3MtdG9rZW46Z2hzX0ZBS0U=" not in shown.text and "basic [redacted" in shown.text
    assert token not in shown.text and f"https://{tools.TOKEN_MASK}@github.com" in shown.text
    seen = box.call("read", file_path=".env")
    assert "s3cret-value-42" not in seen.text and tools.DOTENV_MASK in seen.text
    lines = [line.split("\t", 1)[1] for line in seen.text.splitlines() if "\t" in line]
    written = box.call("write", file_path=".env", content="\n".join(lines + ["DEBUG=1"]) + "\n")
    assert written.is_error and written.meta["error"] == "masked_secret"
    assert (box.root / ".env").read_text() == "DB_PASSWORD=s3cret-value-42\nPORT=8000\n"
    edited = box.call("edit", file_path=".env", old_string="PORT=8000",
                      new_string=f"PORT=8000\nDB_COPY={tools.DOTENV_MASK}")
    assert edited.is_error and "s3cret-value-42" in (box.root / ".env").read_text()
    added = box.call("edit", file_path=".env", old_string="PORT=8000",
                     new_string="PORT=8000\nDEBUG=1")
    assert not added.is_error
    assert (box.root / ".env").read_text() == "DB_PASSWORD=s3cret-value-42\nPORT=8000\nDEBUG=1\n"


def test_a_card_names_its_call_in_bounded_text():
    assert tools.card_of("grep", {"pattern": "TODO", "path": "src"}) == {
        "summary": "TODO in src", "output": "head"}
    assert tools.card_of("read", {"file_path": "a.py"})["output"] == "none"
    huge = tools.card_of("bash", {"command": "echo " + "x" * 300_000})
    assert len(huge["summary"]) == tools.CARD_SUMMARY_CHARS and huge["output"] == "tail"
    assert tools.permission_preview("write", {"content": "y" * 9000}) == "y" * tools.PREVIEW_CHARS
    assert tools.permission_preview("edit", {"old_string": "a", "new_string": "b"}) == "- a\n+ b"


def test_no_process_survives_khaelor_exiting_on_an_error(tmp_path):
    script = f"""
import asyncio, sys
from pathlib import Path
sys.path.insert(0, {str(Path(tools.__file__).parent)!r})
import tools
async def main():
    box = tools.Toolbox(tools.Workspace(Path({str(tmp_path)!r})), Path({str(tmp_path / 'home')!r}),
                        lambda *a, **k: {{}}, tools.events.State)
    await box.run("process", {{"action": "start", "command": "sleep 60 & sleep 60"}}, "t1")
    await box.run("bash", {{"command": "true"}}, "t2")
    print(box.running_processes()[0]["pid"], flush=True)
    raise RuntimeError("khaelor crashed")
asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=20)
    assert "khaelor crashed" in done.stderr
    pgid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 3

    def group_left() -> str:
        return subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout

    while group_left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_left().strip()


# ---------------------------------------------------------------- issue 13: edit, signals, umask

def test_a_crlf_edit_of_an_lf_file_leaves_no_crlf_inside_it(box):
    (box.root / "lf.py").write_bytes(b"def f():\n    return 1\n\nx = 2\n")
    box.call("read", file_path="lf.py")
    result = box.call("edit", file_path="lf.py", old_string="def f():\r\n    return 1\r\n",
                      new_string="def f():\r\n    return 10\r\n")
    assert not result.is_error, result.text
    assert (box.root / "lf.py").read_bytes() == b"def f():\n    return 10\n\nx = 2\n"


def test_an_edit_of_a_mostly_crlf_file_leaves_its_lf_lines_alone(box):
    """A CRLF file with a few LF lines (one a tool appended) was written back all CRLF: a one-line
    edit silently changed the ending of every LF line elsewhere in the file."""
    (box.root / "mixed.txt").write_bytes(b"a\r\nb\nc\r\nd\n")
    box.call("read", file_path="mixed.txt")
    result = box.call("edit", file_path="mixed.txt", old_string="c", new_string="C")
    assert not result.is_error, result.text
    assert (box.root / "mixed.txt").read_bytes() == b"a\r\nb\nC\r\nd\n"


def test_a_fuzzy_match_does_not_indent_an_already_indented_new_string_twice(box):
    (box.root / "ind.py").write_text("class A:\n    def f(self):\n        return 1\n")
    box.call("read", file_path="ind.py")
    result = box.call("edit", file_path="ind.py", old_string="def f(self):\n    return 1",
                      new_string="    def f(self):\n        return 2")
    assert not result.is_error, result.text
    assert (box.root / "ind.py").read_text() == "class A:\n    def f(self):\n        return 2\n"
    # new_string at old_string's indentation is still moved to the file's
    result = box.call("edit", file_path="ind.py", old_string="def f(self):\n    return 2",
                      new_string="def f(self):\n    return 3")
    assert (box.root / "ind.py").read_text() == "class A:\n    def f(self):\n        return 3\n"


def test_diff_counts_lines_that_begin_with_plus_plus_or_minus_minus():
    before = "a\n-- old comment\n++counter;\nz\n"
    after = "a\n--- new rule\n+++ added\nz\n"
    added, removed, diff = tools._diff("f.sql", before, after)
    assert (added, removed) == (2, 2), diff
    assert "+--- new rule\n" in diff and "-++counter;\n" in diff


def test_a_command_killed_by_a_real_time_signal_keeps_its_result(box):
    result = box.call("bash", command="echo before; kill -s RTMIN+3 $$")
    assert "before" in result.text
    assert "killed by SIGRTMIN+3" in result.text, result.text


def test_writing_a_new_file_never_sets_the_umask(box):
    """Reading the umask by setting it opens a window where any other thread (a git capture in
    a worker) creates world-writable files. New files get the umask's mode without asking it."""
    import sys
    calls = []

    def watch(frame, event, arg):
        if event == "c_call" and arg is os.umask:
            calls.append(arg)
    old = os.umask(0o027)
    sys.setprofile(watch)
    try:
        box.toolbox.workspace.write_file(box.root / "new.txt", b"x", [str(box.root)])
        box.toolbox.workspace.write_file(box.root / "new.txt", b"y", [str(box.root)])  # mode kept
    finally:
        sys.setprofile(None)
        os.umask(old)
    assert calls == []
    assert (box.root / "new.txt").stat().st_mode & 0o777 == 0o640
    assert (box.root / "new.txt").read_bytes() == b"y"


# ---------------------------------------------------------------- races: tools open what was judged

# A background process (the model can start one) swaps project/d, a real folder, with a link to a
# folder outside the project, as fast as it can, until it is killed (renameat2 RENAME_EXCHANGE: d is
# always there, as one or the other).
SWAPPER = """
import ctypes, os, sys
os.chdir(sys.argv[1])
os.symlink(sys.argv[2], "d.link")
libc = ctypes.CDLL(None, use_errno=True)
while libc.renameat2(-100, b"d", -100, b"d.link", 2) == 0:
    pass
"""


def swapping(root: Path, outside: Path) -> subprocess.Popen:
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root), str(outside)])
    deadline = time.monotonic() + 10
    while not (root / "d").is_symlink() and time.monotonic() < deadline:
        pass
    return swapper


def racing(call) -> list:
    """Results of `call()` repeated until 3 of them lost the race after the check (the open met the
    link swapped in), or 20 s: on a loaded machine the swapper may seldom run between the two."""
    results = []
    n_raced = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and n_raced < 3:
        results.append(call())
        n_raced += results[-1].meta.get("error") == "raced"
    return results


def test_a_link_swapped_in_never_redirects_a_read(box, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("SECRET-MARKER\n")
    (box.root / "d").mkdir()
    (box.root / "d" / "f.txt").write_text("public\n")
    swapper = swapping(box.root, outside)
    try:
        # The race is real here: a plain open by path does get the secret.
        naive = []
        for _ in range(2000):
            naive.append((box.root / "d" / "f.txt").read_text())
        results = racing(lambda: box.call("read", file_path="d/f.txt"))
    finally:
        swapper.kill()
        swapper.wait()
    assert "SECRET-MARKER\n" in naive and "public\n" in naive
    assert not any("SECRET-MARKER" in result.text for result in results)
    errors = collections.Counter(result.meta.get("error") for result in results)
    # Some calls lost the race after the check: the open refused the link instead of following it.
    assert errors["raced"] >= 1 and set(errors) <= {"raced", "outside", None}


def test_a_link_swapped_in_never_redirects_a_write(box, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("ORIGINAL\n")
    (box.root / "d").mkdir()
    swapper = swapping(box.root, outside)
    try:
        names = iter(range(10**6))
        results = racing(lambda: box.call("write", file_path=f"d/{next(names)}.txt", content="x\n"))
    finally:
        swapper.kill()
        swapper.wait()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert (outside / "keep.txt").read_text() == "ORIGINAL\n"
    errors = collections.Counter(result.meta.get("error") for result in results)
    assert errors["raced"] >= 1 and set(errors) <= {"raced", "outside", None}


def test_a_link_swapped_in_never_carries_the_python_search_out_of_the_project(box, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "SECRET-NAME.txt").write_text("MARK secret\n")
    (box.root / "d").mkdir()
    (box.root / "d" / "public.txt").write_text("MARK public\n")
    # Files the walk looks at before it enters d: a wider window for the swap.
    for n in range(300):
        (box.root / f"f{n}.dat").write_text("")
    box.toolbox.ripgrep = None
    swapper = swapping(box.root, outside)
    try:
        results = []
        for _ in range(15):
            results += [box.call("glob", pattern="*.txt"), box.call("grep", pattern="MARK")]
    finally:
        swapper.kill()
        swapper.wait()
    assert not any("SECRET" in result.text or "secret" in result.text for result in results)
    assert any("d/public.txt" in result.text for result in results)


def test_a_link_out_of_the_project_opens_only_where_the_decision_named_its_target(box, tmp_path):
    outside = tmp_path / "notes.txt"
    outside.write_text("outside notes\n")
    (box.root / "notes.txt").symlink_to(outside)
    refused = box.call("read", file_path="notes.txt")
    assert refused.meta["error"] == "outside" and "outside notes" not in refused.text
    assert box.call("write", file_path="notes.txt", content="x\n").is_error
    approved = sandbox.Confine(paths=(str(outside),))
    read = box.call("read", confine=approved, file_path="notes.txt")
    assert "outside notes" in read.text
    written = box.call("write", confine=approved, file_path="notes.txt", content="new\n")
    assert not written.is_error and outside.read_text() == "new\n"
    assert (box.root / "notes.txt").is_symlink()


def test_a_hard_link_in_the_project_is_never_written_through_to_the_outside_file(box, tmp_path):
    # A hard link has no "real path" to judge: the project's name for ~/.ssh/authorized_keys
    # reads as a project file. write and edit replace the name (a renamed temp file), never the
    # shared inode, so the outside file keeps its bytes.
    outside = tmp_path / "authorized_keys"
    outside.write_text("ssh-ed25519 user\n")
    os.link(outside, box.root / "keys.txt")
    box.call("read", file_path="keys.txt")
    edited = box.call("edit", file_path="keys.txt", old_string="user", new_string="attacker")
    assert not edited.is_error and (box.root / "keys.txt").read_text() == "ssh-ed25519 attacker\n"
    box.call("write", file_path="keys.txt", content="ssh-ed25519 attacker2\n")
    assert outside.read_text() == "ssh-ed25519 user\n"


def test_an_approved_outside_file_gets_its_missing_folders_made(box, tmp_path):
    target = tmp_path / "newtool" / "conf" / "config.ini"
    approved = sandbox.Confine(paths=(str(target),))
    result = box.loop.run_until_complete(
        box.toolbox.run("write", {"file_path": str(target), "content": "[x]\n"}, "tu", approved))
    assert not result.is_error and target.read_text() == "[x]\n"


def call_within(box, seconds: float, name: str, tool_input: dict, confine: sandbox.Confine | None = None):
    """The result of one call, or None if it did not finish in time (it blocked)."""
    done = []
    worker = threading.Thread(target=lambda: done.append(
        box.loop.run_until_complete(box.toolbox.run(name, tool_input, "tu", confine))), daemon=True)
    worker.start()
    worker.join(seconds)
    return done[0] if done else None


@pytest.mark.parametrize("engine", ENGINES)
def test_a_fifo_or_a_device_never_blocks_a_tool(box, engine):
    os.mkfifo(box.root / "pipe")
    (box.root / "a.txt").write_text("needle\n")
    if engine == "python":
        box.toolbox.ripgrep = None
    read = call_within(box, 5, "read", {"file_path": "pipe"})
    assert read.is_error and "FIFO" in read.text
    zero = call_within(box, 5, "read", {"file_path": "/dev/zero"}, sandbox.Confine(paths=("/dev/zero",)))
    assert zero.is_error and "character device" in zero.text
    grep = call_within(box, 10, "grep", {"pattern": "needle"})
    assert grep.text == "a.txt:1: needle"
    write = call_within(box, 5, "write", {"file_path": "pipe", "content": "x"})
    assert write.is_error and (box.root / "pipe").is_fifo()


def test_a_catastrophic_pattern_in_the_python_grep_stops_within_its_budget(box, monkeypatch):
    monkeypatch.setattr(tools, "GREP_PATTERN_BUDGET_S", 1.0)
    box.toolbox.ripgrep = None
    (box.root / "a.txt").write_text("a" * 40 + "b\n")
    started = time.monotonic()
    result = box.call("grep", pattern=r"(a+)+$")
    assert time.monotonic() - started < 3
    assert result.is_error and "took too long" in result.text
    assert box.call("grep", pattern=r"a+b").text.startswith("a.txt:1: aaaa")


def test_ripgrep_runs_read_only_in_the_sandbox(box, tmp_path):
    if not box.toolbox.sandboxed:
        pytest.skip("no Landlock here")
    fake = tmp_path / "rg"
    fake.write_text(f"#!/bin/sh\necho planted > {box.root}/planted.txt\n")
    fake.chmod(0o755)
    box.toolbox.ripgrep = str(fake)
    box.call("grep", pattern="x")
    box.call("glob", pattern="*")
    assert not (box.root / "planted.txt").exists()


@pytest.mark.parametrize("opener", [tools.sandbox.open_no_links, tools.sandbox.walk_open])
def test_opening_without_links_refuses_a_link_anywhere_on_the_path(tmp_path, opener):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("real")
    (tmp_path / "l").symlink_to("d")
    fd = opener(str(tmp_path / "d" / "f"), os.O_RDONLY)
    assert os.read(fd, 10) == b"real"
    os.close(fd)
    for path in (tmp_path / "l" / "f", tmp_path / "l"):
        with pytest.raises(OSError) as refused:
            opener(str(path), os.O_RDONLY)
        assert refused.value.errno == errno.ELOOP
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as refused:
            opener("l/f", os.O_RDONLY, dir_fd=folder)
        assert refused.value.errno == errno.ELOOP
        with pytest.raises(OSError) as refused:
            opener("../x", os.O_RDONLY, dir_fd=folder)
        assert refused.value.errno == errno.EXDEV
    finally:
        os.close(folder)


def test_a_ctrl_c_during_the_python_grep_child_reaches_khaelor_once(tmp_path):
    """The forked child must not forward the terminal's SIGINT to the parent's event loop (its
    wakeup fd): two would read as the second Ctrl-C, which exits."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.txt").write_text("a" * 40 + "b\n")
    script = f"""
import asyncio, os, signal, sys
from pathlib import Path
sys.path.insert(0, {str(Path(tools.__file__).parent)!r})
import tools
tools.GREP_PATTERN_BUDGET_S = 1.0
async def main():
    hits = []
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, lambda: hits.append(1))
    root, home = Path({str(tmp_path / 'p')!r}), Path({str(tmp_path / 'home')!r})
    box = tools.Toolbox(tools.Workspace(root), home, lambda *a, **k: {{}}, tools.events.State)
    box.ripgrep = None
    task = asyncio.create_task(box.run("grep", {{"pattern": "(a+)+$"}}, "x"))
    await asyncio.sleep(0.5)
    os.killpg(os.getpgrp(), signal.SIGINT)
    result = await task
    await asyncio.sleep(0.2)
    print(len(hits), result.meta.get("error"))
    await box.close()
asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30, start_new_session=True)
    assert done.stdout.split() == ["1", "timeout"], done.stderr


def test_grep_and_glob_leave_out_secret_files_by_the_one_vocabulary(box):
    """As the sandbox closes them: in any case (.ENV, ID_RSA) and never a template (.env.example)."""
    for name in ("src/.ENV", "deploy/ID_RSA", ".env.example", "notes.txt"):
        (box.root / name).parent.mkdir(parents=True, exist_ok=True)
        (box.root / name).write_text("MARKER here\n")
    box.toolbox.ripgrep = None
    reading = sandbox.Confine(write=False, hide=sandbox.SECRET_NAMES)    # what a read decision gives
    found = box.loop.run_until_complete(
        box.toolbox.run("grep", {"pattern": "MARKER"}, "tu-grep", confine=reading))
    assert "notes.txt:" in found.text and ".env.example:" in found.text
    assert "src/.ENV:" not in found.text and "deploy/ID_RSA:" not in found.text
    listed = box.loop.run_until_complete(
        box.toolbox.run("glob", {"pattern": "**/*"}, "tu-glob", confine=reading))
    kept = [line for line in listed.text.splitlines() if not line.startswith(("(", "["))]
    assert ".env.example" in listed.text and not any("ID_RSA" == line.rsplit("/", 1)[-1]
                                                      for line in kept)


def test_the_guard_puts_a_planted_hook_back_even_when_its_copy_cannot_be_kept(tmp_path):
    """A step that fills the disk (or a spill folder that cannot be written) must not keep the
    hook it planted: keeping the step's version failed, and the put-back was never reached."""
    project = tmp_path / "project"
    (project / ".git" / "hooks").mkdir(parents=True)
    before = tools.guard_record(project)
    hook = project / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\ntouch MARKER\n")
    spill = tmp_path / "spill"
    spill.write_text("a file where the spill folder should be")
    note = tools.guard_check(project, spill, before, "echo hi", tools.Confine(write=True))
    assert not hook.exists()
    assert "put back .git/hooks/pre-commit" in note
    assert "its version of .git/hooks/pre-commit could not be kept" in note
    spill.unlink()
    hook.write_text("#!/bin/sh\ntouch MARKER\n")
    note = tools.guard_check(project, spill, before, "echo hi", tools.Confine(write=True))
    assert f"its version is kept in {spill / 'guarded'}" in note
    [copy] = (spill / "guarded").iterdir()
    assert copy.read_text() == "#!/bin/sh\ntouch MARKER\n"


def test_a_write_that_cannot_create_its_temp_names_the_file_asked_for(box):
    """QA: on a read-only file system a write failed with "Read-only file system
    (.new.txt.7fea6ab1e9bb.tmp)": a name the model never used. A name of 250 characters (its
    temp's is over 255) fails where the temp is made, as a read-only mount does."""
    name = "n" * 250
    result = box.call("write", file_path=name, content="x\n")
    assert result.is_error and ".tmp" not in result.text and name in result.text, result.text
