"""The permission gate wired into the kernel, end to end: real CLI or real Kernel, real SDK, fake API."""
import contextlib
import hashlib
import json
import os
import pty
from pathlib import Path

from fake_api import reply, text, tool_use


def tool_results(fake, i=-1):
    return [b for m in fake.requests[i]["body"]["messages"] for b in m["content"] if b["type"] == "tool_result"]


def test_headless_denies_a_write_leaves_the_file_untouched_and_tells_the_model(khaelor, fake, project):
    (project / "keep.txt").write_text("original\n")
    fake.enqueue(reply(tool_use("bash", {"command": "echo changed > keep.txt"})), reply(text("could not write")))
    result = khaelor.run("-p", "change keep.txt")
    assert result.returncode == 0, result.stderr
    assert (project / "keep.txt").read_text() == "original\n"
    denial = tool_results(fake)[0]
    assert denial["is_error"] and "Permission denied" in denial["content"]
    assert "echo changed > keep.txt" in result.stderr and "--yes" in result.stderr
    assert fake.rejections == []


def test_yes_cannot_get_past_the_hardline_floor(khaelor, fake, tmp_path):
    victim = tmp_path / "user-home"
    victim.mkdir(exist_ok=True)
    (victim / "precious").write_text("x")
    fake.enqueue(reply(tool_use("bash", {"command": "r\\m -r\"f\" ~"})), reply(tool_use("bash", {"command": "rm -rf /"})),
                 reply(text("refused")))
    result = khaelor.run("-p", "clean everything", "--yes")
    assert result.returncode == 0, result.stderr
    assert (victim / "precious").exists()
    results = tool_results(fake)
    assert len(results) == 2 and all("hardline" in r["content"] for r in results)
    log = khaelor.log()
    assert not [e for e in log if e["type"] == "ToolStarted"]


def test_a_cloned_config_grants_nothing_until_trusted_and_a_change_withdraws_the_trust(khaelor, fake, project):
    """A repository that ships .khaelor/config.json allowing a command: the first run asks (and,
    headless, is denied); `khaelor trust` shows the grant and records the file's hash; editing
    the file afterwards withdraws the trust until the user runs it again."""
    config = project / ".khaelor" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(
        {"permissions": [{"capability": "process.execute", "pattern": "touch *", "action": "allow"}]}))
    fake.enqueue(reply(tool_use("bash", {"command": "touch made.txt"})), reply(text("could not")))
    first = khaelor.run("-p", "make a file")
    assert not (project / "made.txt").exists()
    assert "khaelor trust" in first.stderr and "denied" in first.stderr

    trusted = khaelor.run("trust", "--yes")
    assert trusted.returncode == 0 and "allow process.execute 'touch *'" in trusted.stdout
    fake.enqueue(reply(tool_use("bash", {"command": "touch made.txt"})), reply(text("made")))
    assert khaelor.run("-p", "make a file").returncode == 0
    assert (project / "made.txt").exists()

    config.write_text(config.read_text().replace("touch *", "touch *") + "\n")     # any change at all
    fake.enqueue(reply(tool_use("bash", {"command": "touch again.txt"})), reply(text("could not")))
    khaelor.run("-p", "make another")
    assert not (project / "again.txt").exists()
    listing = khaelor.run("permissions").stdout
    assert "untrusted" in listing and "ignored" in listing


def test_an_untrusted_project_config_still_tightens(khaelor, fake, project):
    config = project / ".khaelor" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"permissions": [{"capability": "process.execute", "pattern": "ls *",
                                                   "action": "deny"}]}))
    fake.enqueue(reply(tool_use("bash", {"command": "ls"})), reply(text("ok")))
    assert khaelor.run("-p", "list", "--yes").returncode == 0
    results = tool_results(fake)
    assert "deny process.execute" in results[0]["content"]


