"""The real program in a real terminal (tmux), driven as a user would, against the fake API."""
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import fork_server, new_session
from fake_api import FakeAnthropic

ROOT = Path(__file__).resolve().parent.parent

if not shutil.which("tmux"):
    if os.environ.get("KHAELOR_CI"):
        raise RuntimeError("tmux is required for the end-to-end tests in CI (.ci/run installs it)")
    pytest.skip("tmux is not installed", allow_module_level=True)


class Terminal:
    """khaelor under tmux, against a fake API of its own, with the requests it received."""

    def __init__(self, tmp_path, project, env, script, args="", width=100, height=30, rlimits=None):
        self.name = f"k{uuid.uuid4().hex[:8]}"
        files = tmp_path / self.name
        files.mkdir()
        self.request_log = files / "requests.jsonl"
        self.fake = FakeAnthropic(script, log_path=self.request_log)
        env = {**env, "ANTHROPIC_BASE_URL": self.fake.base_url, "TERM": "xterm-256color"}
        exports = {k: v for k, v in env.items() if k.startswith(("KHAELOR", "ANTHROPIC", "HOME", "PYTHONPATH", "SSL_CERT_FILE"))}
        # what `cd PROJECT && env EXPORTS python khaelor.py ARGS; echo EXITED $?` in the pane was,
        # with the program forked onto the pane's terminal by the fork server (tests/pane.py)
        pane = files / "pane"
        pane.mkdir()
        command = f"exec {sys.executable} {ROOT / 'tests' / 'pane.py'} {_quote(str(pane))}"
        new_session("-d", "-s", self.name, "-x", str(width), "-y", str(height), command)
        wait_until((pane / "pane.json").exists, "the pane to give up its terminal", every=0.005)
        given = json.loads((pane / "pane.json").read_text())
        env = {**given["env"], **exports, "PWD": str(project)}
        self.job, self.pid = fork_server().spawn(shlex.split(args), project, env, tty=given["tty"],
                                                 rlimits=rlimits)
        threading.Thread(target=self._tell_the_pane_the_exit, args=(pane,), daemon=True).start()
        self.wait_for("❯")

    def _tell_the_pane_the_exit(self, pane: Path) -> None:
        code = os.waitstatus_to_exitcode(fork_server().status(self.job))
        (pane / "exit.tmp").write_text(str(code if code >= 0 else 128 - code))    # as $? says it
        (pane / "exit.tmp").rename(pane / "exit")

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def type(self, text: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, "-l", text], check=True)

    def wait_for(self, text: str, timeout: float = 20) -> str:
        """The screen that showed `text` (a second look could find it changed since)."""
        seen = [""]

        def shown() -> bool:
            seen[0] = self.screen()
            return text in seen[0]
        wait_until(shown, f"{text!r} on screen", timeout, lambda: self.screen())
        return seen[0]

    def requests(self) -> list:
        if not self.request_log.exists():
            return []
        return [json.loads(line) for line in self.request_log.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)
        self.fake.stop()


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def wait_until(predicate, what, timeout=20.0, show=lambda: "", every=0.05):
    """Poll `predicate` every `every` s (a file's existence costs nothing to ask: poll it often;
    the screen costs a tmux process per look)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(every)
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


def test_esc_keeps_the_partial_reply_and_continue_continues_it(terminal):
    term = terminal([reply(text("streaming " * 300), chunk=4, delay=0.02), reply(text("second answer"))])
    term.type("write a lot")
    term.keys("Enter")
    term.wait_for("streaming streaming")
    term.keys("Escape")
    screen = term.wait_for("nterrupted")
    assert "what it wrote is kept" in screen and "streaming streaming" in screen
    term.type("continue")
    term.keys("Enter")
    term.wait_for("second answer")
    requests = term.requests()
    assert len(requests) == 2 and rejected(term) == []
    last = requests[-1]["body"]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user"]   # the cut-off reply is kept
    kept = last[1]["content"][0]["text"]
    assert kept.startswith("streaming streaming") and len(kept) < len("streaming " * 300)
    note, continued = [b["text"] for b in last[2]["content"] if b["type"] == "text"][:2]
    assert "interrupted your reply" in note and continued == "continue"


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
    # a command that runs until the test lets it end, not a fixed `sleep 4` (the tmux session's
    # end stops it if the test fails first)
    waits = "until [ -e go ]; do sleep 0.05; done"
    term = terminal([reply(bash(waits)), reply(text("steered answer"))])
    term.type("wait a bit")
    term.keys("Enter")
    term.wait_for("bash until [ -e go ]")
    term.type("and then say hi")
    term.keys("Enter")
    term.wait_for("Queued instruction")
    (project / "go").touch()
    term.wait_for("steered answer")
    last = term.requests()[-1]["body"]["messages"][-1]["content"]
    assert last[0]["type"] == "tool_result"
    assert any(b.get("text") == "and then say hi" for b in last)
    assert rejected(term) == []


def test_slash_commands_help_cost_and_quit(terminal):
    term = terminal([reply(text("hi there"))])
    screen = term.wait_for("khaelor 0.1.0 · ")                             # the welcome line (issue 22 item 16)
    assert "claude-sonnet-5-5 · " in screen and "sandbox" in screen
    term.type("hello")
    term.keys("Enter")
    term.wait_for("hi there")
    term.type("/help")
    term.keys("Enter")
    screen = term.wait_for("Instruction files read")
    assert "Ctrl-O" in screen and "!command" in screen and "none found" in screen
    term.type("/cost")
    term.keys("Enter")
    term.wait_for("cache read")
    term.type("/quit")
    term.keys("Enter")
    screen = term.wait_for("EXITED 0")
    assert "· $" in screen and "continue it with `khaelor -c`" in screen      # issue 22 item 16


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


def test_a_prompt_on_the_command_line_is_the_first_message_and_c_continues_with_one(terminal):
    """`khaelor "fix the bug"` (Claude Code's `claude "query"`) was refused as unrecognized
    arguments: the UI starts with that message sent, and `-c "…"` continues with it."""
    first = terminal([reply(text("the bug is in calc.py"))], args="'find the bug'")
    screen = first.wait_for("the bug is in calc.py")
    assert "find the bug" in screen
    assert said_last(first) == "find the bug"
    first.keys("C-d")
    first.wait_for("EXITED 0")
    first.close()
    second = terminal([reply(text("fixed it"))], args="-c 'now fix it'")
    second.wait_for("fixed it")
    sent = second.requests()[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert said_last(second) == "now fix it"
    assert rejected(second) == []
    second.close()
    # as in Claude Code, `khaelor "/help"` runs the command: it was sent to the model as text
    third = terminal([], args="-c /help")
    third.wait_for("Instruction files read")
    assert third.requests() == []


def said_last(term) -> str:
    """The user's text in the last request's last message (the environment facts left out)."""
    content = term.requests()[-1]["body"]["messages"][-1]["content"]
    return [b["text"] for b in content if not b["text"].startswith("<environment>")][0]


# ---------------------------------------------------------------- sessions, commands, crash resume (issue 7)

def tool(name, **tool_input):
    return {"type": "tool_use", "name": name, "input": tool_input}


def khaelor_pid(term) -> int:
    """The khaelor process on the tmux pane's terminal."""
    return term.pid


def git(project, *argv):
    return subprocess.run(["git", *argv], cwd=project, capture_output=True, text=True, check=True).stdout


def test_a_permission_question_left_by_a_crash_is_asked_again_on_resume(terminal, project):
    first = terminal([reply(bash("touch resumed.txt"))])
    first.type("make a file")
    first.keys("Enter")
    first.wait_for("allow once")
    pid = khaelor_pid(first)
    os.kill(pid, 9)
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), "khaelor to die")
    first.close()
    second = terminal([reply(text("made it after the crash"))], args="-c")
    screen = second.wait_for("allow once")        # asked again, without typing anything
    assert "touch resumed.txt" in screen and "make a file" in screen
    second.type("y")
    wait_until(lambda: (project / "resumed.txt").exists(), "the command to run")
    second.wait_for("made it after the crash")
    sent = second.requests()[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[2]["content"][0]["type"] == "tool_result" and not sent[2]["content"][0].get("is_error")
    assert rejected(second) == []


def test_undo_restores_the_exact_bytes_after_the_gate_gave_up(terminal, project):
    original = b"\xef\xbb\xbfa = 1\r\nb = 2"          # BOM, CRLF, no final newline
    (project / "crlf.py").write_bytes(original)
    term = terminal([reply(tool("read", file_path="crlf.py")),
                     reply(tool("edit", file_path="crlf.py", old_string="b = 2", new_string="b = 3")),
                     reply(text("edited it")), reply(text("no checks here")), reply(text("really none"))], height=40)
    term.type("change b")
    term.keys("Enter")
    term.wait_for("allow once")
    term.type("y")
    term.wait_for("really none")
    assert term.screen().count("Checking the work before answering") == 2
    assert (project / "crlf.py").read_bytes() == b"\xef\xbb\xbfa = 1\r\nb = 3"
    term.type("/undo")
    term.keys("Enter")
    term.wait_for("Rewound to before step 1")
    assert (project / "crlf.py").read_bytes() == original
    term.type("/undo")
    term.keys("Enter")
    term.wait_for("nothing to undo")
    assert rejected(term) == []


def test_diff_separates_khaelors_edits_from_changes_already_there(terminal, project):
    (project / ".git").rmdir()
    git(project, "init", "-q", "-b", "main")
    (project / "notes.txt").write_text("alpha\n")
    (project / "README.md").write_text("# demo\n")
    git(project, "add", ".")
    git(project, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init")
    (project / "README.md").write_text("# demo\nmine, not committed\n")
    term = terminal([reply(tool("read", file_path="notes.txt")),
                     reply(tool("edit", file_path="notes.txt", old_string="alpha", new_string="beta")),
                     reply(text("notes updated"))], height=40)
    term.type("update the notes")
    term.keys("Enter")
    term.wait_for("allow once")
    term.type("y")
    term.wait_for("notes updated")
    term.type("/diff")
    term.keys("Enter")
    screen = term.wait_for("Already changed when")
    mine, theirs = screen.split("Already changed when")
    assert "khaelor changed 1 file" in mine and "notes.txt" in mine and "+beta" in mine
    assert "README.md" in theirs and "README.md" not in mine.split("khaelor changed")[1]
    assert git(project, "diff", "--cached") == "" and "main" in term.screen()
    assert rejected(term) == []


def test_an_edits_question_shows_the_lines_it_will_change(terminal, project):
    """The panel showed "- alpha / + beta" alone: a replace_all's second place was not shown."""
    (project / "notes.txt").write_text("alpha one\nkeep\nalpha two\n")
    edit = tool("edit", file_path="notes.txt", old_string="alpha", new_string="beta",
                replace_all=True)
    term = terminal([reply(tool("read", file_path="notes.txt")), reply(edit),
                     reply(text("notes updated"))], height=40)
    term.type("update the notes")
    term.keys("Enter")
    rows = [" ".join(row.split()) for row in term.wait_for("allow once").splitlines()]
    assert "│ 1 − alpha one" in rows and "│ 3 − alpha two" in rows, rows
    assert "│ 1 + beta one" in rows and "│ 3 + beta two" in rows and "│ 2 keep" in rows, rows
    term.type("y")
    term.wait_for("notes updated")
    assert (project / "notes.txt").read_text() == "beta one\nkeep\nbeta two\n"


def test_rename_new_sessions_and_resume_commands(terminal, env):
    term = terminal([reply(text("walruses are large")), reply(text("otters are small"))], height=40)
    term.type("tell me about walruses")
    term.keys("Enter")
    term.wait_for("walruses are large")
    term.type("/rename Walrus facts")
    term.keys("Enter")
    screen = term.wait_for("◇ Session: Walrus facts")
    # one message (issue 22 item 14), under the line typed
    assert screen.count("Walrus facts") == 2 and "renamed to" not in screen
    assert "› /rename Walrus facts\n◇ Session: Walrus facts" in screen, screen
    first_id = sorted(Path(env["KHAELOR_HOME"]).glob("sessions/*/*.jsonl"))[0].stem
    term.type("/new")
    term.keys("Enter")
    term.wait_for("new session")
    term.type("and otters?")
    term.keys("Enter")
    term.wait_for("otters are small")
    term.type("/sessions")
    term.keys("Enter")
    screen = term.wait_for("(this one)")
    assert "and otters? · just now" in screen and "(this one)" in screen and first_id in screen
    term.type(f"/resume {first_id[:-2]}")
    term.keys("Enter")
    screen = term.wait_for("resumed")
    assert "walruses are large" in screen.split("(this one)")[-1]     # replayed, then "resumed"
    assert rejected(term) == []


def test_a_doom_loop_pauses_and_the_user_lets_it_continue(terminal):
    term = terminal([reply(bash("echo same-again")), reply(bash("echo same-again")), reply(bash("echo same-again")),
                     reply(text("loop finished"))], height=40)
    term.type("repeat yourself")
    term.keys("Enter")
    screen = term.wait_for("ontinue after 3 identical bash calls in a row")
    # in plain words: no capability name on screen (issue 22 item 11)
    assert "loop.continue" not in screen and "echo same-again" in screen
    term.type("y")
    term.wait_for("loop finished")
    sent = term.requests()[-1]["body"]["messages"]
    results = [b for m in sent for b in m["content"] if b["type"] == "tool_result"]
    assert len(results) == 3 and not any(r.get("is_error") for r in results)
    assert rejected(term) == []


# ---------------------------------------------------------------- interruptions, questions, sessions (issue 14)

def type_slowly(term, text):
    """One key per send, as a person types (tmux would otherwise deliver the word in one read)."""
    for letter in text:
        term.type(letter)
        time.sleep(0.03)


def test_typing_a_sentence_with_a_question_open_never_approves_it(terminal, project):
    term = terminal([reply(bash("touch approved.txt")), reply(text("done after the question"))])
    term.type("make a file")
    term.keys("Enter")
    term.wait_for("allow once")
    type_slowly(term, "okay, say why first")
    term.wait_for("❯ okay, say why first")
    time.sleep(0.3)
    assert not (project / "approved.txt").exists() and "allow once" in term.screen()
    term.keys("Enter")                                   # the sentence goes as steering
    term.wait_for("Queued instruction: okay, say why first")
    assert "allow once" in term.screen()                 # still asked
    term.type("y")
    wait_until(lambda: (project / "approved.txt").exists(), "the approved command to run")
    term.wait_for("done after the question")
    last = term.requests()[-1]["body"]["messages"][-1]["content"]
    assert last[0]["type"] == "tool_result" and not last[0].get("is_error")
    assert any(b.get("text") == "okay, say why first" for b in last)
    assert rejected(term) == []


def test_open_and_quit_leaves_no_session_and_continue_finds_the_conversation(terminal, env):
    sessions = Path(env["KHAELOR_HOME"]) / "sessions"
    idle = terminal([])
    idle.keys("C-d")
    idle.wait_for("EXITED 0")
    assert list(sessions.glob("*/*.jsonl")) == []
    talk = terminal([reply(text("the narwhal answer"))])
    talk.type("tell me about narwhals")
    talk.keys("Enter")
    talk.wait_for("the narwhal answer")
    talk.keys("C-d")
    talk.wait_for("EXITED 0")
    again = terminal([])                       # opened, /model changed, quit: still nothing new
    again.type("/model claude-opus-5-5")
    again.keys("Enter")
    again.wait_for("model set to")
    again.keys("C-d")
    again.wait_for("EXITED 0")
    assert len(list(sessions.glob("*/*.jsonl"))) == 1
    resumed = terminal([reply(text("more about narwhals"))], args="-c")
    screen = resumed.wait_for("the narwhal answer")
    assert "tell me about narwhals" in screen
    resumed.type("/sessions")
    resumed.keys("Enter")
    screen = resumed.wait_for("(this one)")
    assert screen.count("· just now ·") == 1


def test_model_rejects_an_unknown_id_and_compact_clears_its_status(terminal):
    term = terminal([reply(text("short answer")), reply(text('{"objective": "say hello", "current_state": "done"}'))])
    term.type("/model claude-nonsense-9")
    term.keys("Enter")
    screen = term.wait_for("unknown model")
    assert "claude-sonnet-5-5" in screen and "claude-haiku-5-5" in screen
    assert "claude-nonsense-9 ·" not in screen            # the status line kept the real model
    term.type("/compact")
    term.keys("Enter")
    term.wait_for("nothing to compact yet")
    term.type("hello")
    term.keys("Enter")
    term.wait_for("short answer")
    # the answer shows before its turn ends, and a /compact typed in between is told to wait
    term.wait_for("Ask anything")
    term.type("/compact")
    term.keys("Enter")
    term.wait_for("Context compacted: earlier turns are now a summary")
    time.sleep(0.3)
    assert "compacting" not in term.screen()
    assert term.screen().count("compacted") == 1                    # one message (issue 22 item 14)
    term.type("/cost")
    term.keys("Enter")
    screen = term.wait_for("claude-haiku-5-5: input")          # the summary call is paid for too
    assert "claude-sonnet-5-5: input" in screen
    assert len(term.requests()) == 2 and rejected(term) == []


def test_mentions_list_folders_new_files_and_quote_spaces_outside_git(terminal, project):
    (project / "src").mkdir()
    (project / "src" / "first.py").write_text("x = 1\n")
    term = terminal([])                          # the project's .git is empty: not a repository
    term.type("@fir")
    term.wait_for("src/first.py")
    term.keys("C-u")
    # (the menu of @fir shows src/ too: the next one is looked for once that one has gone)
    term.wait_for("Ask anything")
    term.type("@sr")
    wait_until(lambda: "› src/\n" in term.screen() or "  src/\n" in term.screen(), "src/ offered",
               show=term.screen)
    term.keys("C-u")
    (project / "docs").mkdir()
    (project / "docs" / "my notes.md").write_text("# notes\n")   # made while khaelor runs
    time.sleep(1.2)
    term.type("@mynot")
    term.wait_for("docs/my notes.md")
    term.keys("Tab")
    term.wait_for('❯ @"docs/my notes.md"')


def test_a_long_write_preview_says_how_many_lines_it_left_out(terminal, project):
    content = "".join(f"row {k}\n" for k in range(1, 201))
    term = terminal([reply(tool("write", file_path="rows.txt", content=content)), reply(text("written"))], height=40)
    term.type("write the rows")
    term.keys("Enter")
    screen = term.wait_for("allow once")
    assert "row 1" in screen and "row 14" in screen and "… 186 more lines" in screen
    term.type("y")
    term.wait_for("written")
    assert (project / "rows.txt").read_text() == content


def test_a_shell_command_shows_running_stops_with_esc_and_joins_the_conversation(terminal):
    term = terminal([reply(text("I see what you ran"))])
    term.type("!echo started; sleep 30")
    term.keys("Enter")
    term.wait_for("running ! echo started; sleep 30")
    term.wait_for("Esc stops the command")        # the hint comes with the next frame
    term.wait_for("started")
    term.keys("Escape")
    term.wait_for("! echo started; sleep 30 · stopped")
    term.type("!echo shell-marker-42")
    term.keys("Enter")
    term.wait_for("! echo shell-marker-42 · exit 0")
    term.type("what did I run?")
    term.keys("Enter")
    term.wait_for("I see what you ran")
    sent = term.requests()[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user"]
    texts = [b["text"] for b in sent[0]["content"] if b["type"] == "text"]
    assert "$ echo started; sleep 30\nstarted\n[stopped by the user" in texts[0]
    assert "$ echo shell-marker-42\nshell-marker-42" in texts[1]
    assert texts[2] == "what did I run?" and rejected(term) == []


def group_members(pgid: int) -> list[int]:
    """The live processes in a process group (/proc: a zombie is no member)."""
    members = []
    for entry in os.scandir("/proc"):
        with contextlib.suppress(OSError, IndexError):
            fields = Path(entry.path, "stat").read_bytes().rsplit(b")", 1)[1].split()
            if entry.name.isdigit() and int(fields[2]) == pgid and fields[0] != b"Z":
                members.append(int(entry.name))
    return members


def test_a_stopped_process_is_no_failure_and_what_a_killed_khaelor_left_stops_on_resume(terminal):
    """QA: the model's stop of a background process showed as a failed command (`✗ process stop
    p1 · exit -15`). What a kill -9 of khaelor left running (a shell's `sleep &` whose leader
    exited at once) is stopped by `khaelor -c`, which says so."""
    first = terminal([reply(tool("process", action="start", command="sleep 300")),
                      reply(tool("process", action="stop", id="p1")),
                      reply(tool("process", action="start", command="sh -c 'sleep 301 & exit'")),
                      reply(text("one left running"))], args="--yes", width=80)
    first.type("start two")
    first.keys("Enter")
    screen = first.wait_for("one left running")
    assert "● process stop p1" in screen and "✗" not in screen
    left = int(screen.split("[p2 · running · pid ")[1].split()[0])
    assert group_members(left), "the leader's child runs on in its group"
    os.kill(first.pid, 9)
    wait_until(lambda: not Path(f"/proc/{first.pid}").exists(), "khaelor to die")
    first.close()
    assert group_members(left), "a killed khaelor stops nothing"
    again = terminal([], args="-c --yes", width=80)
    again.wait_for("process p2: lost: khaelor exited while it ran; stopped on resume")
    wait_until(lambda: not group_members(left), "the group to be stopped")


def test_a_reply_that_breaks_off_is_retried_in_a_new_block(terminal):
    term = terminal([{"content": [text("First try paragraph.\n\nthen half a sentence that breaks " + "off " * 30)],
                      "drop_after_events": 9, "chunk": 12, "delay": 0.02},
                     reply(text("The retried answer, complete."))])
    term.type("answer me")
    term.keys("Enter")
    screen = term.wait_for("The retried answer, complete.")
    assert "retrying" in screen and "First try paragraph." in screen
    assert "broke off here" in screen and "half a sentence" not in screen
    sent = term.requests()[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user"] and rejected(term) == []


def test_custom_commands_show_in_the_menu_and_send_their_template(terminal, project):
    commands = project / ".claude" / "commands"
    (commands / "frontend").mkdir(parents=True)
    (commands / "fixissue.md").write_text("---\ndescription: Fix a GitHub issue\nargument-hint: [number]\n---\n"
                                          "Fix issue #$ARGUMENTS following our coding standards.\n")
    (commands / "frontend" / "component.md").write_text("Create a React component named $1.\n")
    term = terminal([reply(text("Fixed issue 123.")), reply(text("Made the Button."))])
    term.type("/fix")
    screen = term.wait_for("Fix a GitHub issue")
    assert "/fixissue" in screen and "[number] Fix a GitHub issue (project .claude/commands)" in screen
    term.type("issue 123")
    term.keys("Enter")
    term.wait_for("Fixed issue 123.")
    term.type("/frontend:component Button")
    term.keys("Enter")
    term.wait_for("Made the Button.")
    sent = [[b["text"] for b in r["body"]["messages"][-1]["content"] if b["type"] == "text"] for r in term.requests()]
    assert sent[0][0] == "Fix issue #123 following our coding standards."
    assert sent[1][0] == "Create a React component named Button."
    term.type("/help")
    term.keys("Enter")
    screen = term.wait_for("Custom commands")
    assert "/frontend:component" in screen and rejected(term) == []


def test_text_streamed_a_second_before_a_kill_is_in_the_next_request(terminal, env):
    words = " ".join(f"word{k:03d}" for k in range(400))
    first = terminal([reply(text(words), chunk=8, delay=0.03)])
    first.type("write many words")
    first.keys("Enter")
    first.wait_for("word060")
    time.sleep(1.5)                               # everything shown by now is older than a checkpoint
    shown = max(int(w[4:]) for w in first.screen().split() if w.startswith("word") and w[4:].isdigit())
    pid = khaelor_pid(first)
    os.kill(pid, 9)
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), "khaelor to die")
    first.close()
    second = terminal([reply(text("picking up from word"))], args="-c")
    screen = second.wait_for("Interrupted")
    assert "khaelor exited while the reply was streaming" in screen and "word060" in screen
    second.type("continue")
    second.keys("Enter")
    second.wait_for("picking up from word")
    sent = second.requests()[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    kept = sent[1]["content"][0]["text"]
    assert kept.startswith("word000 word001") and f"word{shown - 20:03d}" in kept
    assert "interrupted your reply" in sent[2]["content"][0]["text"] and rejected(second) == []
    log = [json.loads(line) for path in Path(env["KHAELOR_HOME"]).glob("sessions/*/*.jsonl")
           for line in path.read_text().splitlines()]
    checkpoints = [e for e in log if e["type"] == "TextCheckpoint"]
    # about four a second (a delta every 30 ms here: one in eight), not one per delta
    assert 2 <= len(checkpoints) <= shown // 4, (len(checkpoints), shown)


def test_steering_queued_before_an_esc_goes_first_with_the_next_message(terminal, project):
    (project / ".khaelor").mkdir()
    (project / ".khaelor" / "config.json").write_text(json.dumps(
        {"permissions": [{"capability": "process.execute", "pattern": "sleep *", "action": "allow"}]}))
    term = terminal([reply(bash("sleep 30")), reply(text("answered in order"))])
    term.type("wait a bit")
    term.keys("Enter")
    term.wait_for("bash sleep 30")
    term.type("use the small dataset")
    term.keys("Enter")
    term.wait_for("Queued instruction: use the small dataset")
    term.keys("Escape")
    term.wait_for("1 queued instruction will go first with your next message")
    term.type("now go on")
    term.keys("Enter")
    term.wait_for("answered in order")
    last = term.requests()[-1]["body"]["messages"][-1]["content"]
    texts = [b["text"] for b in last if b["type"] == "text" and not b["text"].startswith("<environment>")]
    assert texts[-2:] == ["use the small dataset", "now go on"] and rejected(term) == []


def test_a_denied_check_is_not_asked_for_again(terminal, project):
    (project / "app.py").write_text("x = 1\n")
    term = terminal([reply(tool("read", file_path="app.py")),
                     reply(tool("edit", file_path="app.py", old_string="x = 1", new_string="x = 2")),
                     reply(text("Changed x.")), reply(bash("python -m pytest -q")),
                     reply(text("Not tested, as you asked; x is 2.")), reply(text("should never be needed"))],
                    height=40)
    term.type("set x to 2")
    term.keys("Enter")
    term.wait_for("allow once")
    term.type("y")                                        # the edit
    term.wait_for("python -m pytest -q")
    term.wait_for("n) deny")
    term.type("n")
    term.wait_for("Tell the model")
    term.keys("Enter")                                    # denied, no message
    term.wait_for("Not tested, as you asked; x is 2.")
    time.sleep(0.5)
    assert term.screen().count("Checking the work before answering") == 1
    assert "⚠ 1 file changed" in term.screen() and len(term.requests()) == 5 and rejected(term) == []


def scrollback(term) -> list:
    return subprocess.run(["tmux", "capture-pane", "-p", "-S", "-", "-t", term.name],
                          capture_output=True, text=True).stdout.splitlines()


def test_ctrl_r_shows_a_settled_card_whole_and_leaves_the_scrollback_as_it_was(terminal):
    term = terminal([reply(bash("seq 1 60 | sed 's/^/row-/'")), reply(text("sixty rows"))], height=40)
    term.type("count")
    term.keys("Enter")
    term.wait_for("allow once")
    term.type("y")
    screen = term.wait_for("sixty rows")
    assert "… 55 lines …" in screen and "row-30" not in screen
    term.keys("C-o")                                       # settled: nothing is printed again
    time.sleep(0.3)
    assert sum("… 55 lines …" in row for row in scrollback(term)) == 1
    term.keys("C-r")
    screen = term.wait_for("q leaves")
    assert "row-30" in screen and "row-60" in screen and "❯" not in screen
    term.keys("Home")
    screen = term.wait_for("› count")
    assert "row-1" in screen
    term.type("q")
    term.wait_for("❯")
    rows = scrollback(term)
    assert not any("q leaves" in row or "row-30" in row for row in rows), "\n".join(rows)
    assert sum("… 55 lines …" in row for row in rows) == 1
    assert sum(row.startswith("❯ ") for row in rows) == 1
    term.type("/transcript")
    term.keys("Enter")
    assert "row-60" in term.wait_for("q leaves")
    term.keys("Escape")
    term.wait_for("❯")
    assert not any("q leaves" in row for row in scrollback(term))


def test_an_untrusted_project_config_is_mentioned_once_at_start_with_the_command_to_trust_it(terminal, project):
    (project / ".khaelor").mkdir()
    (project / ".khaelor" / "config.json").write_text(json.dumps(
        {"permissions": [{"capability": "*", "pattern": "*", "action": "allow"}]}))
    term = terminal([reply(text("hi"))])
    screen = " ".join(term.wait_for("khaelor trust").split())      # the notice wraps at the pane's width
    assert "would grant 1 permission" in screen and screen.count("khaelor trust") == 1


def test_thinking_streams_as_one_line_ctrl_o_opens_it_and_a_resume_shows_it_as_it_was(terminal,
                                                                                      tmp_path):
    thought = "First read the file. " + " ".join(f"step{k}" for k in range(40))
    # the thinking stalls a dozen deltas in (past step3) until the test has opened it (20 s at most)
    go = tmp_path / "go"
    term = terminal([reply({"type": "thinking", "thinking": thought}, text("Answer ready."), chunk=8,
                           stall_after_events=15, stall_seconds=20, release_file=str(go))],
                    width=80)
    term.type("think first")
    term.keys("Enter")
    screen = term.wait_for("✻ Thinking · ")
    assert sum("Thinking" in row for row in screen.splitlines()) == 1 and "step0 " not in screen
    term.keys("C-o")
    term.wait_for("ctrl+o closes")
    screen = term.wait_for("step3 ")
    assert "First read the file." in screen, "opened: the thinking so far, wrapped"
    go.touch()
    screen = term.wait_for("Answer ready.")
    rows = [row for row in screen.splitlines() if "Thinking" in row]
    assert len(rows) == 1 and rows[0].startswith("✻ Thinking · ") and "First read the file." in rows[0]
    assert "step39" not in screen, "it settles collapsed"
    assert term.requests()[0]["body"]["thinking"] == {"type": "adaptive", "display": "summarized"}
    term.wait_for("Ask anything")                   # the turn has ended
    term.keys("C-d")
    term.wait_for("EXITED 0")
    again = terminal([], args="-c", width=80)
    screen = again.wait_for("Answer ready.")
    assert [row for row in screen.splitlines() if "Thinking" in row] == rows, "replayed as it was shown live"


def shown_conversation(term) -> list[str]:
    """The scrollback and screen from the first line the user typed to the status line."""
    rows = [row.rstrip() for row in scrollback(term)]
    start = next(k for k, row in enumerate(rows) if row.startswith("› "))
    composer = max(k for k, row in enumerate(rows) if row.startswith("❯"))
    return rows[start:composer - 1]


def test_esc_mid_thinking_and_commands_mid_turn_resume_as_the_screen_showed_them(terminal,
                                                                                 project):
    """QA: Esc while the model thought left its `✻ Thinking` line on the screen and `khaelor -c`
    did not show it; a command's answer had no line saying which command it answered. Quit and
    resume: the conversation reads as it did, line for line."""
    thought = {"type": "thinking", "thinking": "Plan it carefully. " * 30}
    live = terminal([reply(thought, text("never"), chunk=4, stall_after_events=9,
                           stall_seconds=20),
                     reply(text("Let me run it.\n\n"), bash("touch made.txt"), chunk=4),
                     reply(text("Made it."), chunk=4)], width=44)
    live.type("hello")
    live.keys("Enter")
    live.wait_for("ctrl+o opens")                   # some thinking has streamed
    live.keys("Escape")
    live.wait_for("Interrupted")
    live.type("go on")
    live.keys("Enter")
    live.wait_for("allow once")
    live.type("/cost")
    live.keys("Enter")
    live.wait_for("› /cost")
    live.type("y")
    live.wait_for("Made it.")
    live.wait_for("Ask anything")
    shown = shown_conversation(live)
    assert any(row.startswith("✻ Thinking · ") for row in shown)
    assert (project / "made.txt").exists()
    assert shown[shown.index("› /cost") + 1].startswith("• claude-sonnet-5-5: input ")
    live.keys("C-d")
    live.wait_for("EXITED 0")
    again = terminal([], args="-c", width=44)
    again.wait_for("Made it.")
    assert shown_conversation(again) == shown


def test_esc_at_a_question_denies_the_call_and_ends_the_turn(terminal, project):
    term = terminal([reply(bash("touch never.txt")), reply(text("after the stop"))], width=60)
    term.type("make a file")
    term.keys("Enter")
    term.wait_for("esc) stop")
    term.keys("Escape")
    screen = term.wait_for("Interrupted")
    assert "Permission needed" not in screen and not (project / "never.txt").exists()
    time.sleep(0.5)
    assert len(term.requests()) == 1                        # the turn ended: no second request
    term.type("something else")
    term.keys("Enter")
    term.wait_for("after the stop")
    results = [b for m in term.requests()[-1]["body"]["messages"] for b in m["content"]
               if b["type"] == "tool_result"]
    assert results and results[0]["is_error"] and rejected(term) == []


def test_a_shell_command_typed_while_the_model_streams_runs_when_the_turn_ends(terminal, tmp_path):
    # the stream stalls until the command is queued (20 s at most), where a fixed 5 s stream was
    go = tmp_path / "go"
    term = terminal([reply(text("streaming " * 100), chunk=4, stall_after_events=12, stall_seconds=20,
                           release_file=str(go))], width=70)
    term.type("write a lot")
    term.keys("Enter")
    term.wait_for("streaming streaming")
    term.type("!echo queued-$((40+2))")
    term.keys("Enter")
    term.wait_for("runs when the turn ends")
    go.touch()
    screen = term.wait_for("● ! echo queued-$((40+2))")     # its output shows live before this
    assert "queued-42" in screen and "runs when the turn ends" not in screen


def test_shift_tab_enters_plan_mode_and_an_approved_plan_proceeds_accepting_edits(terminal, project):
    write = {"type": "tool_use", "name": "write", "input": {"file_path": "notes.md", "content": "hi\n"}}
    term = terminal([reply(write), reply(text("Plan: write notes.md.")), reply(write),
                     reply(text("notes written"))], width=80)
    term.keys("BTab")
    term.wait_for("accept edits")
    term.keys("BTab")
    term.wait_for("plan mode")
    term.type("plan the notes")
    term.keys("Enter")
    screen = term.wait_for("The plan is ready")
    assert "plan mode: only what reads runs" in screen and not (project / "notes.md").exists()
    words = " ".join(screen.replace("│", "").split())
    assert "yes, and accept edits" in words and "no, keep planning" in words
    term.type("y")
    screen = term.wait_for("notes written")
    assert (project / "notes.md").read_text() == "hi\n" and "accept edits" in screen
    bodies = [r["body"] for r in term.requests()]
    # each request's newest environment facts: the turn's, recorded with its first request
    facts = [[b["text"] for m in body["messages"] for b in m["content"]
              if b.get("type") == "text" and b["text"].startswith("<environment>")][-1]
             for body in bodies]
    assert "Plan mode" in facts[0] and "Plan mode" in facts[1] and "Plan mode" not in facts[2]
    assert bodies[0]["system"] == bodies[2]["system"]        # the cached tiers never changed
    assert rejected(term) == []


def conversation(term) -> list[str]:
    """The scrollback and screen from the first user message to the newest Interrupted line."""
    rows = subprocess.run(["tmux", "capture-pane", "-p", "-S", "-", "-t", term.name],
                          capture_output=True, text=True).stdout.splitlines()
    start = next(k for k, row in enumerate(rows) if row.startswith("› first"))
    end = max(k for k, row in enumerate(rows) if "Interrupted" in row)
    return [row.rstrip() for row in rows[start:end + 1]]


@pytest.mark.parametrize("width", [60, 100])
def test_a_resumed_session_shows_what_the_live_one_showed(terminal, project, env, width):
    table = "".join(f"## Part {k}\n\n| key | value |\n|---|---:|\n| k{k} | {k * 7} |\n\nText {k}.\n\n"
                    for k in range(8))
    write = {"type": "tool_use", "name": "write", "input": {"file_path": "b.txt", "content": "b\n"}}
    script = [reply({"type": "thinking", "thinking": "Plan the table."}, text(table),
                    bash("touch a.txt"), chunk=6, delay=0.01),
              reply(write, bash("touch c.txt")), reply(text("done **one**")),
              reply(text("streaming " * 400), chunk=5, delay=0.02)]
    live = terminal(script, width=width, height=20)
    live.type("first")
    live.keys("Enter")
    live.wait_for("allow once")
    live.type("y")
    live.wait_for("touch c.txt")
    live.wait_for("allow once")
    live.type("n")
    live.wait_for("Tell the model")
    live.type("skip it")
    live.keys("Enter")
    live.wait_for("touch c.txt · waiting")
    live.type("y")
    live.wait_for("done one")
    live.wait_for("Ask anything")
    live.type("!echo shell-ran")
    live.keys("Enter")
    live.wait_for("shell-ran")
    before = text_checkpoints(env)
    live.type("second")
    live.keys("Enter")
    live.wait_for("streaming streaming streaming")
    wait_until(lambda: text_checkpoints(env) > before, "a text checkpoint")   # the Esc comes past one
    live.keys("Escape")
    live.wait_for("Interrupted")
    shown_live = conversation(live)
    text_live = "\n".join(shown_live)
    for seen in ("Thinking", "k7  │    49", "● bash touch a.txt", "Denied: b.txt · told the model: skip it",
                 "done one", "● ! echo shell-ran", "› second", "streaming streaming"):
        assert seen in text_live, seen
    live.keys("C-d")
    live.wait_for("EXITED 0")
    again = terminal([], args="-c", width=width, height=20)
    again.wait_for("Interrupted")
    assert conversation(again) == shown_live


def test_commands_that_answer_with_a_line_of_their_own_show_what_was_typed_after_a_resume(
        terminal, project, env):
    """QA: `/rename`, `/model` and `/effort` answer with a ◇ line and no text; the line typed
    (`› /rename my title`) shows above it, in the real program and after `khaelor -c`, in the
    same place."""
    live = terminal([reply(text("First reply."))], width=60, height=20)
    live.type("first")
    live.keys("Enter")
    live.wait_for("First reply.")
    for line, note in (("/rename my title", "Session: my title"),
                       ("/model haiku", "Model: claude-haiku"), ("/effort low", "effort low from")):
        live.wait_for("Ask anything")
        live.type(line)
        live.keys("Enter")
        live.wait_for(note)
    live.wait_for("Ask anything")
    rows = [row.rstrip() for row in scrollback(live)]
    shown = rows[rows.index("› first"):rows.index("◇ effort low from the next message") + 1]
    for line in ("/rename my title", "/model haiku", "/effort low"):
        assert shown[shown.index("› " + line) + 1].startswith("◇ "), shown
    live.keys("C-d")
    live.wait_for("EXITED 0")
    again = terminal([], args="-c", width=60, height=20)
    again.wait_for("effort low from")
    rows = [row.rstrip() for row in scrollback(again)]
    assert rows[rows.index("› first"):rows.index("◇ effort low from the next message") + 1] == shown


def text_checkpoints(env) -> int:
    """The session logs' TextCheckpoints (streamed text saved before its block ends)."""
    return sum(path.read_text().count('"type":"TextCheckpoint"')
               for path in Path(env["KHAELOR_HOME"]).glob("sessions/*/*.jsonl"))


def test_ctrl_l_and_redraws_leave_no_copy_of_the_status_line_or_composer_in_the_scrollback(terminal):
    term = terminal([reply(text("an answer"))], width=70, height=15)
    term.type("hello")
    term.keys("Enter")
    term.wait_for("an answer")
    term.wait_for("Ask anything")
    for letter in "abc":
        term.keys("C-l")
        time.sleep(0.3)
        term.type(letter)                                   # a redraw after the clear
        time.sleep(0.3)
    term.wait_for("❯ abc")
    rows = subprocess.run(["tmux", "capture-pane", "-p", "-S", "-", "-t", term.name],
                          capture_output=True, text=True).stdout.splitlines()
    assert sum(row.startswith("❯ ") for row in rows) == 1, "\n".join(rows)
    # the status line once (the welcome line names the model too, with the sandbox state)
    assert sum("claude-sonnet-5-5" in row and "sandboxed" not in row for row in rows) == 1
    assert sum("an answer" in row for row in rows) == 1


@pytest.mark.parametrize("clear_first", [False, True])
def test_resizes_idle_and_with_a_panel_open_leave_no_copies_in_the_scrollback(terminal,
                                                                             clear_first):
    answer = "\n\n".join(f"paragraph {k}" for k in range(12))
    term = terminal([reply(text(answer)), reply(bash("touch x.txt")), reply(text("done"))],
                    width=90, height=20)
    term.type("hello")
    term.keys("Enter")
    term.wait_for("paragraph 11")
    if clear_first:                                             # the live region at the top
        term.keys("C-l")
        time.sleep(0.3)
    for width in (60, 90, 45, 100):                             # idle
        subprocess.run(["tmux", "resize-window", "-t", term.name, "-x", str(width)], check=True)
        time.sleep(0.3)
    term.type("make a file")
    term.keys("Enter")
    term.wait_for("allow once")
    for width in (70, 100, 40, 90):                             # a panel open
        subprocess.run(["tmux", "resize-window", "-t", term.name, "-x", str(width)], check=True)
        time.sleep(0.3)
    term.wait_for("allow once")
    rows = scrollback(term)
    shown = "\n".join(rows)
    assert sum(row.startswith("❯ ") for row in rows) == 1, shown
    assert sum("allow once" in row for row in rows) == 1, shown
    assert sum("Run `touch x.txt`" in row for row in rows) == 1, shown
    assert sum("waiting for your answer" in row for row in rows) == 1, shown
    assert sum("paragraph 11" in row for row in rows) == 1, shown


def test_a_pasted_200_lines_shows_as_200_lines_and_sends_them_all(terminal):
    term = terminal([reply(text("got it"))])
    pasted = "\n".join(f"pasted row {k}" for k in range(1, 201))
    subprocess.run(["tmux", "set-buffer", "-b", term.name, pasted], check=True)
    subprocess.run(["tmux", "paste-buffer", "-p", "-d", "-b", term.name, "-t", term.name],
                   check=True)
    term.wait_for("[Pasted 200 lines]")
    term.keys("Enter")
    term.wait_for("got it")
    sent = term.requests()[-1]["body"]["messages"][-1]["content"]
    sent = sent if isinstance(sent, str) else "".join(b.get("text", "") for b in sent)
    assert "pasted row 1\n" in sent and sent.count("pasted row") == 200 and "pasted row 200" in sent


def test_the_program_owns_the_panes_terminal_as_a_shell_would_give_it(terminal):
    """The plumbing (tests/pane.py): the khaelor forked onto the pane leads its own session, whose
    controlling terminal is the pane's, and is the terminal's foreground process group."""
    term = terminal([])
    fields = Path(f"/proc/{term.pid}/stat").read_text().rsplit(")", 1)[1].split()
    session, tty_nr, foreground = int(fields[3]), int(fields[4]), int(fields[5])
    pane_tty = subprocess.run(["tmux", "display-message", "-p", "-t", term.name, "#{pane_tty}"],
                              capture_output=True, text=True, check=True).stdout.strip()
    assert session == foreground == term.pid and tty_nr == os.stat(pane_tty).st_rdev
    term.keys("C-d")
    term.wait_for("EXITED 0")



@pytest.mark.parametrize("panel", [False, True])
def test_a_narrow_then_wide_then_narrower_resize_leaves_no_copies(tmp_path, env, panel):
    """QA (issue 22 item 15): 60 → 30 → 120 → 45 columns, idle or with a panel open, left a copy
    of the status line (idle) or of the card line and the panel's question in the scrollback.
    A short project path, as a user's is: the welcome line's wrapping is part of the sequence."""
    short = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))
    (short / "project" / ".git").mkdir(parents=True)
    script = [reply(text("I will make it.\n\n"), bash("touch e1.txt && echo made")),
              reply(text("done"))]
    term = Terminal(tmp_path, short / "project", env, script, width=60, height=30)
    try:
        if panel:
            term.type("make e1")
            term.keys("Enter")
            term.wait_for("esc) stop")
        for width in (30, 120, 45):
            subprocess.run(["tmux", "resize-window", "-t", term.name, "-x", str(width)], check=True)
            time.sleep(1)
        term.wait_for("❯")
        rows = scrollback(term)
    finally:
        term.close()
        shutil.rmtree(short, ignore_errors=True)
    shown = "\n".join(rows)
    assert sum(row.startswith("❯ ") for row in rows) == 1, shown
    if panel:
        assert sum("Run `touch e1.txt" in row for row in rows) == 1, shown
        assert sum("○ bash touch e1.txt" in row for row in rows) == 1, shown
    else:
        assert sum("$0.0" in row for row in rows) == 1, shown          # the status line once


@pytest.mark.parametrize("command", ["/effort high", "/thinking adaptive"])
def test_effort_and_thinking_confirm_once_as_model_and_rename_do(terminal, command):
    """QA (issue 22 item 14, one message per event): after the first message, `/effort high` said
    "◇ effort high from the next message" and then "effort set to high, from your next message
    (…)": two confirmations of one change (/model and /rename say theirs once)."""
    term = terminal([reply(text("first answer"))], width=100)
    term.type("hello")
    term.keys("Enter")
    term.wait_for("first answer")
    term.wait_for("Ask anything")
    term.type(command)
    term.keys("Enter")
    term.wait_for("next message")
    time.sleep(1)
    rows = [row for row in scrollback(term) if "next message" in row]
    assert len(rows) == 1, "\n".join(rows)


def test_khaelor_sandbox_under_head_exits_141_for_a_command_killed_by_sigpipe(project, env):
    """QA (issue 22 item 2: any exit code is in the README): `khaelor sandbox -- seq 1 1000000 |
    head -1` exited 243 (its child's -13 given to sys.exit), not 141 (128 + SIGPIPE)."""
    from conftest import khaelor_popen
    with khaelor_popen(["sandbox", "--", "seq", "1", "1000000"], project, env,
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL) as process:
        assert process.stdout.readline() == b"1\n"
        process.stdout.close()                              # what `| head -1` does
        code = process.wait(timeout=30)
    assert code == 141


def test_a_rewind_of_one_file_says_1_file_deleted(terminal, project):
    """QA (issue 22 item 16, counts: '1 file', never '1 files'): /rewind said "Rewound to before
    step 1: 1 files restored."; then "1 file restored" of a file it deleted."""
    term = terminal([reply(bash("touch planned.txt")), reply(text("created"))], width=100)
    term.type("make it")
    term.keys("Enter")
    term.wait_for("allow once")
    term.type("y")
    term.wait_for("created")
    term.wait_for("Ask anything")
    term.type("/rewind 1")
    term.keys("Enter")
    screen = " ".join(term.wait_for("Rewound to before step 1").split())
    assert not (project / "planned.txt").exists()
    assert "(1 file): 1 deleted" in screen and "1 files" not in screen, screen


def test_a_rewind_lists_each_change_on_its_own_line_with_names_as_written(terminal, project):
    """QA: /rewind's plan ran together as markdown ("write back app.py delete out.txt") and lost
    the underscores of __init__.py to emphasis; a resumed session did not show the rewind."""
    command = "touch __init__.py planned_*_x.txt"
    term = terminal([reply(bash(command)), reply(text("created"))], width=100)
    term.type("make it")
    term.keys("Enter")
    term.wait_for("allow once")
    term.type("y")
    term.wait_for("created")
    term.wait_for("Ask anything")
    term.type("/rewind 1")
    term.keys("Enter")
    screen = term.wait_for("Rewound to before step 1")
    rows = [row.strip() for row in screen.splitlines()]
    assert f"Rewinding to before step 1 (bash {command}):" in rows, screen
    assert "• delete __init__.py" in rows and "• delete planned_*_x.txt" in rows, screen
    assert rows.count("◇ Rewound the work tree to before step 1") == 1, screen
    term.keys("C-d")
    term.wait_for("EXITED 0")
    again = terminal([], args="-c", width=100)
    replayed = again.wait_for("◇ Rewound the work tree to before step 1")
    assert "created" in replayed, "the replay shows that the step was undone after it"


def test_resizing_while_the_transcript_is_open_loses_nothing_from_the_scrollback(terminal):
    """QA (issue 22 item 15): Ctrl-R, the pane narrowed to 40 and widened back to 80, then q: the
    reply's last line ("final words here") was erased from the screen and the scrollback (the
    same resizes without the transcript keep it)."""
    term = terminal([reply(text("para one\n\nfinal words here"))], width=80, height=30)
    term.type("hi")
    term.keys("Enter")
    term.wait_for("final words here")
    term.wait_for("Ask anything")
    for widths in ((40, 80), (50,)):
        # and QA: closed at another width, the main screen is reflowed to it as the view closes
        # (tmux), so the live region's rows had moved: a copy of the status line stayed behind
        term.keys("C-r")
        term.wait_for("q leaves")
        for width in widths:
            subprocess.run(["tmux", "resize-window", "-t", term.name, "-x", str(width)], check=True)
            time.sleep(0.8)
        term.type("q")
        term.wait_for("Ask anything")
        time.sleep(0.5)
        rows = scrollback(term)
        shown = "\n".join(rows)
        assert sum("para one" in row for row in rows) == 1, shown
        assert sum("final words here" in row for row in rows) == 1, shown
        assert sum(row.startswith("❯ ") for row in rows) == 1, shown
        assert sum(" · ctx " in row for row in rows) == 1, shown


def test_slash_resume_replays_the_session_as_it_was_shown(terminal, env):
    """QA (issue 22 item 1: "after -c, -r or /resume … the replayed scrollback equals the live
    one"): /resume printed "resumed `ID`: title" and a quoted recap of the text ("│ **you:** …
    **khaelor:** …"), without the tool card or the reply as the live session showed them."""
    term = terminal([reply(text("Let me look.\n\n"), bash("echo visible-output")),
                     reply(text("All done here."))], width=100, height=40)
    term.type("look around")
    term.keys("Enter")
    term.wait_for("All done here.")
    first_id = sorted(Path(env["KHAELOR_HOME"]).glob("sessions/*/*.jsonl"))[0].stem
    term.type("/new")
    term.keys("Enter")
    term.wait_for("new session")
    term.type(f"/resume {first_id}")
    term.keys("Enter")
    term.wait_for("resumed")

    def replayed():
        after = "\n".join(scrollback(term)).split("new session")[-1]
        return "● bash echo visible-output" in after and "› look around" in after
    wait_until(replayed, "the replay", show=lambda: "\n".join(scrollback(term)))


def test_start_notices_show_once_the_first_frame_is_up(terminal, project):
    """The trust notice is read after the first paint (it imports the trust model), and shown."""
    (project / ".khaelor").mkdir(exist_ok=True)
    rule = {"capability": "process.execute", "pattern": "make *", "action": "allow"}
    (project / ".khaelor" / "config.json").write_text(json.dumps({"permissions": [rule]}))
    term = terminal([reply(text("x"))], width=100)
    words = lambda: " ".join(term.screen().split())
    wait_until(lambda: "would grant 1 permission" in words(), "the trust notice", show=term.screen)
    assert "trust them with khaelor trust" in words() and words().count("would grant") == 1


def test_closing_the_terminal_ends_with_129_and_no_crash_report(terminal, tmp_path, env):
    """QA: tmux kill-session (the terminal gone, then SIGHUP) left crash.log behind: restoring the
    terminal's mode, then the farewell line, failed with EIO on a terminal that no longer exists."""
    term = terminal([reply(text("Hello there."))])
    term.type("hi")
    term.keys("Enter")
    term.wait_for("Hello there.")
    subprocess.run(["tmux", "kill-session", "-t", term.name], check=True)
    exit_file = tmp_path / term.name / "pane" / "exit"
    wait_until(exit_file.exists, "khaelor to exit")
    crash_log = Path(env["KHAELOR_HOME"]) / "crash.log"
    assert not crash_log.exists(), crash_log.read_text()
    assert exit_file.read_text() == "129"


def test_processes_stop_shows_the_output_line_by_line(terminal):
    """QA: `/processes stop p1` showed the process's last output as one paragraph (`… done
    tick tick tick`): the answer is Markdown, whose single newlines join lines."""
    ticks = "sleep 1; echo tick1; echo tick2; echo tick3; sleep 300"
    term = terminal([reply(tool("process", action="start", command=ticks)),
                     reply(text("started"))], width=80)
    term.type("start it")
    term.keys("Enter")
    term.wait_for("started")
    time.sleep(1.5)
    term.type("/processes stop p1")
    term.keys("Enter")
    answer = term.wait_for("[p1 · stopped").split("process p1: stopped")[1]
    lines = [line.strip() for line in answer.splitlines()]
    assert "tick1" in lines and "tick2" in lines and "tick3" in lines, answer


def test_processes_stop_shows_the_newest_lines_not_the_whole_buffer(terminal):
    """QA: `/processes stop` of a chatty server put its whole buffer, 1,300 lines, in the
    scrollback; a card shows a preview. The report keeps its header and newest 20 lines."""
    chatty = "sleep 1; seq 1 500; sleep 300"
    term = terminal([reply(tool("process", action="start", command=chatty)),
                     reply(text("started"))], args="--yes", width=80)
    term.type("start it")
    term.keys("Enter")
    term.wait_for("started")
    time.sleep(1.5)
    term.type("/processes stop p1")
    term.keys("Enter")
    term.wait_for("[p1 · stopped")
    shown = [line.strip() for line in scrollback(term)]
    report = shown[shown.index("› /processes stop p1"):]
    assert "500" in report and sum(line.isdigit() for line in report) == 20, report


def test_a_commands_picker_opens_on_the_value_in_use(terminal):
    """QA: `/model`, Enter (the picker opens), Enter switched a sonnet session to opus, the
    picker's first entry; `/thinking` twice so turned thinking off. It opens on what is in use."""
    term = terminal([reply(text("first answer"))], width=100)
    term.type("hello")
    term.keys("Enter")
    term.wait_for("first answer")
    for command in ("/model", "/thinking"):
        term.type(command)
        term.keys("Enter")
        term.wait_for(f"  {command} ")
        term.keys("Enter")
        term.wait_for("Ask anything")
    time.sleep(0.5)
    screen = term.screen()
    assert "claude-sonnet-5-5 ·" in screen and "opus" not in screen, screen
    assert "thinking off" not in screen, screen


def test_a_failure_the_full_log_cannot_record_is_said_whole(terminal):
    """QA: once the disk was too full for even TaskFailed, the turn's error went to the status
    line, cut at the terminal's width ("· error: …/20261207-….jsonl: cannot a…"): the reason and
    what to do (`khaelor -c` continues it) were never readable; below the error the status line
    said "· writing · 10s" on, the turn long gone."""
    term = terminal([reply(text("a long answer " * 400))], width=100,
                    rlimits={"RLIMIT_FSIZE": 2000})
    term.type("first")
    term.keys("Enter")
    screen = term.wait_for("continues it")
    assert "cannot append to the session log (File too large)" in " ".join(screen.split())
    time.sleep(0.5)
    assert "writing" not in term.screen(), "nothing is being written: the turn has ended"


def test_keep_planning_after_shift_tab_left_plan_mode_says_the_mode_it_is_in(terminal):
    """QA: Shift-Tab twice while "The plan is ready" was open (plan → default → accept edits),
    then `n`: "Still in plan mode", while the status line said accept edits, which the next
    message ran in: edits without a question, where the user was told only reads would run."""
    term = terminal([reply(text("Plan: write notes.md."))], width=100)
    term.keys("BTab")
    term.wait_for("accept edits")
    term.keys("BTab")
    term.wait_for("plan mode")
    term.type("plan the notes")
    term.keys("Enter")
    term.wait_for("The plan is ready")
    term.keys("BTab")
    term.keys("BTab")
    term.wait_for("accept edits")
    term.type("n")
    screen = term.wait_for("Ask anything")
    assert "Still in plan mode" not in screen and "accept edits" in screen, screen


def test_while_a_denial_is_explained_the_composer_does_not_say_typing_writes_a_message(terminal):
    """QA: after `n`, the words typed go into the panel ("Tell the model what to do instead"),
    while the composer below said "a key or ↑↓ Enter answers · typing writes a message"."""
    term = terminal([reply(bash("touch no.txt")), reply(text("ok"))], width=100)
    term.type("go")
    term.keys("Enter")
    term.wait_for("allow once")
    term.type("n")
    screen = term.wait_for("Tell the model")
    assert "typing writes a message" not in screen, screen


def test_an_interruption_after_a_write_does_not_say_nothing_was_written(terminal, project):
    """QA: a write approved, then Esc at the next question: "■ Interrupted · it had written
    nothing yet", with notes.md just written: it meant the reply's text, none yet."""
    write = tool("write", file_path="notes.md", content="hi\n")
    term = terminal([reply(write), reply(bash("touch two.txt"))], width=100)
    term.type("go")
    term.keys("Enter")
    term.wait_for("Write notes.md?")
    term.type("y")
    term.wait_for("touch two.txt")
    term.keys("Escape")
    screen = term.wait_for("Interrupted")
    assert (project / "notes.md").exists() and "written nothing" not in screen, screen


def test_a_denied_multi_line_command_is_not_shown_as_one_joined_line(terminal):
    """QA: a denied `make\\nrm -rf build` settled as `✗ Denied: make rm -rf build`: its lines
    joined read as another command. It shows its first line, as its card does."""
    term = terminal([reply(bash("make\nrm -rf build")), reply(text("ok"))], width=100)
    term.type("go")
    term.keys("Enter")
    term.wait_for("allow once")
    term.type("n")
    term.wait_for("Tell the model")
    term.keys("Enter")
    screen = term.wait_for("Denied:")
    assert "make rm" not in screen and "Denied: make …" in screen, screen


def test_a_long_commands_question_can_be_read_whole_before_it_is_answered(terminal, project):
    """QA: a 100-line heredoc's panel showed 14 lines and "… 89 more lines": the end, `python3
    gen.py` (or `rm -rf ~`), could be read nowhere before answering; Ctrl-R showed the
    conversation without the open call. The transcript ends with it whole."""
    lines = "\n".join(f"print('line {i}')" for i in range(100))
    term = terminal([reply(bash(f"cat > gen.py <<'EOF'\n{lines}\nEOF\ntouch the-last-line")),
                     reply(text("ok"))], width=80, height=24)
    term.type("go")
    term.keys("Enter")
    assert "Ctrl-R shows them all" in term.wait_for("more lines")
    term.keys("C-r")
    screen = term.wait_for("touch the-last-line")
    assert "print('line 99')" in screen and "khaelor waits for your answer" in screen
    term.type("q")
    term.wait_for("allow once")
    term.type("n")
    term.wait_for("Tell the model")
    term.keys("Enter")
    term.wait_for("ok")
    assert not (project / "the-last-line").exists()
