"""The real program in a real terminal (tmux), driven as a user would, against the fake API process."""
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

if not shutil.which("tmux"):
    if os.environ.get("KHAELOR_CI"):
        raise RuntimeError("tmux is required for the end-to-end tests in CI (.ci/run installs it)")
    pytest.skip("tmux is not installed", allow_module_level=True)


class Terminal:
    """khaelor under tmux plus the fake API as its own process, with the requests it received."""

    def __init__(self, tmp_path, project, env, script, args="", width=100, height=30):
        self.name = f"k{uuid.uuid4().hex[:8]}"
        files = tmp_path / self.name
        files.mkdir()
        (files / "script.json").write_text(json.dumps(script))
        port_file, self.request_log = files / "port", files / "requests.jsonl"
        self.fake = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_api.py"), "--script",
                                      str(files / "script.json"), "--port-file", str(port_file),
                                      "--log", str(self.request_log)], stdout=subprocess.DEVNULL)
        wait_until(port_file.exists, "the fake API to listen")
        env = {**env, "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port_file.read_text().strip()}", "TERM": "xterm-256color"}
        exports = " ".join(f"{k}={_quote(v)}" for k, v in env.items() if k.startswith(("KHAELOR", "ANTHROPIC", "HOME", "PYTHONPATH")))
        command = f"cd {_quote(str(project))} && env {exports} {sys.executable} {ROOT / 'khaelor.py'} {args}; echo EXITED $?; sleep 60"
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height), command], check=True)
        self.wait_for("❯")

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def type(self, text: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, "-l", text], check=True)

    def wait_for(self, text: str, timeout: float = 20) -> str:
        wait_until(lambda: text in self.screen(), f"{text!r} on screen", timeout, lambda: self.screen())
        return self.screen()

    def requests(self) -> list:
        if not self.request_log.exists():
            return []
        return [json.loads(line) for line in self.request_log.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)
        self.fake.terminate()
        self.fake.wait()


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def wait_until(predicate, what, timeout=20.0, show=lambda: ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}\n{show()}")


def rejected(term) -> list:
    return [r for r in term.requests() if r["status"] >= 400]


@pytest.fixture
def terminal(tmp_path, project, env):
    made = []

    def start(script, **size):
        made.append(Terminal(tmp_path, project, env, script, **size))
        return made[-1]
    yield start
    for term in made:
        term.close()


def reply(*blocks, **options):
    return {"content": list(blocks), **options}


def text(s):
    return {"type": "text", "text": s}


def bash(command):
    return {"type": "tool_use", "name": "bash", "input": {"command": command}}


def test_a_prompt_streams_a_tool_card_and_the_answer(terminal):
    term = terminal([reply(text("Let me look.\n\n"), bash("echo visible-output")),
                     reply(text("All **done** here."))])
    term.type("look around")
    term.keys("Enter")
    screen = term.wait_for("All done here.")
    assert "look around" in screen and "● bash echo visible-output" in screen and "visible-output" in screen
    assert "claude-sonnet-5-5" in screen
    assert any(line.startswith("❯ ") for line in screen.splitlines())
    assert rejected(term) == []


def test_esc_interrupts_a_stream_and_the_next_request_is_valid(terminal):
    term = terminal([reply(text("streaming " * 300), chunk=4, delay=0.02), reply(text("second answer"))])
    term.type("write a lot")
    term.keys("Enter")
    term.wait_for("streaming streaming")
    term.keys("Escape")
    term.wait_for("nterrupted")
    term.type("now something short")
    term.keys("Enter")
    term.wait_for("second answer")
    requests = term.requests()
    assert len(requests) == 2 and rejected(term) == []
    last = requests[-1]["body"]["messages"]
    assert [m["role"] for m in last] == ["user"]    # the cut-off reply is not part of the conversation


def test_a_permission_panel_allows_once_and_denies_with_a_message(terminal, project):
    term = terminal([reply(bash("touch allowed.txt")), reply(bash("touch denied.txt")), reply(text("finished"))])
    term.type("make two files")
    term.keys("Enter")
    screen = term.wait_for("allow once")
    assert "touch allowed.txt" in screen and "always allow" in screen
    term.type("y")
    term.wait_for("touch denied.txt")
    wait_until(lambda: (project / "allowed.txt").exists(), "allowed.txt")
    term.wait_for("allow once")
    term.type("n")
    term.wait_for("Tell the model")
    term.type("use the other name")
    term.keys("Enter")
    term.wait_for("finished")
    assert not (project / "denied.txt").exists()
    results = [b for m in term.requests()[-1]["body"]["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert "use the other name" in results[-1]["content"] and results[-1]["is_error"]
    assert rejected(term) == []


def test_typing_while_a_tool_runs_steers_the_next_request(terminal, project):
    (project / ".khaelor").mkdir()
    (project / ".khaelor" / "config.json").write_text(json.dumps(
        {"permissions": [{"capability": "process.execute", "pattern": "sleep *", "action": "allow"}]}))
    term = terminal([reply(bash("sleep 4")), reply(text("steered answer"))])
    term.type("wait a bit")
    term.keys("Enter")
    term.wait_for("bash sleep 4")
    term.type("and then say hi")
    term.keys("Enter")
    term.wait_for("Queued instruction")
    term.wait_for("steered answer")
    last = term.requests()[-1]["body"]["messages"][-1]["content"]
    assert last[0]["type"] == "tool_result"
    assert any(b.get("text") == "and then say hi" for b in last)
    assert rejected(term) == []


def test_slash_commands_help_cost_and_quit(terminal):
    term = terminal([reply(text("hi there"))])
    term.type("hello")
    term.keys("Enter")
    term.wait_for("hi there")
    term.type("/help")
    term.keys("Enter")
    term.wait_for("/undo")
    term.type("/cost")
    term.keys("Enter")
    term.wait_for("cache read")
    term.type("/quit")
    term.keys("Enter")
    term.wait_for("EXITED 0")


def test_continue_shows_the_earlier_conversation_and_carries_its_history(terminal):
    first = terminal([reply(text("remember the walrus"))])
    first.type("tell me something")
    first.keys("Enter")
    first.wait_for("remember the walrus")
    first.keys("C-d")
    first.wait_for("EXITED 0")
    first.close()
    second = terminal([reply(text("the walrus again"))], args="-c")
    screen = second.wait_for("remember the walrus")
    assert "tell me something" in screen
    second.type("what was it?")
    second.keys("Enter")
    second.wait_for("the walrus again")
    sent = second.requests()[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == [{"type": "text", "text": "remember the walrus"}]
