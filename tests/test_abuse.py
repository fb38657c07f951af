"""Abuse: bad model output, hostile files and commands, secrets, and the terminal under signals.

Each end-to-end scenario is one real `khaelor -p` run against tests/fake_api.py that packs many hostile
calls into its script (a run costs ~1.5 s of SDK import); process behaviour with fixed grace periods
is checked in-process on a Toolbox, concurrently, so the waits overlap.
"""
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import events
import tools
from fake_api import FakeAnthropic, reply, text, tool_use
from conftest import khaelor_popen
from test_faults import KEY, in_parallel, read_log, run_cli, session_files

ROOT = Path(__file__).resolve().parent.parent


def tool_results(request_body) -> dict:
    """tool_use_id -> tool_result block, over a request's whole history."""
    return {b["tool_use_id"]: b for m in request_body["messages"] for b in m["content"]
            if isinstance(b, dict) and b["type"] == "tool_result"}


def results_in_order(log) -> list[dict]:
    """The result event of each tool call, in the order the calls were made."""
    order = [e["tool_use_id"] for e in log if e["type"] == "ToolRequested"]
    found = {e["tool_use_id"]: e for e in log if e["type"] in events.TOOL_RESULT_EVENTS}
    return [found[tool_use_id] for tool_use_id in order]


# ---------------------------------------------------------------- bad model output

def raw_call(name, partial_json):
    """A tool_use whose input streams as these exact characters (malformed, cut off, …)."""
    return dict(tool_use(name, {}), partial_json=partial_json)


