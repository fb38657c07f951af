"""Our read-only allow-list measured against OpenAI Codex CLI's tests of "known safe" commands.

tests/data/codex_safe.json holds the commands Codex's tests call safe (auto-approved), not safe, or
dangerous (is_safe_command.rs, unix_safe_commands.rs, read_only_commands.rs, is_dangerous_command.rs,
bash.rs and the legacy execpolicy's default policy and tests); its "source" names each file and
commit. What Codex refuses must not run silently here, except the cases marked expect_ours
"allow", each with the reason. What Codex allows we measure: the cases marked "silent" must stay
silent, those marked expect_ours "ask" keep asking for their reason. Every command is only passed
to permissions.decide as a string, never run; the one test that runs something runs real git in a
temp repository. Run with -s to see the figures.
"""

import json
import subprocess
from pathlib import Path

import pytest

import permissions
from fake_api import reply, text, tool_use

CORPUS = json.loads((Path(__file__).parent / "data" / "codex_safe.json").read_text())
CASES = CORPUS["cases"]
# the files Codex's examples name, so that a read judges the file and not a missing path
PROJECT_FILES = ("Cargo.toml", "file.txt", "hello.txt", "README.md", "src/extension.ts", "src/main.rs",
                 "foo", "bar", "baz")


@pytest.fixture
def world(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KHAELOR_HOME", str(tmp_path / "khaelor-home"))
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    for name in PROJECT_FILES:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("x = 1\n")
    return project


def decide(command, project):
    return permissions.decide("bash", {"command": command}, project, permissions.load_rules([]))


def describe(case, decision):
    return f"  {case['command']!r} -> {decision.action} ({case['source']}: {case['test']})"


def test_what_codex_refuses_never_runs_silently(world):
    refused = [c for c in CASES if c["codex"] != "safe" and c.get("expect_ours") != "allow"]
    allowed = []
    for case in refused:
        decision = decide(case["command"], world)
        if decision.action == "allow":
            allowed.append(describe(case, decision))
    held = len(refused) - len(allowed)
    print(f"\nCodex's not-safe and dangerous commands asked or refused: {held}/{len(refused)}")
    assert not allowed, "allowed without a question:\n" + "\n".join(allowed)


def test_what_codex_calls_dangerous_asks_and_the_recorded_ones_are_floored(world):
    dangerous = [c for c in CASES if c["codex"] == "dangerous"]
    floored = []
    problems = []
    for case in dangerous:
        decision = decide(case["command"], world)
        if decision.floor:
            floored.append(case["command"])
        if decision.action == "allow":
            problems.append(describe(case, decision))
        elif case["floor"] and not decision.floor:
            problems.append(describe(case, decision) + " (recorded as refused by the floor)")
    print(f"\nCodex's dangerous commands: {len(dangerous)}, refused by the floor: {len(floored)}: {floored}")
    assert not problems, "\n".join(problems)


def test_codex_safe_commands_run_silently_as_recorded(world):
    safe = [c for c in CASES if c["codex"] == "safe"]
    silent = 0
    problems = []
    for case in safe:
        decision = decide(case["command"], world)
        if decision.action == "allow":
            silent += 1
        if case.get("ours") == "silent" and decision.action != "allow":
            problems.append(describe(case, decision) + f": {decision.not_read_only or decision.reason}")
        if case.get("expect_ours") == "ask" and decision.action == "allow":
            problems.append(describe(case, decision) + f"; recorded as asking: {case['why']}")
    print(f"\nCodex's safe commands we run silently: {silent}/{len(safe)}")
    assert not problems, "\n".join(problems)


def test_every_safe_case_is_marked_and_every_difference_has_a_reason():
    for case in CASES:
        if case["codex"] == "safe":
            assert case.get("ours") == "silent" or case.get("expect_ours") == "ask", case
        if "expect_ours" in case:
            assert case["why"].strip(), case
        if case["codex"] == "dangerous":
            assert isinstance(case["floor"], bool), case


def test_where_codex_asks_and_we_do_not_the_command_is_provably_read_only(world):
    differences = [c for c in CASES if c.get("expect_ours") == "allow"]
    problems = []
    for case in differences:
        decision = decide(case["command"], world)
        if decision.action != "allow" or not decision.read_only:
            problems.append(describe(case, decision))
    print(f"\nCodex asks, we run silently (each with its reason in the corpus): {len(differences)}")
    assert not problems, "recorded as provably read-only, now judged otherwise:\n" + "\n".join(problems)


def _repository_that_configures_programs(project, markers):
    """A real repository whose own config and attributes name a program for every hook git has for
    the read-only commands: fsmonitor, pager, external diff, textconv, a hook."""
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@t"]
    (project / ".git").rmdir()
    subprocess.run([*git, "init", "-q"], check=True)
    (project / "app.py").write_text("print('work')\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    planted = {
        "core.fsmonitor": f"touch {markers}/fsmonitor",
        "core.pager": f"touch {markers}/pager",
        "diff.external": f"touch {markers}/external",
        "diff.evil.textconv": f"touch {markers}/textconv",
    }
    for key, value in planted.items():
        subprocess.run([*git, "config", key, value], check=True)
    (project / ".git" / "info" / "attributes").write_text("*.py diff=evil\n")
    hook = project / ".git" / "hooks" / "post-index-change"
    hook.write_text(f"#!/bin/sh\ntouch {markers}/hook\n")
    hook.chmod(0o755)
    (project / "app.py").write_text("print('changed')\n")


def test_the_git_commands_codex_now_asks_for_run_nothing_a_repository_configures(khaelor, fake, project,
                                                                                 tmp_path):
    """Codex's newest tests ask for every git command because git runs programs a repository
    configures. Ours run without a question (headless, no --yes: a question would be a denial) and
    run none of those programs."""
    markers = tmp_path / "markers"
    markers.mkdir()
    _repository_that_configures_programs(project, markers)
    differences = [c for c in CASES if c["codex"] == "not safe" and c.get("expect_ours") == "allow"]
    commands = [c["command"] for c in differences if c["command"].startswith("git ")]
    assert len(commands) == 5, commands
    fake.enqueue(*[reply(tool_use("bash", {"command": command})) for command in commands], reply(text("done")))
    result = khaelor.run("-p", "look at the repository")
    assert result.returncode == 0, result.stderr
    events = khaelor.log()
    denied = [e for e in events if e["type"] == "PermissionDenied"]
    completed = [e for e in events if e["type"] == "ToolCompleted"]
    assert denied == [] and len(completed) == len(commands), events
    assert sorted(p.name for p in markers.iterdir()) == []
    outputs = "\n".join(e.get("output", "") for e in completed)
    # git itself still works: status, and log -p / show -p through the textconv git is given instead
    assert "modified:   app.py" in outputs and "+print('work')" in outputs