def test_no_always_is_offered_for_a_write_that_git_or_the_editor_runs_later(fake, project,
                                                                             kernel_turn):
    """A write into .git/hooks or .vscode/ is a person's to approve each time: "always" saved a
    grant under which later writes there went unasked (a hook planted at the next step)."""
    fake.enqueue(reply(tool_use("write", {"file_path": str(project / ".vscode" / "tasks.json"),
                                          "content": "{}"})),
                 reply(tool_use("write", {"file_path": str(project / "notes.txt"),
                                          "content": "x"})),
                 *[reply(text("done"))] * 4)     # (and the verification and the title ask too)
    asked = []

    async def ask(request):
        asked.append(request)
        return "once", ""

    assert kernel_turn("write two files", ask)[0] == "done"
    assert asked[0]["suggestion"] is None and asked[1]["suggestion"], asked


def test_an_always_grant_is_persisted_and_honoured_by_a_new_process(khaelor, fake, project, kernel_turn):
    """The kernel is driven in-process with a user who answers "always"; a fresh `khaelor -p`
    without --yes then runs the same kind of command because the grant is in the project config."""
    fake.enqueue(reply(tool_use("bash", {"command": "git init -q newrepo"})), reply(text("initialised")))
    asked = []

    async def ask(request):
        asked.append(request)
        return "always", ""

    assert kernel_turn("init a repo", ask)[0] == "done"
    assert asked[0]["suggestion"] == {"capability": "process.execute", "pattern": "git init *"} or \
        asked[0]["suggestion"]["pattern"] == "git init *"
    assert not (project / ".khaelor").exists()          # never written into the repository
    saved_files = list((Path(khaelor.env["KHAELOR_HOME"]) / "grants").glob("*.json"))
    saved = json.loads(saved_files[0].read_text())
    assert any(r["pattern"] == "git init *" and r["action"] == "allow" for r in saved["permissions"])
    assert (project / "newrepo" / ".git").is_dir()

    fake.enqueue(reply(tool_use("bash", {"command": "git init -q second"})), reply(text("again")))
    result = khaelor.run("-p", "init another")     # a new process, no --yes
    assert result.returncode == 0, result.stderr
    assert (project / "second" / ".git").is_dir()
    assert fake.rejections == []


def test_permissions_check_reports_decisions_as_json(khaelor):
    floor = json.loads(khaelor.run("permissions", "check", "--json", "--bash", "sudo rm -rf /").stdout)
    assert floor == {**floor, "decision": "deny", "floor": True}
    ls = json.loads(khaelor.run("permissions", "check", "--json", "--bash", "ls -la").stdout)
    assert ls["decision"] == "allow" and ls["floor"] is False
    push = json.loads(khaelor.run("permissions", "check", "--json", "--bash", "git push origin main").stdout)
    assert push["decision"] == "ask" and push["suggestion"] == "git push *"
    # --json before `check` too
    outside = json.loads(khaelor.run("permissions", "--json", "check", "--write", "../elsewhere.txt").stdout)
    assert outside["capability"] == "filesystem.outsideProject" and outside["decision"] == "ask"
    listing = khaelor.run("permissions")
    assert listing.returncode == 0 and "default" in listing.stdout


def test_an_edit_that_cannot_succeed_fails_before_anyone_is_asked(fake, project, kernel_turn):
    """Issue 14 item 6: an unread file or an absent old_string is the model's mistake, not a question."""
    (project / "notes.py").write_text("alpha = 1\n")
    fake.enqueue(reply(tool_use("edit", {"file_path": "notes.py", "old_string": "alpha", "new_string": "beta"})),
                 reply(tool_use("read", {"file_path": "notes.py"})),
                 reply(tool_use("edit", {"file_path": "notes.py", "old_string": "gamma", "new_string": "beta"})),
                 reply(tool_use("edit", {"file_path": "notes.py", "old_string": "alpha", "new_string": "beta"})),
                 reply(text("edited")), reply(text("no checks for this")), reply(text("really none")))
    asked = []

    async def ask(request):
        asked.append(request)
        return "once", ""

    step, log = kernel_turn("rename alpha", ask)
    assert step == "done" and [a["descriptor"] for a in asked] == ["notes.py"]     # only the edit that can work
    failed = [e for e in log if e["type"] == "ToolFailed"]
    assert len(failed) == 2 and "have not read it" in failed[0]["output"] and "not found" in failed[1]["output"]
    assert not any(e["type"] == "PermissionRequested" and e["tool_use_id"] == f["tool_use_id"]
                   for e in log for f in failed)
    assert (project / "notes.py").read_text() == "beta = 1\n" and fake.rejections == []


