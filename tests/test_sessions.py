"""Sessions, the verification gate, git awareness and the doom-loop guard, end to end: the real
`khaelor` process and the real SDK against the scripted fake API (plus the pure parts they share)."""
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

import context
import events
import kernel
import khaelor as cli
from fake_api import reply, text, tool_use


def types(log, kind):
    return [e for e in log if e["type"] == kind]


def last_message(fake, i=-1):
    return fake.requests[i]["body"]["messages"][-1]


def git(project, *argv):
    return subprocess.run(["git", *argv], cwd=project, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(project):
    """A real git repository with one commit, so baselines have something to say."""
    (project / ".git").rmdir()
    git(project, "init", "-q", "-b", "main")
    git(project, "config", "user.email", "t@example.com")
    git(project, "config", "user.name", "t")
    (project / "app.py").write_text("def greet():\n    return 'hello'\n")
    (project / "README.md").write_text("# demo\n")
    git(project, "add", ".")
    git(project, "commit", "-q", "-m", "init")
    return project


# ---------------------------------------------------------------- the verification gate

def test_the_gate_nudges_after_a_code_edit_until_a_check_runs(khaelor, fake, project):
    fake.enqueue(reply(tool_use("write", {"file_path": "app.py", "content": "print('hi')\n"})),
                 reply(text("Wrote app.py.")),
                 reply(tool_use("bash", {"command": "python3 -m py_compile app.py"})),
                 reply(text("Wrote app.py; it compiles.")))
    result = khaelor.run("-p", "write app.py", "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Wrote app.py; it compiles."
    assert fake.rejections == []
    nudge = last_message(fake, 2)
    assert nudge["role"] == "user" and "app.py" in nudge["content"][0]["text"]
    assert "py_compile app.py" in nudge["content"][0]["text"]       # no tests here: compile the module
    roles = [m["role"] for m in fake.requests[2]["body"]["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    log = khaelor.log()
    asked = types(log, "VerificationRequested")
    assert len(asked) == 1 and asked[0]["withheld"] == "Wrote app.py." and asked[0]["changed_files"] == ["app.py"]
    evidence = types(log, "TaskCompleted")[-1]["evidence"]
    assert evidence["objective"] == "write app.py" and evidence["changed_files"] == ["app.py"]
    assert evidence["checks"] == [{"command": "python3 -m py_compile app.py", "exit_code": 0}]
    assert evidence["unresolved"] == [] and evidence["reminders"] == 1


def test_a_readme_only_edit_skips_the_gate(khaelor, fake, project):
    fake.enqueue(reply(tool_use("write", {"file_path": "README.md", "content": "# Title\n"})),
                 reply(tool_use("write", {"file_path": "docs/guide.py", "content": "x = 1\n"})),
                 reply(text("Docs updated.")))
    result = khaelor.run("-p", "update the docs", "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Docs updated." and len(fake.requests) == 3
    log = khaelor.log()
    assert types(log, "VerificationRequested") == []
    assert types(log, "TaskCompleted")[-1]["evidence"]["changed_files"] == ["README.md", "docs/guide.py"]


def test_the_gate_gives_up_after_two_nudges_and_delivers_the_withheld_answer(khaelor, fake, project):
    fake.enqueue(reply(tool_use("write", {"file_path": "app.py", "content": "print('hi')\n"})),
                 reply(text("Fixed the greeting in app.py.")),
                 reply(text("I cannot run anything here.")),
                 reply(text("")))
    result = khaelor.run("-p", "fix the greeting", "--yes", "--output-format", "json")
    assert result.returncode == 0, result.stderr
    assert fake.rejections == [] and len(fake.requests) == 4
    out = json.loads(result.stdout)
    assert out["result"] == "Fixed the greeting in app.py.\n\nI cannot run anything here."
    log = khaelor.log()
    assert [e["attempt"] for e in types(log, "VerificationRequested")] == [1, 2]
    done = types(log, "TaskCompleted")[-1]
    assert done["answer"] == out["result"]
    assert done["evidence"]["checks"] == [] and "no check ran after the last change to app.py" in \
        done["evidence"]["unresolved"][0]


def test_a_check_that_ran_before_the_last_edit_does_not_count(khaelor, fake, project):
    fake.enqueue(reply(tool_use("bash", {"command": "python3 -m pytest --version || true"})),
                 reply(tool_use("write", {"file_path": "app.py", "content": "x = 1\n"})),
                 reply(text("done")),
                 reply(tool_use("bash", {"command": "python3 -m py_compile app.py; exit 3"})),
                 reply(text("the check failed")))
    result = khaelor.run("-p", "go", "--yes")
    assert result.returncode == 0, result.stderr
    log = khaelor.log()
    assert len(types(log, "VerificationRequested")) == 1
    evidence = types(log, "TaskCompleted")[-1]["evidence"]
    assert [c["exit_code"] for c in evidence["checks"]] == [0, 3]
    assert evidence["unresolved"] == ["`python3 -m py_compile app.py; exit 3` failed (exit 3)"]


def test_the_nudge_names_the_test_file_of_the_changed_module(khaelor, fake, project):
    (project / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntestpaths = ['tests']\n\n[tool.ruff]\n")
    (project / "src").mkdir()
    (project / "src" / "greet.py").write_text("x = 1\n")
    (project / "tests").mkdir()
    (project / "tests" / "test_greet.py").write_text("def test_x():\n    pass\n")
    (project / "tests" / "test_other.py").write_text("def test_y():\n    pass\n")
    fake.enqueue(reply(tool_use("read", {"file_path": "src/greet.py"})),
                 reply(tool_use("edit", {"file_path": "src/greet.py", "old_string": "x = 1", "new_string": "x = 2"})),
                 reply(text("changed")), reply(text("cannot")), reply(text("still cannot")))
    assert khaelor.run("-p", "bump x", "--yes").returncode == 0
    commands = types(khaelor.log(), "VerificationRequested")[0]["commands"]
    assert len(commands) == 2 and commands[0].endswith("-m pytest -q tests/test_greet.py")
    assert commands[1] == "ruff check src/greet.py"


def test_check_detection_per_ecosystem(tmp_path):
    root = tmp_path
    (root / "package.json").write_text(json.dumps({"scripts": {"test": "vitest run", "lint": "eslint ."}}))
    (root / "pnpm-lock.yaml").write_text("")
    (root / "src").mkdir()
    (root / "src" / "util.ts").write_text("")
    (root / "src" / "util.test.ts").write_text("")
    assert context.detect_checks(root, ["src/util.ts"]) == ["pnpm test -- src/util.test.ts", "pnpm run lint"]
    (root / "go.mod").write_text("module x\n")
    assert context.detect_checks(root, ["pkg/a/a.go"]) == ["go vet ./pkg/a", "go test ./pkg/a"]
    (root / "Cargo.toml").write_text("[package]\n")
    assert context.detect_checks(root, ["src/main.rs"]) == ["cargo test"]
    (root / "Makefile").write_text("build:\n\tcc x.c\ntest: build\n\t./t\nlint:\n\ttrue\nX := 1\n")
    assert context.detect_checks(root, ["x.c"]) == ["make test", "make lint"]


def test_check_commands_keep_each_path_one_shell_word(tmp_path):
    root = tmp_path
    (root / "package.json").write_text(json.dumps({"scripts": {"test": "vitest run"}}))
    (root / "src").mkdir()
    (root / "src" / "my util.ts").write_text("")
    (root / "src" / "my util.test.ts").write_text("")
    assert context.detect_checks(root, ["src/my util.ts"]) == ["npm test -- 'src/my util.test.ts'"]
    (root / "go.mod").write_text("module x\n")
    assert context.detect_checks(root, ["pkg/$(id)/a.go"]) == ["go vet './pkg/$(id)'",
                                                               "go test './pkg/$(id)'"]
    (root / "pyproject.toml").write_text("[tool.ruff]\n")
    assert context.detect_checks(root, ["a b.py"]) == ["ruff check 'a b.py'"]


def test_check_commands_find_the_tests_of_a_bracketed_route_file(tmp_path):
    """Next.js names routes pages/[id].tsx: the brackets are the name, not a glob class (which
    missed [id].test.tsx and offered i.test.ts, another file's test, instead)."""
    root = tmp_path
    (root / "package.json").write_text(json.dumps({"scripts": {"test": "vitest run"}}))
    (root / "pages").mkdir()
    for name in ("[id].tsx", "[id].test.tsx", "i.test.ts"):
        (root / "pages" / name).write_text("")
    assert context.detect_checks(root, ["pages/[id].tsx"]) == ["npm test -- 'pages/[id].test.tsx'"]


def test_a_package_json_whose_scripts_are_not_an_object_names_no_check(tmp_path):
    """JSON, but "scripts" a list or a string: the gate and /init read no script from it (it
    raised AttributeError, which ended the turn at the gate)."""
    (tmp_path / "a.js").write_text("")
    for scripts in (["test"], "vitest run"):
        (tmp_path / "package.json").write_text(json.dumps({"scripts": scripts}))
        assert context.detect_checks(tmp_path, ["a.js"]) == []
        assert context.detect_checks(tmp_path, []) == []


def test_what_counts_as_a_check_and_as_code():
    for command in ("pytest -q", "python3 -m pytest tests/x.py", "npm test", "npm run lint", "make test",
                    "cargo clippy", "go test ./...", "cd src && python test_app.py", "./run_tests.sh", "tox -e py"):
        assert kernel.is_check(command), command
    for command in ("ls", "cat tests/test_app.py", "git diff", "echo done", "python3 app.py"):
        assert not kernel.is_check(command), command
    assert kernel.is_check("./scripts/verify.sh --all", ["./scripts/verify.sh"])
    assert [kernel.is_code_path(p) for p in ("README.md", "docs/x.py", "notes.txt", "requirements.txt",
                                               "src/app.py", "Makefile")] == [False, False, False, True, True, True]


# ---------------------------------------------------------------- git awareness

def test_baselines_and_attribution_keep_the_users_changes_apart(khaelor, fake, repo):
    (repo / "README.md").write_text("# demo\nmy own edit, not committed\n")     # pre-existing
    head = git(repo, "rev-parse", "HEAD")
    fake.enqueue(reply(tool_use("read", {"file_path": "app.py"})),
                 reply(tool_use("edit", {"file_path": "app.py", "old_string": "'hello'", "new_string": "'hi'"})),
                 reply(tool_use("bash", {"command": "touch made-by-a-command.txt && python3 -m py_compile app.py"})),
                 reply(text("greeting changed")))
    result = khaelor.run("-p", "change the greeting", "--yes")
    assert result.returncode == 0, result.stderr
    log = khaelor.log()
    start, before_edit = types(log, "BaselineRecorded")
    assert start["reason"] == "session start" and before_edit["reason"] == "before first edit"
    assert start["git"] and start["branch"] == "main" and start["head"] == head.strip()
    assert start["dirty"] == [{"path": "README.md", "status": ".M"}] and start["diff_hash"].startswith("sha256:")
    assert log.index(before_edit) < log.index(types(log, "FileModified")[0])
    evidence = types(log, "TaskCompleted")[-1]["evidence"]
    assert evidence["changed_files"] == ["app.py"] and evidence["preexisting_changes"] == ["README.md"]
    now = context.git_baseline(__import__("tools").Workspace(repo))
    report = cli.diff_report(events.replay(log), [d["path"] for d in now["dirty"]])
    mine, theirs = report.split("**Already changed when the session started")
    assert "`app.py` +1 −1" in mine and "+    return 'hi'" in mine and "README.md" not in mine
    assert "`README.md`" in theirs.split("**Changed during")[0]
    assert "`made-by-a-command.txt`" in theirs.split("**Changed during")[1]
    # khaelor never commits, stages or stashes on its own.
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "diff", "--cached") == ""
    assert git(repo, "stash", "list") == ""


def test_slash_diff_never_blames_the_session_for_a_file_untracked_before_it(khaelor, fake, repo,
                                                                           env, monkeypatch):
    (repo / "notes.txt").write_text("mine, never added\n")           # untracked before the session
    edit = {"file_path": "app.py", "old_string": "'hello'", "new_string": "'hi'"}
    fake.enqueue(reply(tool_use("read", {"file_path": "app.py"})),
                 reply(tool_use("edit", edit)),
                 reply(tool_use("bash", {"command": "python3 -m py_compile app.py"})),
                 reply(text("done")))
    assert khaelor.run("-p", "change the greeting", "--yes").returncode == 0

    async def diff(session):
        return await session.run_command("/diff")
    report = in_session(repo, env, monkeypatch, diff)
    mine, theirs = report.split("**Already changed when the session started")
    assert "`app.py`" in mine and "notes.txt" not in mine and "khaelor changed 1 file" in mine
    before, during = theirs.split("**Changed during the session")      # py_compile's __pycache__
    assert "`notes.txt`" in before and "notes.txt" not in during


def test_slash_diff_before_the_first_message_calls_what_is_dirty_the_users(repo, env, monkeypatch):
    """No message yet, so no baseline: the files dirty now were so when the session started."""
    from test_claude_parity import in_session as in_new_session
    (repo / "README.md").write_text("# demo\nmy own edit\n")
    (repo / "notes.txt").write_text("mine, never added\n")

    async def diff(session):
        return await session.run_command("/diff")
    report = in_new_session(repo, env, monkeypatch, diff)
    assert "**Changed during the session" not in report
    assert "`README.md`, `notes.txt`" in report.split("**Already changed when the session started")[1]


def test_a_file_already_dirty_before_khaelor_is_flagged_in_diff(tmp_path):
    log = [{"type": "BaselineRecorded", "reason": "session start", "git": True,
            "dirty": [{"path": "app.py", "status": ".M"}, {"path": "notes.md", "status": "??"}]},
           {"type": "FileModified", "path": "app.py", "added": 1, "removed": 0, "created": False,
            "diff": "--- a/app.py\n+++ b/app.py\n@@ -1 +1,2 @@\n x\n+y\n", "tool_use_id": "t"},
           {"type": "BaselineRecorded", "reason": "resume", "git": True,
            "dirty": [{"path": "app.py", "status": ".M"}, {"path": "later.txt", "status": "??"}]}]
    log = [{"v": 1, "seq": seq, "ts": 0, **event} for seq, event in enumerate(log, 1)]
    state = events.replay(log)
    who = context.attribute_changes(state, ["app.py", "notes.md", "later.txt", "new.txt"])
    assert who == {"khaelor": ["app.py"], "preexisting": ["app.py", "notes.md"], "outside": ["later.txt", "new.txt"],
                   "dirty_before_edit": ["app.py"]}
    assert "it had uncommitted changes before khaelor's first edit" in cli.diff_report(state)


def test_outside_a_git_repository_the_baseline_says_so(khaelor, fake, project):
    fake.enqueue(reply(text("hi")))
    assert khaelor.run("-p", "hello").returncode == 0
    assert [(e["reason"], e["git"]) for e in types(khaelor.log(), "BaselineRecorded")] == [("session start", False)]


# ---------------------------------------------------------------- the doom-loop guard

def test_headless_stops_a_doom_loop_with_a_clear_message(khaelor, fake, project):
    call = tool_use("bash", {"command": "echo again >> count.txt"})
    fake.enqueue(reply(call), reply(call), reply(call), reply(text("never reached")))
    result = khaelor.run("-p", "loop", "--yes")
    assert result.returncode == 1
    assert "repeated the same bash call 3 times in a row" in result.stderr
    assert (project / "count.txt").read_text() == "again\nagain\n"       # the third call never ran
    log = khaelor.log()
    assert types(log, "PermissionRequested")[-1]["capability"] == events.LOOP_CAPABILITY
    assert types(log, "TaskFailed") and len(fake.requests) == 3
    # The session stays valid: the next prompt continues it with a well-formed history.
    fake.enqueue(reply(text("ok")))
    assert khaelor.run("-c", "-p", "stop looping").returncode == 0
    assert fake.rejections == []


def test_identical_calls_in_separate_turns_are_not_a_loop():
    from kernel import derive_next
    log = []
    for i in range(3):
        if i:
            log += [{"type": "ToolCompleted", "tool_use_id": f"t{i - 1}", "name": "bash", "output": "", "meta": {}},
                    {"type": "TaskCompleted", "evidence": {}}]
        log += [{"type": "UserMessageCreated", "text": "run make again"},
                {"type": "ToolRequested", "tool_use_id": f"t{i}", "name": "bash", "input": {"command": "make"}},
                {"type": "ModelResponseCompleted", "stop_reason": "tool_use", "usage": {}}]
    log = [dict(e, seq=n) for n, e in enumerate(log, 1)]
    assert derive_next(events.replay(log)) == "execute-tools"
    inside_one_turn = [e for e in log if e["type"] != "UserMessageCreated" or e["seq"] == 1]
    assert derive_next(events.replay([e for e in inside_one_turn if e["type"] != "TaskCompleted"])) == "ask-user"


# ---------------------------------------------------------------- sessions: listing, caches, resume

def test_sessions_are_listed_from_their_meta_caches_and_rebuilt_when_stale(khaelor, fake, project):
    fake.enqueue(reply(text("one")))
    assert khaelor.run("-p", "first session about walruses").returncode == 0
    time.sleep(0.01)
    fake.enqueue(reply(text("two")))
    assert khaelor.run("-p", "second session about otters").returncode == 0
    first, second = khaelor.session_files()
    listing = khaelor.run("sessions").stdout.splitlines()
    assert second.stem in listing[1] and "otters" in listing[1] and first.stem in listing[2]
    meta = json.loads(events.meta_path(first).read_text())
    assert meta["title"] == "first session about walruses" and meta["model"] == "claude-sonnet-5-5"
    assert meta["tokens"] > 0 and meta["cost"] > 0 and meta["created"] <= meta["updated"]
    # A fresh cache is trusted: the listing does not read the log.
    events.meta_path(first).write_text(json.dumps({**meta, "title": "from the cache"}))
    assert "from the cache" in khaelor.run("sessions").stdout
    # The log grew: the cache is stale and rebuilt from the log.
    fake.enqueue(reply(text("three")))
    assert khaelor.run("-r", first.stem, "-p", "more").returncode == 0
    events.meta_path(first).write_text(json.dumps({**meta, "title": "stale"}))
    out = khaelor.run("sessions").stdout
    assert "stale" not in out and "first session about walruses" in out
    rebuilt = json.loads(events.meta_path(first).read_text())
    assert rebuilt["tokens"] > meta["tokens"]
    events.meta_path(second).unlink()
    assert "otters" in khaelor.run("sessions").stdout and events.meta_path(second).exists()


def test_a_sessions_token_count_holds_its_thinking_once(tmp_path):
    """thinking_tokens is part of output_tokens: the listing's count must not add it again, as
    the status line does not."""
    store = events.SessionStore.create(tmp_path)
    bus = events.Bus(store)
    usage = {"input_tokens": 100, "output_tokens": 50, "cache_read_tokens": 0,
             "cache_write_tokens": 0, "thinking_tokens": 40}
    bus.emit("ModelResponseCompleted", message_id="m", model="claude-sonnet-5-5",
             stop_reason="end_turn", usage=usage)
    assert cli.session_summary(store)["tokens"] == 150
    store.close()


def test_listing_two_hundred_sessions_reads_only_the_caches(khaelor, project, env):
    directory = events.sessions_dir(Path(env["KHAELOR_HOME"]), project)
    first_id = "20250101-000000000-aaaaaa"
    bus = events.Bus(events.SessionStore.create(directory, first_id))
    bus.emit("SessionCreated", cwd=str(project), project_root=str(project),
             model="claude-sonnet-5-5", aux_model="claude-haiku-5-5", version="t")
    bus.emit("UserMessageCreated", text="task number 0")
    for _ in range(50):
        bus.emit("ToolCompleted", tool_use_id="t", name="bash", output="x" * 2000, meta={})
    bus.store.close()
    # the other 199 as copies of what the store left (its log and lock), each log with its own
    # session id and task: what 199 more stores would write, without 10,000 appends and 199 fsyncs
    written = (directory / f"{first_id}.jsonl").read_text()
    lock = (directory / f"{first_id}.lock").read_bytes()
    for i in range(1, 200):
        session_id = f"20250101-000000{i:03d}-aaaaaa"
        copied = written.replace(first_id, session_id)
        copied = copied.replace('"task number 0"', f'"task number {i}"')
        (directory / f"{session_id}.jsonl").write_text(copied)
        (directory / f"{session_id}.lock").write_bytes(lock)
    first = khaelor.run("sessions")
    assert first.returncode == 0 and len(first.stdout.splitlines()) == 201
    assert len(list(directory.glob("*.meta.json"))) == 200
    for log in directory.glob("*.jsonl"):   # junk of the same size and mtime: only the caches can answer now
        stat = log.stat()
        log.write_bytes(b"\n" * stat.st_size)
        os.utime(log, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = khaelor.run("sessions")
    assert second.stdout == first.stdout and "task number 199" in second.stdout.splitlines()[1]


def test_resume_after_a_crash_mid_tool_continues_with_a_valid_request(khaelor, fake, project, env):
    directory = events.sessions_dir(Path(env["KHAELOR_HOME"]), project)
    bus = events.Bus(events.SessionStore.create(directory))
    bus.emit("SessionCreated", cwd=str(project), project_root=str(project), model="claude-sonnet-5-5",
             aux_model="claude-haiku-5-5", version="t")
    bus.emit("UserMessageCreated", text="run the long thing")
    bus.emit("ToolRequested", tool_use_id="toolu_1", name="bash", input={"command": "sleep 100"})
    bus.emit("ModelResponseCompleted", message_id="m", model="claude-sonnet-5-5", stop_reason="tool_use",
             usage={"input_tokens": 1, "output_tokens": 1, "cache_read_tokens": 0, "cache_write_tokens": 0})
    bus.emit("ToolStarted", tool_use_id="toolu_1", name="bash")
    bus.store.close()                  # khaelor died here
    fake.enqueue(reply(text("picked up")))
    result = khaelor.run("-c", "-p", "what happened?")
    assert result.returncode == 0 and result.stdout.strip() == "picked up"
    assert fake.rejections == []
    sent = fake.requests[0]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[2]["content"][0]["type"] == "tool_result" and "exited while the tool was running" in \
        sent[2]["content"][0]["content"]


def test_a_doom_loop_in_one_response_cancels_the_calls_before_the_one_asked_about(khaelor, fake):
    call = tool_use("bash", {"command": "echo again >> count.txt"})
    fake.enqueue(reply(call, call, call))
    assert khaelor.run("-p", "loop", "--yes").returncode == 1
    log = khaelor.log()
    [denied] = types(log, "PermissionDenied")
    cancelled = types(log, "ToolCancelled")
    requested = [e["tool_use_id"] for e in types(log, "ToolRequested")]
    assert denied["tool_use_id"] == requested[-1]
    assert [e["tool_use_id"] for e in cancelled] == requested[:-1]
    assert all(e["reason"].startswith("not run: stopped: the model repeated") for e in cancelled)


def test_a_doom_loop_denied_with_a_message_tells_the_model_and_the_turn_goes_on(fake, kernel_turn):
    """In-process kernel with a user who answers the loop question "n" plus a message."""
    call = tool_use("bash", {"command": "echo same"})
    fake.enqueue(reply(call), reply(call), reply(text("thinking"), call), reply(text("trying another way")))
    asked = []

    async def ask(request):
        asked.append(request)
        return "deny", "stop repeating; read the error instead"

    step, log = kernel_turn("do the thing", ask)
    assert step == "done" and len(asked) == 1
    assert asked[0]["capability"] == events.LOOP_CAPABILITY and "3 identical bash calls in a row" in asked[0]["descriptor"]
    result = [b for m in fake.requests[-1]["body"]["messages"] for b in m["content"] if b["type"] == "tool_result"][-1]
    assert result["is_error"] and "stop repeating; read the error instead" in result["content"]
    assert len(types(log, "ToolStarted")) == 2 and fake.rejections == []


def test_the_gate_is_skipped_when_the_turn_budget_is_spent_and_after_two_reminders():
    from kernel import derive_next

    def at(*items):
        return [dict(e, seq=n) for n, e in enumerate(items, 1)]
    base = [{"type": "UserMessageCreated", "text": "go"},
            {"type": "ToolRequested", "tool_use_id": "t", "name": "write", "input": {}},
            {"type": "ModelResponseCompleted", "stop_reason": "tool_use", "usage": {}},
            {"type": "FileModified", "tool_use_id": "t", "path": "a.py"},
            {"type": "ToolCompleted", "tool_use_id": "t", "name": "write", "output": "", "meta": {}},
            {"type": "ModelResponseCompleted", "stop_reason": "end_turn", "usage": {}}]
    assert derive_next(events.replay(at(*base))) == "verify"
    assert derive_next(events.replay(at(*base)), max_turns=2) == "done"
    nudge = {"type": "VerificationRequested", "text": "check", "commands": []}
    again = {"type": "ModelResponseCompleted", "stop_reason": "end_turn", "usage": {}}
    assert derive_next(events.replay(at(*base, nudge))) == "call-model"
    assert derive_next(events.replay(at(*base, nudge, again))) == "verify"
    assert derive_next(events.replay(at(*base, nudge, again, nudge, again))) == "done"
    started = {"type": "ProcessStarted", "process_id": "p1", "pid": 1, "command": "npm test -- --watch=false"}
    state = events.replay(at(*base[:-1], started, {"type": "ProcessExited", "process_id": "p1",
                                                          "exit_code": 1, "cause": "exited"}, base[-1]))
    assert derive_next(state) == "done" and state.commands[-1]["exit_code"] == 1   # a background check counts
    max_tokens = dict(base[-1], stop_reason="max_tokens")
    assert derive_next(events.replay(at(*base[:-1], max_tokens))) == "done"


# ---------------------------------------------------------------- empty sessions are never listed or continued (issue 14)

def test_sessions_without_a_user_message_are_not_listed_or_continued(khaelor, fake, project, env):
    fake.enqueue(reply(text("the real answer")))
    assert khaelor.run("-p", "a real conversation").returncode == 0
    real = khaelor.session_files()[-1]
    directory = events.sessions_dir(Path(env["KHAELOR_HOME"]), project)
    # What an older khaelor left when it was opened and quit: a log with no user message, no cache.
    time.sleep(0.01)
    empty = events.Bus(events.SessionStore.create(directory))
    empty.emit("SessionCreated", cwd=str(project), project_root=str(project), model="claude-sonnet-5-5",
               aux_model="claude-haiku-5-5", version="0.0.9")
    empty.emit("BaselineRecorded", reason="session start", git=False)
    empty.store.close()
    events.write_meta(real, {"id": real.stem, "title": "a cache from before n_messages"})   # rebuilt
    listing = khaelor.run("sessions").stdout
    assert real.stem in listing and "a real conversation" in listing
    assert empty.store.session_id not in listing and len(listing.splitlines()) == 2
    fake.enqueue(reply(text("continued")))
    assert khaelor.run("-c", "-p", "and then?").returncode == 0
    assert [e["text"] for e in khaelor.log(real) if e["type"] == "UserMessageCreated"] == \
        ["a real conversation", "and then?"]


def test_sessions_help_prints_its_usage(khaelor):
    result = khaelor.run("sessions", "--help")
    assert result.returncode == 0 and "usage: khaelor sessions" in result.stdout
    assert "no sessions" not in result.stdout


def test_help_lists_the_keys_and_the_instruction_files(khaelor):
    result = khaelor.run("--help")
    assert result.returncode == 0
    for key in ("Esc", "Ctrl-J", "Ctrl-C", "Ctrl-D", "Ctrl-L", "Ctrl-O", "Ctrl-Z", "@path", "!command"):
        assert key in result.stdout, key
    assert "KHAELOR.md, CLAUDE.md, AGENTS.md" in result.stdout and "khaelor sessions" in result.stdout
    assert "khaelor permissions" in result.stdout and "khaelor trust [--revoke]" in result.stdout


def test_help_names_every_option_of_each_subcommand(khaelor):
    """`khaelor --help` said `khaelor sandbox [--write|--network] [--path P] -- CMD`: no
    --read-only, --secrets or --yes, which README's Usage and `khaelor sandbox --help` have."""
    listed = khaelor.run("--help").stdout
    for argv in (["permissions"], ["permissions", "check"], ["trust"], ["sandbox"], ["rewind"]):
        usage = next(line for line in listed.splitlines() if line.startswith(f"  khaelor {argv[0]}"))
        own = khaelor.run(*argv, "--help").stdout.split("\n\n")[0]
        options = set(re.findall(r"(?<![\w-])--?[a-z-]+", own)) - {"-h"}
        assert options and all(option in usage for option in options), (usage, options)


# ---------------------------------------------------------------- the world belongs to the session

def in_session(project, env, monkeypatch, script):
    """Run `await script(session)` against the interactive controller (no terminal), in `project`."""
    import asyncio

    import khaelor as cli
    for key in ("KHAELOR_HOME", "ANTHROPIC_API_KEY", "HOME", "ANTHROPIC_BASE_URL"):
        if key in env:
            monkeypatch.setenv(key, env[key])
    monkeypatch.chdir(project)
    home = Path(env["KHAELOR_HOME"])

    async def go():
        args = cli.parse_args(["-c"])
        session = cli.Session(args, cli.load_settings(args, home, project), home, project)
        session.attach(cli.open_session(args, home, project))
        try:
            return await script(session)
        finally:
            await session.quit()
    return asyncio.run(go())


def test_undo_works_after_continue(khaelor, fake, project, env, monkeypatch):
    (project / "app.py").write_text("print('hello')\n")
    fake.enqueue(reply(tool_use("read", {"file_path": "app.py"})),
                 reply(tool_use("edit", {"file_path": "app.py", "old_string": "hello", "new_string": "hi"})),
                 reply(tool_use("edit", {"file_path": "app.py", "old_string": "hi", "new_string": "hey"})),
                 reply(tool_use("bash", {"command": "python3 -m py_compile app.py"})),
                 reply(text("done")))
    assert khaelor.run("-p", "greet differently", "--yes").returncode == 0
    assert (project / "app.py").read_text() == "print('hey')\n"

    async def undo_each_step(session):
        return [await session.cmd_undo("") for _ in range(4)]
    # /undo rewinds the last step not undone yet: the compile's cache, then each edit
    answers = in_session(project, env, monkeypatch, undo_each_step)
    for answer, step in zip(answers, (3, 2, 1)):
        assert answer.startswith(f"Rewinding to before step {step}"), answer
    assert "app.py" in answers[1] and answers[3].startswith("nothing to undo: the steps that changed the work tree are rewound already")
    assert (project / "app.py").read_text() == "print('hello')\n"


def test_a_new_session_starts_with_a_fresh_world_and_ids_go_on_after_resume(khaelor, fake, project, env,
                                                                             monkeypatch):
    (project / "notes.py").write_text("x = 1\n")
    fake.enqueue(reply(tool_use("read", {"file_path": "notes.py"})),
                 reply(tool_use("process", {"action": "start", "command": "sleep 30"})), reply(text("ok")))
    assert khaelor.run("-p", "look and start", "--yes").returncode == 0
    first_log = khaelor.session_files()[-1]

    async def script(session):
        edit = {"file_path": "notes.py", "old_string": "x = 1", "new_string": "x = 2"}
        resumed = await session.toolbox.run("edit", edit, "t-resumed")       # read in the earlier run
        started = await session.toolbox.run("process", {"action": "start", "command": "sleep 30"}, "t-p")
        await session.cmd_new("")
        fresh = await session.toolbox.run("edit", {**edit, "old_string": "x = 2", "new_string": "x = 3"}, "t-new")
        return resumed, started, fresh, session.store.path
    resumed, started, fresh, new_log = in_session(project, env, monkeypatch, script)
    assert not resumed.is_error and (project / "notes.py").read_text() == "x = 2\n"
    assert started.meta["process_id"] == "p2"               # p1 was started in the first run
    assert fresh.is_error and fresh.meta["error"] == "not_read"      # the new session read nothing
    first = [json.loads(line) for line in first_log.read_text().splitlines()]
    exited = [e["process_id"] for e in first if e["type"] == "ProcessExited"]
    assert exited == ["p1", "p2"]                           # each exit in its own session's log
    assert not new_log.exists() or "ProcessExited" not in new_log.read_text()


def test_a_message_sent_before_the_turn_task_first_runs_is_steering(khaelor, fake, project, env, monkeypatch):
    """Busy is the kernel's alone, and it starts when the turn is started, not when its task first
    runs: two messages sent in one breath are one turn and one steering message."""
    fake.enqueue(reply(text("hello")))
    assert khaelor.run("-p", "hi", "--yes").returncode == 0
    fake.enqueue(reply(text("on it")), reply(text("and the second")))

    async def script(session):
        session.submit("first")
        session.submit("second")        # no await between: the turn's task has not run yet
        assert session.working
        await session.turn
        return [(e["type"], e.get("text")) for e in session.store.events
                if e["type"] in ("UserMessageCreated", "SteeringQueued", "SteeringInjected")]
    said = in_session(project, env, monkeypatch, script)
    assert said[-3:] == [("UserMessageCreated", "first"), ("SteeringQueued", "second"),
                         ("SteeringInjected", "second")]


async def typed_as_the_turn_ends(session, line: str, kinds: tuple, field: str) -> list:
    """Sends "first", and `line` once that turn has ended in the log but not yet for the session
    (the window of the race); then (type, field) of the log's events of `kinds`."""
    typed = []

    def type_as_it_ends(event):
        if event["type"] == "TaskCompleted" and not typed:
            typed.append(session.submit(line))
    session.subscribe(type_as_it_ends)
    session.submit("first")
    first = session.turn
    await first
    assert session.turn is not first
    await session.turn
    return [(e["type"], e.get(field)) for e in session.store.events if e["type"] in kinds]


def test_a_message_typed_as_the_turn_ends_starts_the_next_turn(khaelor, fake, project, env, monkeypatch):
    """QA: a message typed after the last request, while the turn wrote its last checkpoint, was
    queued as steering that no step could take: it waited, unsent, for the user's next message."""
    fake.enqueue(reply(text("hello")))
    assert khaelor.run("-p", "hi", "--yes").returncode == 0
    fake.enqueue(reply(text("first answer")), reply(text("second answer")))

    async def script(session):
        return await typed_as_the_turn_ends(
            session, "late", ("UserMessageCreated", "SteeringQueued", "TaskCompleted"), "text")
    said = in_session(project, env, monkeypatch, script)
    assert said[-5:] == [("UserMessageCreated", "first"), ("TaskCompleted", None),
                         ("SteeringQueued", "late"), ("UserMessageCreated", "late"),
                         ("TaskCompleted", None)]
    assert "late" in json.dumps(fake.requests[-1]["body"]["messages"][-1])


def test_a_command_file_typed_as_the_turn_ends_shows_its_line_in_the_next_turn(
        khaelor, fake, project, env, monkeypatch):
    """A command file's line typed after the turn's last request is queued, then starts the
    next turn: its message shows the line typed, as its queued line did, not the template."""
    from test_claude_parity import in_session as in_new_session
    from test_claude_parity import write
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    write(project / ".khaelor" / "commands" / "foo.md", "Please do foo with $ARGUMENTS now.\n")
    fake.enqueue(reply(text("first answer")), reply(text("second answer")))

    async def script(session):
        return await typed_as_the_turn_ends(
            session, "/foo late", ("UserMessageCreated", "SteeringQueued"), "typed")
    said = in_new_session(project, env, monkeypatch, script)
    assert said == [("UserMessageCreated", None), ("SteeringQueued", "/foo late"),
                    ("UserMessageCreated", "/foo late")], said
    assert "Please do foo with late now." in json.dumps(fake.requests[-1]["body"]["messages"])


def test_a_command_file_with_a_model_typed_mid_turn_waits_for_a_turn_on_its_model(
        fake, project, env, monkeypatch):
    """QA: `/foo` whose file names `model: haiku`, typed while a turn ran, was queued as steering
    and taken by the running turn on its model: its own model was lost. It waits now, and starts
    the next turn, on its model; plain steering typed after it still steers the running turn."""
    from test_claude_parity import in_session as in_new_session
    from test_claude_parity import write
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    write(project / ".khaelor" / "commands" / "foo.md", "---\nmodel: haiku\n---\nDo foo $1.\n")
    fake.enqueue(reply(text("Looking."), tool_use("bash", {"command": "sleep 1"})),
                 reply(text("Looked.")), reply(text("Did foo.")))

    async def script(session):
        def type_mid_turn(event):
            if event["type"] == "ToolStarted":
                session.submit("/foo now")
                session.submit("and be brief")
        session.subscribe(type_mid_turn)
        session.submit("look")
        first = session.turn
        await first
        assert session.turn is not first
        await session.turn
        return [(e["type"], e.get("text"), e.get("model")) for e in session.store.events
                if e["type"] in ("UserMessageCreated", "SteeringInjected")]
    said = in_new_session(project, env, monkeypatch, script)
    assert said == [("UserMessageCreated", "look", None), ("SteeringInjected", "and be brief", None),
                    ("UserMessageCreated", "Do foo now.", "claude-haiku-5-5")], said
    models = [request["body"]["model"] for request in fake.requests]
    assert models == ["claude-sonnet-5-5", "claude-sonnet-5-5", "claude-haiku-5-5"], models


def test_a_message_sent_as_the_last_turn_syncs_its_log_begins_a_turn_that_stays_busy(
        fake, project, env, monkeypatch):
    """Found as a flaky replay test: a message sent after a turn's last step, while its task
    synced the log, began a turn that the old task's end then marked idle, so a message sent
    during that turn began a second turn beside it instead of steering it."""
    import asyncio

    from test_claude_parity import in_session as in_new_session
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    fake.enqueue(reply(text("first")),
                 reply(text("second " * 50), chunk=4, stall_after_events=10, stall_seconds=20),
                 reply(text("third")))

    async def script(session):
        session.submit("one")
        first = session.turn
        while session.working:
            await asyncio.sleep(0)
        # the window: the turn has ended, and its task syncs the log
        assert not first.done()
        session.submit("two")
        await first
        busy = session.working
        session.submit("three")
        fake.release()
        while session.working:
            await asyncio.sleep(0.01)
        return busy, [(e["type"], e["text"]) for e in session.store.events
                      if e["type"] in ("UserMessageCreated", "SteeringQueued")]
    busy, said = in_new_session(project, env, monkeypatch, script)
    assert busy
    assert said == [("UserMessageCreated", "one"), ("UserMessageCreated", "two"),
                    ("SteeringQueued", "three")], said


def test_mention_files_are_listed_off_the_event_loop_and_announced(khaelor, fake, project, env, monkeypatch):
    fake.enqueue(reply(text("hello")))
    assert khaelor.run("-p", "hi", "--yes").returncode == 0
    (project / "src").mkdir()
    (project / "src" / "found.py").write_text("x = 1\n")

    async def script(session):
        import asyncio
        listed = asyncio.Event()
        session.subscribe(lambda e: e["type"] == "FilesListed" and listed.set())
        first = session.mention_candidates("")      # returns at once: the listing runs in a thread
        await asyncio.wait_for(listed.wait(), 10)
        return first, session.mention_candidates("f")
    first, later = in_session(project, env, monkeypatch, script)
    assert first == []
    assert "src/found.py" in later and "src/" in later


def test_khaelor_prunes_file_versions_unused_for_thirty_days_at_start(khaelor, fake, env):
    import hashlib
    versions = Path(env["KHAELOR_HOME"]) / "versions"
    versions.mkdir(parents=True)
    old, fresh = versions / hashlib.sha256(b"old").hexdigest(), versions / hashlib.sha256(b"new").hexdigest()
    old.write_bytes(b"old")
    fresh.write_bytes(b"new")
    forty_days_ago = time.time() - 40 * 86400
    os.utime(old, (forty_days_ago, forty_days_ago))
    fake.enqueue(reply(text("hi")))
    assert khaelor.run("-p", "hello").returncode == 0
    assert not old.exists() and fresh.read_bytes() == b"new"


# ---------------------------------------------------------------- issue 13: what the read found

def test_context_shows_the_cached_tokens_of_the_last_response(khaelor, fake, project, env, monkeypatch):
    fake.enqueue(reply(text("first")), reply(text("second")))
    assert khaelor.run("-p", "one " * 3000).returncode == 0
    assert khaelor.run("-c", "-p", "two").returncode == 0
    read = [e for e in khaelor.log() if e["type"] == "ModelResponseCompleted"][-1]["usage"]["cache_read_tokens"]
    assert read > 0

    async def context_command(session):
        return await session.cmd_context("")
    shown = in_session(project, env, monkeypatch, context_command)
    total = next(line for line in shown.splitlines() if line.startswith("- total (measured"))
    assert total.endswith(f", {read} cached") and "cached" in shown.splitlines()[0]


def test_price_overrides_reach_sessions_and_the_json_cost(khaelor, fake, project, env, monkeypatch):
    home = Path(env["KHAELOR_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.json").write_text(json.dumps({"prices": {"claude-sonnet-5-5": [1000, 1000, 1000, 1000]}}))
    fake.enqueue(reply(text("priced")))
    result = khaelor.run("-p", "hello", "--output-format", "json")
    assert result.returncode == 0, result.stderr
    usage = json.loads(result.stdout)["usage_by_model"]["claude-sonnet-5-5"]
    expected = sum(usage.values()) * 1000 / 1e6
    assert json.loads(result.stdout)["cost_usd"] == pytest.approx(expected)
    listing = khaelor.run("sessions")
    assert f"${expected:.4f}" in listing.stdout, listing.stdout

    async def sessions_command(session):
        return await session.cmd_sessions("")
    assert f"${expected:.4f}" in in_session(project, env, monkeypatch, sessions_command)


def test_a_price_that_is_not_four_amounts_is_a_config_error_before_anything_is_sent(tmp_path):
    """"prices": {"claude-x": 3} passed the check, and the first cost raised TypeError (an
    internal error, once the run had spent)."""
    for row in (3, "cheap", [1, 2, 3], [1, 2, 3, -4], [1, 2, 3, True], [1, 2, 3, 1e999], {"a": 1}):
        with pytest.raises(cli.UsageError, match="'prices.claude-x' must be 4 amounts"):
            cli.parse_config(tmp_path / "config.json", json.dumps({"prices": {"claude-x": row}}))
    priced = cli.parse_config(tmp_path / "config.json", '{"prices": {"claude-x": [1, 2, 0.5, 0]}}')
    assert events.cost({"claude-x": {"input_tokens": 10**6}}, priced["prices"]) == 1


def test_pass_env_must_name_variables(tmp_path):
    """"pass_env": [5] passed the check, and every command then failed with an internal
    TypeError (fnmatch of a number)."""
    for names in ([5], ["GITHUB_*", None], [["A"]]):
        with pytest.raises(cli.UsageError, match="'pass_env' must list names or patterns"):
            cli.parse_config(tmp_path / "config.json", json.dumps({"pass_env": names}))
    assert cli.parse_config(tmp_path / "config.json", '{"pass_env": ["GITHUB_*"]}')


def test_user_and_trusted_project_prices_merge_per_model_everywhere(khaelor, fake, project, env):
    """The run's cost and `khaelor sessions` agree: a trusted project's prices win for the models
    they name, the user's still price the others."""
    home = Path(env["KHAELOR_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.json").write_text(json.dumps({"prices": {"claude-sonnet-5-5": [1000] * 4}}))
    (project / ".khaelor").mkdir()
    haiku = {"prices": {"claude-haiku-5-5": [0, 0, 0, 0]}}
    (project / ".khaelor" / "config.json").write_text(json.dumps(haiku))
    assert khaelor.run("trust", "--yes").returncode == 0
    fake.enqueue(reply(text("priced")))
    result = khaelor.run("-p", "hello", "--output-format", "json")
    usage = json.loads(result.stdout)["usage_by_model"]["claude-sonnet-5-5"]
    expected = sum(usage.values()) * 1000 / 1e6
    assert json.loads(result.stdout)["cost_usd"] == pytest.approx(expected)
    assert f"${expected:.4f}" in khaelor.run("sessions").stdout


def test_a_repositorys_own_prices_count_only_once_trusted(khaelor, fake, project, env):
    """A cloned repository must not make a session look cheaper than it is."""
    (project / ".khaelor").mkdir()
    free = {"prices": {"claude-sonnet-5-5": [0, 0, 0, 0]}}
    (project / ".khaelor" / "config.json").write_text(json.dumps(free))
    fake.enqueue(reply(text("first")), reply(text("second")))
    untrusted = khaelor.run("-p", "hello", "--output-format", "json")
    assert untrusted.returncode == 0, untrusted.stderr
    assert json.loads(untrusted.stdout)["cost_usd"] > 0
    assert "sets prices; ignored" in untrusted.stderr and "khaelor trust" in untrusted.stderr
    shown = khaelor.run("trust", "--yes")
    assert shown.returncode == 0 and "its prices for claude-sonnet-5-5 apply" in shown.stdout
    trusted = khaelor.run("-p", "hello", "--output-format", "json")
    assert json.loads(trusted.stdout)["cost_usd"] == 0
    assert "sets prices" not in trusted.stderr


def test_a_repository_raises_no_spending_until_trusted(khaelor, fake, project):
    """A cloned repository's config.json choosing a pricier model, more effort, longer replies
    and more turns: left out (and said) until `khaelor trust`, then applied."""
    (project / ".khaelor").mkdir()
    costly = {"model": "claude-opus-5-5", "effort": "max", "max_output_tokens": 64000,
              "max_turns": 500, "context": {"prune_at": 20000}}
    (project / ".khaelor" / "config.json").write_text(json.dumps(costly))
    fake.enqueue(reply(text("first")), reply(text("second")))
    untrusted = khaelor.run("-p", "hello")
    assert untrusted.returncode == 0, untrusted.stderr
    assert "sets model, effort, max_output_tokens, max_turns; ignored" in untrusted.stderr
    first = fake.requests[-1]["body"]
    assert first["model"] == "claude-sonnet-5-5" and first["max_tokens"] != 64000
    assert "max" not in json.dumps(first.get("output_config", {}))
    shown = khaelor.run("trust", "--yes")
    assert "its model applies" in shown.stdout and "its effort applies" in shown.stdout
    trusted = khaelor.run("-p", "hello")
    assert trusted.returncode == 0, trusted.stderr
    assert fake.requests[-1]["body"]["model"] == "claude-opus-5-5"
    assert fake.requests[-1]["body"]["max_tokens"] == 64000
    assert fake.requests[-1]["body"]["output_config"] == {"effort": "max"}
    assert "ignored" not in trusted.stderr


def test_a_failed_continue_does_not_print_the_previous_answer(khaelor, fake):
    from fake_api import error
    fake.enqueue(reply(text("the first answer")))
    assert khaelor.run("-p", "first").returncode == 0
    fake.enqueue(*[error("api_error", "Internal server error", status=500, **{"retry-after": "0.01"})] * 5)
    result = khaelor.run("-c", "-p", "second")
    assert result.returncode == 1
    assert "the first answer" not in result.stdout and result.stdout == ""


def test_compact_says_when_nothing_was_compacted_and_waits_for_the_turn(khaelor, fake, project, env, monkeypatch):
    import asyncio
    fake.enqueue(reply(text("hi")))
    assert khaelor.run("-p", "hello").returncode == 0

    async def script(session):
        fake.enqueue(reply(text('{"objective": "say hello"}')))
        done = await session.cmd_compact("")
        compacted = session.store.state.cut_seq
        nothing = await session.cmd_compact("")      # no new turn since the cut
        fake.enqueue(reply(text("slow " * 200), chunk=5, delay=0.02))
        n_requests = len(fake.requests)
        session.submit("write a lot")
        while len(fake.requests) == n_requests:
            await asyncio.sleep(0.02)
        cut_seq = session.store.state.cut_seq
        during = await session.cmd_compact("")
        session.interrupt()
        return done, compacted, nothing, during, cut_seq == session.store.state.cut_seq
    done, compacted, nothing, during, unchanged = in_session(project, env, monkeypatch, script)
    # a compaction confirms by its own event line only (issue 22 item 14)
    assert done == "" and compacted and nothing.startswith("nothing to compact")
    assert during.startswith("khaelor is working") and unchanged


def test_meta_caches_are_private_like_the_logs(khaelor, fake):
    fake.enqueue(reply(text("hi")))
    assert khaelor.run("-p", "hello").returncode == 0
    log = khaelor.session_files()[-1]
    meta = events.meta_path(log)
    assert meta.exists() and meta.stat().st_mode & 0o777 == 0o600 == log.stat().st_mode & 0o777
    loose = log.parent / "composer-history"
    loose.write_text("")
    loose.chmod(0o644)
    assert events.private_file(loose).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("turns", [0, -1])
def test_max_turns_below_one_is_a_usage_error_in_config_and_flag(turns, tmp_path):
    """--max-turns 0 (or -1, or the same in a config) ran nothing and failed as "stopped after
    --max-turns 0 model responses", exit 1, a session left behind: a usage error, as
    max_output_tokens below 1 is."""
    with pytest.raises(cli.UsageError, match="'max_turns' must be a positive number"):
        cli.parse_config(tmp_path / "config.json", json.dumps({"max_turns": turns}))
    with pytest.raises(SystemExit) as exited:
        cli.parse_args(["-p", "hi", "--max-turns", str(turns)])
    assert exited.value.code == 2


def test_khaelor_sandbox_without_a_command_says_so_once(tmp_path):
    """main prints "khaelor: " before a usage error: the message itself does not say it again."""
    for argv in ([], ["--"], ["--write", "--"]):
        with pytest.raises(cli.UsageError) as raised:
            cli.cmd_sandbox(argv, tmp_path / "home", tmp_path)
        assert str(raised.value) == "sandbox: name a command after --"


def test_continue_and_resume_together_is_a_usage_error(khaelor, fake):
    """`-c -r ID` was taken (the id won, silently): they name two sessions; say so, exit 2."""
    fake.enqueue(reply(text("one")))
    assert khaelor.run("-p", "first").returncode == 0
    session_id = khaelor.session_files()[-1].stem
    result = khaelor.run("-c", "-r", session_id, "-p", "second")
    assert result.returncode == 2 and "-c" in result.stderr and "-r" in result.stderr, result.stderr
    assert len(fake.requests) == 1


def test_resume_of_no_such_session_in_the_app_points_at_slash_sessions(project, env, monkeypatch):
    """QA: `/resume zzz` in the app said "✗ The command failed:" and gave the CLI's hint
    (`khaelor sessions`): it answers, naming /sessions."""
    from test_claude_parity import in_session as in_new_session

    async def resume(session):
        return await session.run_command("/resume zzz")
    said = in_new_session(project, env, monkeypatch, resume)
    assert said == "no session 'zzz' in this project; `/sessions` lists them"


# ---------------------------------------------------------------- what a command answered, replayed

def shown_and_replayed(live, session, width):
    """(the live pyte screen above the status line, the replay of the log on disk as pyte shows
    it, the log)."""
    import pyte
    import ui
    rows = [row.rstrip() for row in live.display]
    composer = next(k for k, row in enumerate(rows) if row.startswith("❯"))
    log = [json.loads(line) for line in session.store.path.read_text().splitlines()]
    replayed = pyte.Screen(width, 500)
    lines = ui.render_transcript(log, width, max_turns=ui.REPLAY_TURNS)
    pyte.ByteStream(replayed).feed("\r\n".join(lines).encode())
    shown = "\n".join(rows[:composer - 1]).rstrip()
    return shown, "\n".join(row.rstrip() for row in replayed.display).rstrip(), log


def live_and_replayed(session, typed, width):
    """Type each line into a real ui.App over `session`, each run to its end; then the screen as
    it was left (above the status line) and the replay of the log on disk, as pyte shows them."""
    import asyncio

    import pyte
    import ui

    async def run():
        tasks = []
        app = ui.App(session, style=ui.Style(False), width=width, height=500,
                     spawn=lambda awaitable: tasks.append(asyncio.ensure_future(awaitable)))
        session.subscribe(app.on_event)
        live = pyte.Screen(width, 500)
        screen = pyte.ByteStream(live)
        for line in typed:
            app.on_event({"type": "Typed", "text": line})
            while tasks or session.busy:
                await asyncio.gather(*tasks)
                tasks.clear()
                await asyncio.sleep(0.01)
            screen.feed(app.render(time.monotonic()))
        return shown_and_replayed(live, session, width)
    return run()


@pytest.mark.parametrize("width", [80, 44])
def test_a_resumed_session_replays_what_each_command_answered_where_it_was(fake, project, env,
                                                                          monkeypatch, width):
    """QA: after quitting and `khaelor -c`, the replay showed the conversation and the ◇ lines but
    not what /status, /cost, /diff, /undo, /rewind, /model or an unknown command had answered: the
    screen was not the one the user left. Each answer is logged (CommandAnswered, /help's but not)
    and drawn again where it was, at any width; no request carries one."""
    from test_claude_parity import in_session as in_new_session
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    fake.enqueue(reply(text("First **reply**, in a paragraph long enough to wrap at 44 columns.")),
                 reply(text("Second reply.")))
    typed = ["/status", "/model haiku", "hello", "/cost", "/nonsense", "/effort low", "/diff",
             "/undo", "!echo from-the-shell", "/rewind", "again", "/model", "/help"]
    shown, replayed, log = in_new_session(
        project, env, monkeypatch, lambda session: live_and_replayed(session, typed, width))
    assert "unknown command /nonsense" in shown and "Second reply." in shown
    # /help is a view, the same each time: shown, not kept
    help_rows = shown.index("\n› /help")
    assert replayed == shown[:help_rows].rstrip()
    answers = [e for e in log if e["type"] == "CommandAnswered"]
    assert [e["command"] for e in answers] == ["/status", "/model haiku", "/cost", "/nonsense",
                                               "/diff", "/undo", "/rewind", "/model"]
    # what came before the first message is logged with it, ahead of what it chose
    assert [e["type"] for e in log[:4]] == ["SessionCreated", "CommandAnswered",
                                            "CommandAnswered", "ModelChanged"]
    sent = [json.dumps(request["body"], ensure_ascii=False) for request in fake.requests]
    assert len(sent) == 2
    for answer in answers:
        for line in answer["text"].splitlines():
            quoted = json.dumps(line, ensure_ascii=False)[1:-1]
            assert len(line) < 12 or not any(quoted in body for body in sent), line


@pytest.mark.parametrize("width", [80, 44])
def test_each_command_shows_its_line_then_its_answer_or_failure_live_and_replayed(
        fake, project, env, monkeypatch, width):
    """QA: a command that raised showed "✗ The command failed: …" and a resume showed nothing of
    it (it was not logged); and no answer said which command it answered (Claude Code shows
    `> /cost` above it). The line typed shows above its answer or its failure, live and replayed."""
    from test_claude_parity import in_session as in_new_session
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    fake.enqueue(reply(text("Hello.")))

    def script(session):
        # a folder where a permission file goes: /new cannot read it, and says so
        (project / ".khaelor" / "config.json").mkdir(parents=True)
        return live_and_replayed(session, ["/cost", "hello", "/new", "/cost"], width)
    shown, replayed, log = in_new_session(project, env, monkeypatch, script)
    assert replayed == shown, shown
    rows = shown.splitlines()
    failed = rows.index("› /new")
    assert rows[failed + 1].startswith("✗ The command failed:")
    assert "(Is a directory)" in " ".join(shown.split())
    assert rows[rows.index("› /cost") + 1] == "no model calls yet"
    cost = len(rows) - rows[::-1].index("› /cost") - 1
    assert rows[cost + 1].startswith("• claude-sonnet-5-5: input ")
    answers = [(e["command"], e.get("failed", False)) for e in types(log, "CommandAnswered")]
    assert answers == [("/cost", False), ("/new", True), ("/cost", False)]


@pytest.mark.parametrize("width", [80, 44])
def test_a_command_that_answers_with_its_own_line_shows_what_was_typed_live_and_replayed(
        fake, project, env, monkeypatch, width):
    """QA: `/rename x`, `/model X`, `/effort L`, `/thinking T` and `/compact` answer with a ◇ line
    of their own event (no text): the line typed showed above a text answer but above none of
    these, and a resume had to agree. Each shows `› /cmd …` above its ◇ line, live and replayed,
    in the order typed; an answer that follows the ◇ line does not say the line again, and the
    same command typed again (an answer, no ◇ line) says it."""
    from test_claude_parity import in_session as in_new_session
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    fake.enqueue(reply(text("First reply.")), reply(text("The summary.")),
                 reply(text("Second reply.")))
    typed = ["/rename before", "hello", "/rename my title", "/model haiku", "/effort low",
             "/thinking off", "/thinking off", "/compact", "again"]
    shown, replayed, log = in_new_session(
        project, env, monkeypatch, lambda session: live_and_replayed(session, typed, width))
    assert replayed == shown, shown
    rows = shown.splitlines()
    confirmed = {"/rename before": "◇ Session: before", "/rename my title": "◇ Session: my title",
                 "/model haiku": "◇ Model: claude-haiku-5-5",
                 "/effort low": "◇ effort low from the next message",
                 "/thinking off": "◇ thinking off from the next message",
                 "/compact": "◇ Context compacted: earlier turns are now a summary"}
    for line, note in confirmed.items():
        # (at 44 columns a note wraps)
        assert note.startswith(rows[rows.index("› " + line) + 1]), shown
    # in the order typed, each once but the /thinking typed twice
    echoes = [row[2:] for row in rows if row.startswith("› ")]
    assert echoes == typed, echoes
    # the first /thinking off's answer (a note) follows its ◇ line; the second answers alone
    first = rows.index("› /thinking off")
    assert rows[first + 2] == "" and "thinking" in rows[first + 3], shown
    again = len(rows) - rows[::-1].index("› /thinking off") - 1
    assert rows[again + 1] == "thinking is off already", shown
    stamped = [(e["type"], e["typed"]) for e in log if "typed" in e]
    assert stamped == [("SessionRenamed", "/rename before"),
                       ("SessionRenamed", "/rename my title"), ("ModelChanged", "/model haiku"),
                       ("ThinkingChanged", "/effort low"), ("ThinkingChanged", "/thinking off"),
                       ("ContextCompacted", "/compact")]
    answers = [(e["command"], e.get("echoed", False)) for e in types(log, "CommandAnswered")]
    assert answers == [("/thinking off", True), ("/thinking off", False)]


def test_processes_stop_shows_the_line_typed_above_the_process_line_live_and_replayed(
        fake, project, env, monkeypatch):
    """QA: `/processes stop p1` showed the process's ◆ line above the line typed, then the
    report: the line typed first, once, then the ◆ line, then the report, live and replayed."""
    from test_claude_parity import in_session as in_new_session
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)

    async def script(session):
        session.begin()
        session.bus.emit("UserMessageCreated", text="start it")
        await session.toolbox.run("process", {"action": "start", "command": "sleep 30"}, "t1")
        return await live_and_replayed(session, ["/processes stop p1"], 60)
    shown, replayed, log = in_new_session(project, env, monkeypatch, script)
    assert replayed.endswith(shown), (shown, replayed)
    assert shown.startswith("› /processes stop p1\n◆ process p1: stopped, exit code -15\n\n"
                            "````\n[p1 · stopped"), shown
    assert shown.count("› /processes stop p1") == 1, shown
    exited = types(log, "ProcessExited")
    assert [e.get("typed") for e in exited] == ["/processes stop p1"], exited
    assert [e.get("echoed") for e in types(log, "CommandAnswered")] == [True]


def test_a_log_from_before_the_typed_line_replays_as_it_did(fake, project, env, monkeypatch):
    """A log written before `typed` and `echoed` (none of its events has them) replays as then:
    the ◇ lines without a line typed above them, each answer under its command."""
    import pyte
    import ui
    from test_claude_parity import in_session as in_new_session
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    typed = ["/rename a title", "/model haiku", "/thinking off"]
    _, _, log = in_new_session(
        project, env, monkeypatch, lambda session: live_and_replayed(session, typed, 60))
    for event in log:
        event.pop("typed", None)
        event.pop("echoed", None)
    screen = pyte.Screen(60, 100)
    pyte.ByteStream(screen).feed("\r\n".join(ui.render_transcript(log, 60)).encode())
    rows = [row.rstrip() for row in screen.display if row.strip()]
    assert rows[:4] == ["◇ Session: a title", "◇ Model: claude-haiku-5-5",
                        "◇ thinking off from the next message", "› /thinking off"], rows
    assert "thinking" in rows[4], rows


def test_answers_before_a_first_message_stay_out_of_the_session_resumed_next(khaelor, fake,
                                                                            project, env,
                                                                            monkeypatch):
    """QA: `/status` then `/resume OLD` in a new session showed the answer above the resumed
    conversation, but it was written in OLD's log after it, so `khaelor -c` showed it below. The
    answers belong to the session they were given in, and a session with no message leaves no
    log: they go with it. What /resume answered is OLD's, below its conversation, both times."""
    from test_claude_parity import in_session as in_new_session
    fake.enqueue(reply(text("The old reply.")))
    assert khaelor.run("-p", "old question").returncode == 0
    old = khaelor.session_files()[-1].stem
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    shown, replayed, log = in_new_session(
        project, env, monkeypatch,
        lambda session: live_and_replayed(session, ["/status", f"/resume {old}", "/cost"], 80))
    assert shown.startswith("› /status\n• version: ") and "› old question" in shown
    assert shown.endswith(replayed) and replayed.startswith("› old question"), replayed
    answers = [e["command"] for e in log if e["type"] == "CommandAnswered"]
    assert answers == [f"/resume {old}", "/cost"]
    assert [path.stem for path in khaelor.session_files()] == [old]


def live_and_replayed_mid_reply(session, steps, width):
    """As live_and_replayed, each step a line typed (a command run to its end, a message's turn
    not), then, while the turn streams, a wait for an
    event (a predicate), a file touched (a Path: a stalled stream goes on) or a key pressed, and a
    frame drawn."""
    import asyncio

    import pyte
    import ui

    async def run():
        tasks = []
        app = ui.App(session, style=ui.Style(False), width=width, height=500,
                     spawn=lambda awaitable: tasks.append(asyncio.ensure_future(awaitable)))
        seen = []
        session.subscribe(app.on_event)
        session.subscribe(seen.append)
        live = pyte.Screen(width, 500)
        screen = pyte.ByteStream(live)
        for step in steps:
            if isinstance(step, str):
                # a wait is for what comes after the line typed last
                del seen[:]
                app.on_event({"type": "Typed", "text": step})
                # a command runs to its end (a message's turn goes on)
                await asyncio.gather(*tasks)
            elif isinstance(step, Path):
                step.touch()
            elif isinstance(step, ui.Key):
                app.on_key(step)
            while callable(step) and not any(step(e) for e in seen):
                await asyncio.sleep(0.01)
            screen.feed(app.render(time.monotonic()))
        while session.busy:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        screen.feed(app.render(time.monotonic()))
        return shown_and_replayed(live, session, width)
    return run()


@pytest.mark.parametrize("width", [80, 44])
def test_commands_answered_while_a_reply_thinks_or_streams_replay_where_they_were_shown(
        fake, project, env, monkeypatch, tmp_path, width):
    """QA: `/cost` typed while a reply streamed showed after the reply, but a resume showed it
    above the reply: its answer was logged before any of the streamed text (the text is saved a
    few times a second, and at the block's end). The text streamed so far is saved before
    anything logged in its middle; and what comes in the middle of thinking shows above it live,
    as in the log."""
    from fake_api import thinking
    from test_claude_parity import in_session as in_new_session
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    # the clock's save would come first and hide the gap: it is not due while the test types
    monkeypatch.setattr(kernel, "CHECKPOINT_INTERVAL_S", 600)
    thought, streamed = tmp_path / "thought", tmp_path / "streamed"
    fake.enqueue(reply(thinking("Let me plan. " * 10), text("A thought-out reply."), chunk=6,
                       stall_after_events=6, stall_seconds=20, release_file=str(thought)),
                 reply(text("The first words of a reply.\n\nMore " + "words " * 30), chunk=6,
                       stall_after_events=8, stall_seconds=20, release_file=str(streamed)))

    steps = ["think", lambda e: e["type"] == "ThinkingDelta" and e["text"], "/status", thought,
             lambda e: e["type"] == "TaskCompleted", "write", lambda e: e["type"] == "TextDelta",
             "/cost", streamed]
    shown, replayed, log = in_new_session(
        project, env, monkeypatch, lambda session: live_and_replayed_mid_reply(session, steps,
                                                                               width))
    assert "A thought-out reply." in shown and "More words" in shown and "• model:" in shown
    assert replayed == shown, shown
    words = " ".join(shown.split())
    order = [words.index(needle) for needle in ("Thinking", "A thought-out reply.",
                                                "The first words", "More words", "output")]
    assert order == sorted(order), shown


@pytest.mark.parametrize("width", [80, 44])
def test_thinking_cut_off_by_esc_replays_as_its_line_showed_and_is_never_sent(
        fake, project, env, monkeypatch, width):
    """QA (tmux): Esc while the model thought left `✻ Thinking · 1s · Plan it…` on the screen,
    and `khaelor -c` showed nothing there: only a finished thinking block was logged. Interrupted
    keeps what streamed of it and how long it took, for the screen only: no request carries it."""
    import ui
    from fake_api import thinking
    from test_claude_parity import in_session as in_new_session
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    fake.enqueue(reply(thinking("Plan it carefully. " * 20), text("never shown"), chunk=6,
                       stall_after_events=8, stall_seconds=20),
                 reply(text("Went on.")))
    steps = ["think", lambda e: e["type"] == "ThinkingDelta" and e["text"], ui.Key("esc"),
             lambda e: e["type"] == "Interrupted", "go on", lambda e: e["type"] == "TaskCompleted"]
    shown, replayed, log = in_new_session(
        project, env, monkeypatch, lambda session: live_and_replayed_mid_reply(session, steps,
                                                                               width))
    assert replayed == shown, shown
    rows = shown.splitlines()
    line = next(k for k, row in enumerate(rows) if row.startswith("✻ Thinking · "))
    # (Esc follows the first delta: 6 characters of it are sure to have streamed)
    assert "Plan i" in rows[line] and rows[line + 2].startswith("■ Interrupted")
    cut = types(log, "Interrupted")[0]
    # what had streamed of it when Esc came: a prefix, as long as the deltas that had arrived
    assert cut["thinking"] and ("Plan it carefully. " * 20).startswith(cut["thinking"])
    assert cut["thinking_ms"] >= 0
    sent = json.dumps(fake.requests[-1]["body"]["messages"])
    assert "Plan it" not in sent and "Went on." in shown


@pytest.mark.parametrize("cut", ["thinking", "text", "retries exhausted"])
def test_a_reply_an_api_error_ends_mid_block_replays_as_the_screen_showed_it(
        fake, project, env, monkeypatch, cut):
    """An error event mid-stream that no retry follows (or the last retry's): the screen kept the
    thinking's line and every word that had streamed, but the log lost the thinking and the text
    since the last save (a quarter of a second of it), so a resume showed less. Both are saved as
    the stream ends."""
    import model
    from fake_api import thinking
    from test_claude_parity import in_session as in_new_session
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    # the clock's save would hide the loss: it is not due while the reply streams
    monkeypatch.setattr(kernel, "CHECKPOINT_INTERVAL_S", 600)
    monkeypatch.setattr(model, "BASE_DELAY_S", 0.01)
    block = thinking("Plan it carefully. " * 20) if cut == "thinking" else text("Said so far. " * 9)
    error = {"stream_error": {"type": "invalid_request_error", "message": "cut short",
                              "after_events": 14}}
    if cut == "retries exhausted":
        error = {"drop_after_events": 14}
    for _ in range(model.MAX_ATTEMPTS if cut == "retries exhausted" else 1):
        fake.enqueue({"content": [block, text("never shown")], "chunk": 6, **error})
    steps = ["go", lambda e: e["type"] == "TaskFailed"]
    shown, replayed, log = in_new_session(
        project, env, monkeypatch, lambda session: live_and_replayed_mid_reply(session, steps, 80))
    assert replayed == shown, shown
    kept = "✻ Thinking · 1s · Plan it carefully." if cut == "thinking" else "Said so far."
    assert kept in shown
    assert "never shown" not in shown
    failed = types(log, "ModelRequestFailed")[-1]
    assert failed["retrying"] is False and failed["message"] in " ".join(shown.split())


@pytest.mark.parametrize("width", [80, 44])
def test_a_command_file_shows_the_line_typed_not_its_template_live_and_replayed(
        fake, project, env, monkeypatch, width):
    """QA: `/foo bar` from a commands folder showed its filled-in template as the user's message,
    and `khaelor -c` too, where Claude Code shows the line typed. The line typed shows, as a
    message and as steering typed while a turn runs, live and replayed; the model gets the
    template."""
    from test_claude_parity import in_session as in_new_session
    from test_claude_parity import write
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    write(project / ".khaelor" / "commands" / "foo.md", "Please do foo with $ARGUMENTS now.\n")
    fake.enqueue(reply(text("Did foo.")),
                 reply(text("A reply, " + "word " * 100), chunk=4, stall_after_events=10,
                       stall_seconds=20),
                 reply(text("Did foo again.")))
    steps = ["/foo bar", lambda e: e["type"] == "TaskCompleted", "hello",
             lambda e: e["type"] == "TextDelta", "/foo baz",
             lambda e: e["type"] == "SteeringQueued" and (fake.release() or True),
             lambda e: e["type"] == "TaskCompleted"]
    shown, replayed, log = in_new_session(
        project, env, monkeypatch,
        lambda session: live_and_replayed_mid_reply(session, steps, width))
    assert replayed == shown, (shown, replayed)
    assert shown.startswith("› /foo bar\n\nDid foo.") and "Please do" not in shown, shown
    assert "Queued instruction: /foo baz" in shown, shown
    said = [(e["type"], e["text"], e.get("typed")) for e in log
            if e["type"] in ("UserMessageCreated", "SteeringQueued")]
    assert said == [("UserMessageCreated", "Please do foo with bar now.", "/foo bar"),
                    ("UserMessageCreated", "hello", None),
                    ("SteeringQueued", "Please do foo with baz now.", "/foo baz")], said
    sent = json.dumps(fake.requests[-1]["body"]["messages"])
    assert "Please do foo with bar now." in sent and "Please do foo with baz now." in sent
    assert "/foo" not in sent


def test_export_holds_what_the_screen_showed_answers_shell_and_a_cut_off_reply_in_order(
        fake, project, env, monkeypatch, tmp_path):
    """QA: /export wrote the messages, replies and tool calls only: no command's answer, no `!`
    command, no reply cut off by Esc. It holds what the screen showed, in its order, an answer
    marked as a command's output (one that came mid-reply after the reply, as on screen)."""
    import ui
    from test_claude_parity import in_session as in_new_session
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    fake.enqueue(reply(text("Hello back.")),
                 reply(text("A long reply, " + "word " * 200), chunk=4, stall_after_events=10,
                       stall_seconds=20))
    out = tmp_path / "out.md"
    steps = ["/status", "hello", lambda e: e["type"] == "TaskCompleted", "!echo shell-ran",
             lambda e: e["type"] == "UserShellRan", "write more",
             lambda e: e["type"] == "TextDelta", "/cost", ui.Key("esc"),
             lambda e: e["type"] == "Interrupted", f"/export {out}"]
    shown, replayed, log = in_new_session(
        project, env, monkeypatch, lambda session: live_and_replayed_mid_reply(session, steps, 80))
    exported = out.read_text()
    needles = ["**`/status`** · command output\n\n> - version: ", "## You\n\nhello",
               "Hello back.", "**!** `echo shell-ran`", "\nshell-ran\n", "## You\n\nwrite more",
               "A long reply, word", "**`/cost`** · command output", "> - claude-sonnet-5-5: ",
               "*Interrupted*"]
    at = [exported.index(needle) for needle in needles]
    assert at == sorted(at), exported
    words = " ".join(shown.split())
    on_screen = [words.index(n) for n in ("A long reply", "› /cost", "■ Interrupted")]
    assert on_screen == sorted(on_screen) and replayed == shown


def test_export_holds_each_line_typed_and_each_note_the_screen_showed_in_order(
        fake, project, env, monkeypatch, tmp_path):
    """QA: /export left out the ◇ lines (`◇ Session: …`, `◇ Model: …`, `◇ thinking off …`) and the
    line typed above each, and wrote a command file's template where the screen showed `/foo bar`.
    Each `› ` line and each ◇ line of the screen is in the export, in the screen's order."""
    from test_claude_parity import in_session as in_new_session
    from test_claude_parity import write
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    write(project / ".khaelor" / "commands" / "foo.md", "Please do foo with $ARGUMENTS now.\n")
    fake.enqueue(reply(text("Hello back.")), reply(text("Did foo.")))
    out = tmp_path / "out.md"
    typed = ["/rename my title", "hello", "/model haiku", "/thinking off", "/thinking off",
             "/foo bar", "/cost", f"/export {out}"]
    shown, replayed, log = in_new_session(
        project, env, monkeypatch, lambda session: live_and_replayed(session, typed, 200))
    exported = out.read_text()
    at = 0
    for row in shown.split("\n› /export")[0].splitlines():
        if row.startswith("◇ "):
            needles = [row]
        elif row.startswith("› "):
            needles = [f"**`{row[2:]}`**", f"## You\n\n{row[2:]}"]
        else:
            continue
        found = [exported.find(needle, at) for needle in needles]
        assert max(found) >= 0, (row, exported[at:])
        at = min(k for k in found if k >= 0) + 1
    assert "Please do foo" not in exported and "◇ Model: claude-haiku-5-5" in exported
    # the first /thinking off's answer follows its ◇ line, without its line again
    assert "**`/thinking off`**\n\n◇ thinking off from the next message\n\n> " in exported
    assert exported.count("**`/thinking off`**") == 2, exported


def test_export_says_a_call_was_denied_and_what_the_model_was_told():
    """QA (tmux): a call denied at the panel showed `✗ Denied: touch b.txt · told the model: not
    now` on screen; /export had the call and nothing after it, as if it had run."""
    log = [{"type": "UserMessageCreated", "text": "make b"},
           {"type": "ToolRequested", "tool_use_id": "t1", "name": "bash",
            "input": {"command": "touch b.txt"}},
           {"type": "PermissionDenied", "tool_use_id": "t1", "reason": "denied by the user",
            "feedback": "not now", "by": "user"},
           {"type": "ModelTextBlockCompleted", "text": "Denied, fine."}]
    exported = cli.transcript_markdown(log)
    assert '**bash** `{"command": "touch b.txt"}`\n\n✗ Denied · told the model: not now\n\n' \
           "Denied, fine." in exported, exported


def test_export_keeps_one_blank_line_between_parts_whatever_newlines_a_text_ends_with():
    """QA: a reply ending in "\\n\\n" (as one before a tool call does), a paste ending in a
    newline, a command's answer or a tool's output ending in one: /export piled blank lines (and
    empty `> ` quote lines) after each, where the screen shows one gap."""
    log = [{"type": "UserMessageCreated", "text": "pasted\ncode\n\n"},
           {"type": "ModelTextBlockCompleted", "text": "Let me look.\n\n"},
           {"type": "ToolRequested", "tool_use_id": "t1", "name": "bash", "input": {"command": "ls"}},
           {"type": "ToolCompleted", "tool_use_id": "t1", "name": "bash", "output": "a\nb\n"},
           {"type": "CommandAnswered", "command": "/cost", "text": "cost line\n\n"},
           {"type": "ModelTextBlockCompleted", "text": "Done.\n\n\n"}]
    exported = cli.transcript_markdown(log)
    assert exported == ('## You\n\npasted\ncode\n\nLet me look.\n\n**bash** `{"command": "ls"}`'
                        "\n\n````\na\nb\n````\n\n**`/cost`** · command output\n\n> cost line"
                        "\n\nDone.\n"), exported


def test_export_before_the_first_message_writes_no_file(project, env, monkeypatch):
    """QA (tmux): /export in a session with no message yet wrote a file of one empty line into
    the project (named for a session that would never have a log) and said it had."""
    from test_claude_parity import in_session as in_new_session

    async def export(session):
        return await session.cmd_export("")
    answer = in_new_session(project, env, monkeypatch, export)
    assert answer.startswith("nothing to export yet") and not list(project.glob("*.md")), answer


def test_a_huge_answer_is_shown_whole_and_logged_without_its_middle_saying_so(khaelor, fake, project,
                                                                              env, monkeypatch):
    """A command's answer is logged up to MAX_KEPT_ANSWER characters: a long /diff keeps its start
    and its end, and the replay says how much was left out."""
    fake.enqueue(reply(text("hi")))
    assert khaelor.run("-p", "hello").returncode == 0
    huge = "\n".join(f"line {k} of a long /diff" for k in range(3000))

    async def answer(session):
        return session.record_answer("/diff", huge)
    assert in_session(project, env, monkeypatch, answer) == huge     # what the screen shows
    logged = types(khaelor.log(), "CommandAnswered")[-1]["text"]
    half = cli.MAX_KEPT_ANSWER // 2
    left_out = f"\n[… {len(huge) - cli.MAX_KEPT_ANSWER} characters omitted …]\n"
    assert logged == huge[:half] + left_out + huge[-half:]
