"""Tests for tools.py: real files in tmp_path, real subprocesses, no mocks of our own code."""

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import tools  # noqa: E402


class Box:
    """A Toolbox on a temp project, with its events recorded and a synchronous `call`."""

    def __init__(self, root: Path, home: Path):
        self.root, self.events = root, []
        self.loop = asyncio.new_event_loop()
        self.toolbox = tools.Toolbox(tools.Workspace(root), home, self.record)

    def record(self, type_, **payload):
        event = {"type": type_, **payload}
        self.events.append(event)
        return event

    def call(self, name, **tool_input) -> tools.ToolResult:
        return self.loop.run_until_complete(self.toolbox.run(name, tool_input, f"tu{len(self.events)}"))

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
    box = tools.Toolbox(tools.Workspace(Path(".")), Path("/tmp"), lambda *a, **k: {})
    names = [s["name"] for s in box.schemas]
    assert names == ["read", "write", "edit", "grep", "glob", "bash", "process"]
    params = {s["name"]: sorted(s["input_schema"]["properties"]) for s in box.schemas}
    assert params == {
        "read": ["file_path", "limit", "offset"], "write": ["content", "file_path"],
        "edit": ["file_path", "new_string", "old_string", "replace_all"], "grep": ["include", "path", "pattern"],
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
])
def test_malformed_input_explains_how_to_repair_the_call(box, name, tool_input, expected):
    result = box.call(name, **tool_input)
    assert result.is_error and expected in result.text
    assert f"Call {name} again" in result.text and f"{name}(" in result.text


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
    pid = int(re.search(r"child (\d+)", result.text).group(1))
    assert wait_gone(pid), f"grandchild {pid} survived the timeout"


def test_bash_cancellation_kills_the_group(box):
    async def cancel_midway():
        task = asyncio.create_task(box.toolbox.run("bash", {"command": "sleep 30 & echo $!; wait"}, "tu"))
        while not box.of_type("ToolOutput"):
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    box.loop.run_until_complete(cancel_midway())
    pid = int(box.of_type("ToolOutput")[0]["text"].split()[0])
    assert wait_gone(pid)


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


def test_ansi_and_progress_redraws_are_cleaned(box):
    text = box.call("bash", command=r"printf '\033[31mred\033[0m\n10%%\r50%%\r100%%\ndone\n'").text
    assert text.startswith("red\n100%\ndone")


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


# ---------------------------------------------------------------- process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_process_serves_http_and_is_read_back_then_stopped(box):
    port = free_port()
    (box.root / "index.html").write_text("<h1>khaelor</h1>")
    started = box.call("process", action="start", command=f"{sys.executable} -u -m http.server {port} --bind 127.0.0.1")
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
    assert box.of_type("ProcessExited") == [{"type": "ProcessExited", "process_id": "p1", "exit_code": 4, "cause": "exited"}]
    late = box.call("process", action="write", id="p1", input="1\n")
    assert late.is_error and "exited" in late.text


def test_process_failure_modes(box):
    assert "needs 'command'" in box.call("process", action="start").text
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
        await box.toolbox.run("process", {"action": "start", "command": "sleep 60 & sleep 60"}, "t1")
        await box.toolbox.run("process", {"action": "start", "command": "trap '' TERM; sleep 60"}, "t2")
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
    group_members = subprocess.run(["pgrep", "-g", str(pids[0])], capture_output=True, text=True).stdout.split()
    assert len(group_members) >= 2
    box.close()
    for pid in pids + [int(p) for p in group_members]:
        assert wait_gone(pid), f"{pid} survived close()"
    exits = box.of_type("ProcessExited")
    assert sorted(e["process_id"] for e in exits) == ["p1", "p2"]
    assert {e["cause"] for e in exits} == {"khaelor exit"}