def test_bad_tool_calls_from_the_model_become_repairable_errors(project, env):
    """Malformed input JSON, a non-object, 100,000-deep nesting, wrong parameter types, an unknown
    tool, absurdly large inputs (a 2 MB write, a 300 KB command, a 10,000-paren regex) and a
    tool_use cut off by max_tokens: each is answered with a result the model can act on."""
    cut_off = raw_call("write", '{"file_path": "out.txt", "content": "the first half of')
    malformed = raw_call("read", '{"file_path": "notes.txt", limit: 3}')
    not_an_object = raw_call("read", '["notes.txt"]')
    deep = raw_call("bash", '{"command": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with FakeAnthropic() as fake:
        fake.enqueue(reply(malformed, not_an_object, deep, chunk=512),
                     reply(tool_use("bash", {"command": ["ls"], "timeout": "soon"}),
                           tool_use("edit", {"file_path": 7, "old_string": None, "new_string": "x", "color": "red"}),
                           tool_use("deploy_to_production", {"target": "everything"})),
                     reply(tool_use("write", {"file_path": "huge.txt", "content": "z" * 2_000_000}),
                           tool_use("bash", {"command": "echo " + "a" * 300_000}),
                           tool_use("grep", {"pattern": "(" * 5000 + "a" + ")" * 5000}), chunk=512),
                     reply(text("Writing it now."), cut_off, stop_reason="max_tokens", chunk=64),
                     reply(text("I will stop here.")))
        started = time.monotonic()
        result = run_cli(project, env, "-p", "misbehave", "--yes", fake=fake)
        assert result.returncode == 0, result.stderr
        assert time.monotonic() - started < 30
        assert fake.rejections == [] and fake.pending == []
        last = fake.requests[-1]["body"]
    assert result.stdout.strip() == "I will stop here."
    log = read_log(session_files(env)[-1])
    outcomes = results_in_order(log)
    assert len(outcomes) == 10
    sent = tool_results(last)
    texts = [sent[o["tool_use_id"]]["content"] for o in outcomes]
    malformed_text, object_text, deep_text, types_text, edit_text, unknown_text = texts[:6]
    assert "not valid JSON" in malformed_text and "could not be run" in malformed_text
    assert "JSON object" in object_text and "could not be run" in deep_text
    assert "'command' must be string" in types_text and "'timeout' must be integer" in types_text
    assert "'file_path' must be string" in edit_text and "unknown parameter 'color'" in edit_text
    assert "unknown tool 'deploy_to_production'" in unknown_text.lower()
    huge_write, long_command, deep_regex, cut_text = outcomes[6:]
    assert huge_write["type"] == "ToolCompleted" and (project / "huge.txt").stat().st_size == 2_000_000
    assert long_command["type"] == "ToolFailed" and "too long" in long_command["output"]
    assert deep_regex["type"] in ("ToolCompleted", "ToolFailed")
    assert cut_text["type"] == "ToolFailed" and "cut off" in cut_text["output"]
    assert not (project / "out.txt").exists()
    assert all(sent[o["tool_use_id"]].get("is_error") for o in outcomes if o["type"] != "ToolCompleted")


# ---------------------------------------------------------------- hostile files and commands

def alive_with(marker: str) -> list[int]:
    """Pids whose command line holds `marker` (a unique sleep duration), zombies excluded."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                cmdline = handle.read()
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state != b"Z":
            found.append(int(entry.name))
    return found


def test_hostile_files_and_commands_give_bounded_results_end_to_end(project, env):
    (project / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40)
    with open(project / "disk.img", "wb") as handle:
        handle.truncate(1 << 30)                       # 1 GB, sparse
    (project / "latin1.txt").write_bytes(b"caf\xe9 cr\xe8me br\xfbl\xe9e\nok line\n")
    odd = project / "dir with space" / "new\nline.txt"
    odd.parent.mkdir()
    odd.write_text("needle in a strange name\n")
    os.symlink("loop", project / "loop")
    os.symlink("b", project / "a")
    os.symlink("a", project / "b")
    marker = f"31.{uuid.uuid4().int % 10**6:06d}"
    script = [
        reply(tool_use("read", {"file_path": "logo.png"}), tool_use("read", {"file_path": "disk.img"}),
              tool_use("read", {"file_path": "latin1.txt"}),
              tool_use("read", {"file_path": "dir with space/new\nline.txt"}),
              tool_use("read", {"file_path": "loop"}), tool_use("read", {"file_path": "a/inside.txt"})),
        reply(tool_use("glob", {"pattern": "**/*.txt"}), tool_use("grep", {"pattern": "needle"}),
              tool_use("write", {"file_path": "loop", "content": "x"}),
              tool_use("edit", {"file_path": "latin1.txt", "old_string": "ok line", "new_string": "OK"})),
        reply(tool_use("bash", {"command": "yes 0123456789abcdef | head -c 100000000"}),
              tool_use("bash", {"command": "cat; echo stdin closed"}),
              tool_use("bash", {"command": f"(trap '' TERM; exec sleep {marker}) & "
                                           f"(trap '' TERM; exec sleep {marker}) & echo spawned"}),
              tool_use("bash", {"command": f"trap '' TERM; sleep {marker}", "timeout": 300})),
        reply(text("Survived."))]
    with FakeAnthropic(script) as fake:
        result = run_cli(project, env, "-p", "poke at everything", "--yes", fake=fake)
        assert result.returncode == 0, result.stderr
        assert fake.rejections == []
        last = fake.requests[-1]["body"]
    assert alive_with(marker) == []
    outcomes = results_in_order(read_log(session_files(env)[-1]))
    sent = tool_results(last)
    texts = [sent[o["tool_use_id"]]["content"] for o in outcomes]
    png, sparse, latin1, odd_read, loop, through_loop, glob, grep, write_loop, edit_latin1, \
        flood, stdin, strays, timeout = texts
    assert "binary file (PNG image" in png
    assert "1,073,741,824 bytes, too large to read whole" in sparse
    assert "caf\ufffd cr\ufffdme" in latin1 and "ok line" in latin1
    assert "needle in a strange name" in odd_read
    assert "symbolic link to nothing" in loop and "does not exist" in through_loop
    assert '"dir with space/new\\nline.txt"' in glob.splitlines()
    assert '"dir with space/new\\nline.txt":1: needle in a strange name' in grep.splitlines()
    assert "symbolic links" in write_loop and "not UTF-8" in edit_latin1
    assert len(flood) < 31_000 and "100,000,000 characters" in flood and "Exit code: 0" in flood
    spill = Path(outcomes[10]["meta"]["spill"])
    assert spill.stat().st_size < 50_100_000 and spill.read_text().endswith("later output was not kept]\n")
    assert "stdin closed" in stdin
    assert "spawned" in strays and "were stopped" in strays
    assert "Timed out after 0.3 s" in timeout


def test_python_grep_fallback_judges_a_huge_sparse_file_by_its_head(tmp_path):
    """Without ripgrep on PATH, grep must not read a 1 GB file of zeros into memory."""
    (tmp_path / "disk.img").open("wb").truncate(1 << 30)
    (tmp_path / "notes.txt").write_text("a needle\n")
    box = tools.Toolbox(tools.Workspace(tmp_path), tmp_path / "home", lambda *a, **k: {}, events.State)
    box.ripgrep = None
    started = time.monotonic()
    result = asyncio.run(box.run("grep", {"pattern": "needle"}, "t1"))
    assert result.text == "notes.txt:1: a needle" and time.monotonic() - started < 1.0


def test_processes_that_ignore_sigterm_or_never_read_stdin_are_bounded(tmp_path):
    """Concurrently, so the fixed grace periods overlap: a group that ignores SIGTERM is killed after
    the grace, a write to a process that never reads its stdin times out, and close() ends all."""
    marker = f"32.{uuid.uuid4().int % 10**6:06d}"
    state = events.State()

    def emit(type_, **payload):
        if type_ == "ProcessStarted":     # as the log's fold numbers processes
            events.note_process(state, payload["process_id"])
    box = tools.Toolbox(tools.Workspace(tmp_path), tmp_path / "home", emit, lambda: state)

    async def stubborn():
        command = f"trap '' TERM; sleep {marker} & sleep {marker} & wait"
        # the ids as given: the two starts run at once, either may be p1
        process = (await box.run("process", {"action": "start", "command": command}, "s1")).meta
        started = time.monotonic()
        stopped = await box.run("process", {"action": "stop", "id": process["process_id"]}, "s2")
        return stopped, time.monotonic() - started

    async def deaf():
        process = (await box.run("process", {"action": "start", "command": f"sleep {marker}"}, "d1")).meta
        started = time.monotonic()
        written = await box.run("process", {"action": "write", "id": process["process_id"],
                                            "input": "x" * 2_000_000}, "d2")
        return written, time.monotonic() - started

    async def scenario():
        outcome = await asyncio.gather(stubborn(), deaf())
        started = time.monotonic()
        await box.close()
        return outcome, time.monotonic() - started

    ((stopped, stop_s), (written, write_s)), close_s = asyncio.run(scenario())
    assert "stopped" in stopped.text and stop_s < tools.PROCESS_STOP_GRACE_S + 2.5
    assert written.is_error and "not reading its stdin" in written.text and write_s < 8
    assert close_s < tools.PROCESS_STOP_GRACE_S + 2.5
    assert alive_with(marker) == []


def test_sigterm_and_sighup_in_headless_mode_stop_tools_and_keep_the_log(tmp_path, env):
    def scenario(signum):
        project = tmp_path / signum.name
        (project / ".git").mkdir(parents=True)
        run_env = {**env, "KHAELOR_HOME": str(tmp_path / f"{signum.name}-home")}
        marker = f"33.{uuid.uuid4().int % 10**6:06d}"

        def go():
            with FakeAnthropic([reply(tool_use("process", {"action": "start", "command": f"sleep {marker}"}),
                                      tool_use("bash", {"command": f"echo started; sleep {marker}"}))]) as fake:
                proc = khaelor_popen(["-p", "work", "--yes", "--output-format", "stream-json"], project,
                                     {**run_env, "ANTHROPIC_BASE_URL": fake.base_url},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for line in proc.stdout:
                    event = json.loads(line)
                    if event["type"] == "ToolStarted" and event.get("name") == "bash":
                        break
                time.sleep(0.2)
                proc.send_signal(signum)
                out, err = proc.communicate(timeout=20)
            return proc.returncode, err.decode(), marker, run_env
        return go

    for code, err, marker, run_env in in_parallel(scenario(signal.SIGTERM), scenario(signal.SIGHUP)):
        # a signal's own exit, as the interactive program has it (SIGINT alone is 130: Ctrl-C)
        assert code in (143, 129) and "Traceback" not in err, err
        assert "SIGTERM" in err if code == 143 else "SIGHUP" in err, err
        assert "Ctrl-C" not in err, err
        assert alive_with(marker) == []
        log = read_log(session_files(run_env)[-1])
        kinds = [e["type"] for e in log]
        assert "Interrupted" in kinds and kinds.count("ToolCancelled") == 1
        assert [e["cause"] for e in log if e["type"] == "ProcessExited"] == ["khaelor exit"]


# ---------------------------------------------------------------- the terminal

def stty_settings(path) -> list[str]:
    """`stty -a` as its settings, without the line wrapping (which follows the width) and the size."""
    words = path.read_text().replace(";", " ").split()
    return [w for i, w in enumerate(words) if w not in ("rows", "columns") and words[i - 1] not in ("rows", "columns")]


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed")
def test_the_terminal_is_restored_after_a_ui_exception_sigterm_and_sighup(tmp_path, project, env):
    """The real program in tmux: `stty -a` of the pane's terminal after it ends equals `stty -a`
    before it started. It is forked onto the pane's terminal by the fork server, as test_tmux's
    programs are (tests/pane.py), where three fresh interpreters cost three SDK imports. The UI
    exception is real, not injected: the composer's history file turns into a folder under it, and
    writing it on Enter raises (if that write ever becomes best-effort, pick another real trigger)."""
    from conftest import fork_server, new_session

    def stty(terminal, path):
        with open(path, "w") as out:
            subprocess.run(["stty", "-a", "-F", terminal], stdout=out, check=True)

    def start(name):
        files = tmp_path / name
        (files / "pane").mkdir(parents=True)
        home = files / "home"
        session = f"kh{uuid.uuid4().hex[:8]}"
        new_session("-d", "-s", session, "-x", "100", "-y", "30",
                    f"exec {sys.executable} {ROOT / 'tests' / 'pane.py'} '{files / 'pane'}'")
        wait_for(lambda: (files / "pane" / "pane.json").exists(), "the pane to give up its terminal")
        given = json.loads((files / "pane" / "pane.json").read_text())
        stty(given["tty"], files / "before")
        run_env = {**given["env"], **{k: v for k, v in env.items() if k.startswith(("KHAELOR", "ANTHROPIC", "HOME",
                                                                                       "PYTHONPATH", "NO_COLOR"))},
                   "KHAELOR_HOME": str(home), "ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "TERM": "xterm",
                   "PWD": str(project)}
        job, pid = fork_server().spawn([], project, run_env, tty=given["tty"])
        return session, files, home, given["tty"], job, pid

    def screen(session):
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout

    def wait_for(predicate, what, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    runs = {}
    try:
        for how in ("exception", "sigterm", "sighup"):
            runs[how] = start(how)
        for session, *_ in runs.values():
            wait_for(lambda: "❯" in screen(session), "the prompt")
        session, files, home, *_ = runs["exception"]
        (home / "history").unlink(missing_ok=True)
        (home / "history").mkdir()                         # the composer's history file can no longer be written
        subprocess.run(["tmux", "send-keys", "-t", session, "-l", "hello"], check=True)
        subprocess.run(["tmux", "send-keys", "-t", session, "Enter"], check=True)
        os.kill(runs["sigterm"][5], signal.SIGTERM)
        os.kill(runs["sighup"][5], signal.SIGHUP)
        codes = {}
        for how, (session, files, home, terminal, job, pid) in runs.items():
            status = fork_server().status(job, timeout=20)
            assert status is not None, f"{how} did not end"
            code = os.waitstatus_to_exitcode(status)
            codes[how] = code if code >= 0 else 128 - code              # as a shell's $? says it
            stty(terminal, files / "after")
            assert stty_settings(files / "after") == stty_settings(files / "before"), how
        shown = screen(runs["exception"][0])
        assert codes == {"exception": 1, "sigterm": 143, "sighup": 129}, shown
        assert "khaelor: internal error: IsADirectoryError" in shown and "Traceback" not in shown
    finally:
        for session, *_ in runs.values():
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


# ---------------------------------------------------------------- secrets

def test_the_api_key_never_reaches_the_log_spill_files_or_output(project, env):
    """Commands and files that show the key: env, printenv, a .env file read, grepped and catted
    into a spilled result, a background process printing it."""
    (project / "secrets.env").write_text(f"ANTHROPIC_API_KEY={KEY}\nOTHER=1\n")
    script = [reply(tool_use("bash", {"command": "env | sort"}),
                    tool_use("bash", {"command": "printenv ANTHROPIC_API_KEY"}),
                    tool_use("read", {"file_path": "secrets.env"}), tool_use("grep", {"pattern": "API_KEY"}),
                    tool_use("bash", {"command": "cat secrets.env; seq 1 20000; cat secrets.env"}),
                    tool_use("process", {"action": "start", "command": "printenv ANTHROPIC_API_KEY; sleep 0.3"})),
              reply(tool_use("process", {"action": "read", "id": "p1"})),
              reply(text("Done looking."))]
    with FakeAnthropic(script) as fake:
        # (--yes never opens a secret file: the user's rules approve reading it)
        approved = ("--allowedTools", "Read(./secrets.env)", "Bash(cat secrets.env*)")
        result = run_cli(project, env, "-p", "look for credentials", "--yes", *approved,
                         "--output-format", "stream-json", fake=fake)
        assert result.returncode == 0, result.stderr
        sent = [request["raw"] for request in fake.requests]
    log_path = session_files(env)[-1]
    # env and printenv no longer see the key (the child's environment is allow-listed); the file
    # read, grepped and catted does show it, masked
    assert log_path.read_text().count(tools.SECRET_MASK) >= 3
    assert all(KEY.encode() not in raw for raw in sent)
    written = [p for p in Path(env["KHAELOR_HOME"]).rglob("*") if p.is_file()]
    assert any("spill" in p.parts for p in written)
    for path in written:
        assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in result.stdout + result.stderr


@pytest.mark.suite_end
def test_nothing_khaelor_wrote_during_the_suite_holds_the_api_key(tmp_path_factory):
    """Every file under this run's temp folders (session logs, spill files, crash.log, stderr.log,
    history, captured output), except the fixture files that hold the key on purpose."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent      # every worker's folders (pytest-N/popen-gw0, popen-gw1, ...)
    checked = 0
    for path in base.rglob("*"):
        if not path.is_file() or path.is_symlink() or path.name == "secrets.env" or path.stat().st_size > 64 << 20:
            continue
        assert KEY.encode() not in path.read_bytes(), path
        checked += 1
    print(f"key scan: {checked} files, {len(list(base.rglob('sessions/*/*.jsonl')))} session logs")
    assert checked and any(base.rglob("sessions/*/*.jsonl"))