def test_the_gate_asks_no_more_once_the_user_denied_the_check(fake, project, kernel_turn):
    """Issue 14 item 5: a denied check (or any denial) is the user's answer; the turn ends there."""
    (project / "app.py").write_text("x = 1\n")
    fake.enqueue(reply(tool_use("read", {"file_path": "app.py"})),
                 reply(tool_use("edit", {"file_path": "app.py", "old_string": "x = 1", "new_string": "x = 2"})),
                 reply(text("Changed x.")),
                 reply(tool_use("bash", {"command": "python -m pytest -q"})),
                 reply(text("I could not run the tests; x is 2 now.")),
                 reply(text("a second reminder would ask for this")))
    asked = []

    async def ask(request):
        asked.append(request["descriptor"])
        return ("deny", "") if "pytest" in request["descriptor"] else ("once", "")

    step, log = kernel_turn("set x to 2", ask)
    assert step == "done" and len(fake.requests) == 5
    assert sum(e["type"] == "VerificationRequested" for e in log) == 1
    assert any("pytest" in d for d in asked) and fake.rejections == []


def test_data_and_settings_files_need_no_check():
    import kernel
    for path in ("data/users.csv", "assets/logo.png", ".gitignore", "setup.ini", "README.md", "docs/x.py"):
        assert not kernel.is_code_path(path), path
    for path in ("app.py", "requirements.txt", "src/main.rs", "package.json"):
        assert kernel.is_code_path(path), path


# ---------------------------------------------------------------- trust asks, and trusts what it showed (issues 19, 22)

HOSTILE_RULE = {"capability": "process.execute", "pattern": "make \x1b]0;pwned\x07\u202e*", "action": "allow"}


def project_config(project, rules):
    config = project / ".khaelor" / "config.json"
    config.parent.mkdir(exist_ok=True)
    config.write_text(json.dumps({"permissions": rules}, ensure_ascii=False))
    return config


def trust_on_a_terminal(khaelor, answer):
    """`khaelor trust` in a pty, answered with `answer`: (exit code, what the terminal showed)."""
    master, slave = pty.openpty()
    proc = khaelor.popen("trust", stdin=slave, stdout=slave, stderr=slave, text=False)
    os.close(slave)
    seen = b""
    while b"[y/N]" not in seen:
        seen += os.read(master, 4096)
    os.write(master, answer.encode() + b"\r")
    code = proc.wait(20)
    with contextlib.suppress(OSError):
        seen += os.read(master, 4096)
    os.close(master)
    return code, seen.decode()


def trusted_hashes(khaelor):
    path = Path(khaelor.env["KHAELOR_HOME"]) / "trust.json"
    return list(json.loads(path.read_text()).values()) if path.exists() else []


def test_trust_shows_the_grants_then_asks_and_only_yes_trusts(khaelor, project):
    config = project_config(project, [{"capability": "process.execute", "pattern": "make *", "action": "allow"}])
    digest = hashlib.sha256(config.read_bytes()).hexdigest()
    code, seen = trust_on_a_terminal(khaelor, "n")
    assert code == 1 and "allow process.execute 'make *'" in seen and "nothing trusted" in seen
    assert seen.index("make *") < seen.index("Trust these? [y/N]")
    assert trusted_hashes(khaelor) == []
    code, seen = trust_on_a_terminal(khaelor, "y")
    assert code == 0 and "trusted;" in seen and trusted_hashes(khaelor) == [digest]


def test_trust_without_a_terminal_trusts_nothing_unless_told_yes(khaelor, project):
    config = project_config(project, [{"capability": "process.execute", "pattern": "make *", "action": "allow"}])
    piped = khaelor.run("trust", stdin="y\n")           # a `y` in a pipe is not a person
    assert piped.returncode == 2 and trusted_hashes(khaelor) == []
    assert "nothing trusted" in piped.stderr and "khaelor trust --yes" in piped.stderr
    told = khaelor.run("trust", "--yes")
    assert told.returncode == 0 and "Trust these?" not in told.stdout
    assert trusted_hashes(khaelor) == [hashlib.sha256(config.read_bytes()).hexdigest()]


def test_permissions_and_trust_show_every_byte_of_a_rule_none_interpreted(khaelor, project):
    """Issue 19 item 6: a repository's rule holding an OSC title sequence and a right-to-left
    override is listed with each control visible, in `khaelor permissions` and `khaelor trust`."""
    project_config(project, [HOSTILE_RULE])
    for argv in (["permissions"], ["trust", "--yes"]):
        result = khaelor.run(*argv)
        assert result.returncode == 0, result.stderr
        assert "make ^[]0;pwned^G<U+202E>*" in result.stdout, argv
        assert "\x1b" not in result.stdout and "\u202e" not in result.stdout and "\x07" not in result.stdout


def test_a_headless_denial_shows_the_command_with_its_controls_visible(khaelor, fake):
    fake.enqueue(reply(tool_use("bash", {"command": "touch a\rrm -rf b \x1b[8m\x9b"})), reply(text("ok")))
    result = khaelor.run("-p", "go")
    assert "denied `touch a␍rm -rf b ^[[8m<U+009B>`" in result.stderr
    assert "\x1b" not in result.stderr and "\r" not in result.stderr


def swap_after_first_read(monkeypatch, path, replacement):
    """A process racing khaelor: `path` changes right after khaelor's first read of it (its one
    reader of config and permission files, khaelor.read_bytes)."""
    import khaelor as cli
    real = cli.read_bytes

    def read_bytes(read):
        data = real(read)
        if read == path:
            monkeypatch.setattr(cli, "read_bytes", real)
            path.write_text(replacement)
        return data
    monkeypatch.setattr(cli, "read_bytes", read_bytes)


def test_a_file_swapped_after_it_was_hashed_is_never_what_is_trusted(project, tmp_path, monkeypatch, capsys):
    """The trust check hashes and parses the same bytes: at start, a config swapped between the
    two grants nothing unseen; in `khaelor trust`, what is shown is what is recorded."""
    import khaelor as cli
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    home = tmp_path / "khaelor-home"
    benign = {"capability": "process.execute", "pattern": "make *", "action": "allow"}
    hostile = json.dumps({"permissions": [{**benign, "pattern": "*"}]})
    project_config(project, [benign])
    assert cli.cmd_trust(["--yes"], home, project) == 0
    swap_after_first_read(monkeypatch, project / ".khaelor" / "config.json", hostile)
    layer = cli.permission_layers(home, project)[-3]
    assert layer.trusted and [rule["pattern"] for rule in layer.config["permissions"]] == ["make *"]
    capsys.readouterr()
    # now the hostile file is in place; a swap back to benign right after trust's read
    swap_after_first_read(monkeypatch, project / ".khaelor" / "config.json", json.dumps({"permissions": [benign]}))
    assert cli.cmd_trust(["--yes"], home, project) == 0
    shown = capsys.readouterr().out
    assert "allow process.execute '*'" in shown
    assert cli.trust_records(home)[str((project / ".khaelor" / "config.json").resolve())] == \
        hashlib.sha256(hostile.encode()).hexdigest()


def test_permissions_check_of_a_blank_command_is_a_usage_error(khaelor):
    """`permissions check --bash ''` answered "allow (…; )": a blank command is no call to judge."""
    for what in (["--bash", ""], ["--bash", "  "], ["--read", ""]):
        result = khaelor.run("permissions", "check", *what)
        assert result.returncode == 2, (what, result.stdout)
        assert "allow" not in result.stdout and "blank" in result.stderr, result.stderr
