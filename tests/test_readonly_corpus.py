"""A command runs silently only if it is provably read-only (issue 11, item 2).

tests/data/readonly_bypass.json lists forms of "read-only" commands that execute a program, write
a file, touch the network or read a secret (GTFOBins, the programs' manuals, issue 11's examples):
none may be allowed without a question, and the writes to khaelor's own permission state must be
refused by the floor. Its "must_stay_silent" list is ordinary read-only work that must stay allowed.
tests/data/gtfobins.json holds GTFOBins' examples (every program's; for the programs POLICY lets run
unasked also the same options spelled otherwise): none may be allowed; its "stay_allowed" list must.
Every command is only passed to permissions.check as a string, never run.
"""

import json
from pathlib import Path

import pytest

import permissions

CORPUS = json.loads((Path(__file__).parent / "data" / "readonly_bypass.json").read_text())

PROJECT_FILES = {
    "README.md": "# demo\n", "x.py": "def f():\n    return 1  # TODO\n", "names.txt": "bob\nalice\nbob\n",
    "a": "one\n", "b": "two\n", "data.json": '{"k": 1}\n', "notes.txt": "notes\n", "dump.hex": "00000000: 6869\n",
    "src/app.py": "print('foo')\n", "src/util.py": "X = 1\n", "tests/test_app.py": "def test_x():\n    pass\n",
    ".env": "KEY=not-a-real-secret\n",
    "bin/cat": "#!/bin/sh\ntouch pwned\n",      # the repository's own "cat": never made executable
}


@pytest.fixture
def world(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    khaelor_home = tmp_path / "khaelor-home"
    khaelor_home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KHAELOR_HOME", str(khaelor_home))
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / ".khaelor").mkdir()
    for name, text in PROJECT_FILES.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    return project, {"{KHAELOR_HOME}": str(khaelor_home)}


def judge(command, project, placeholders):
    for placeholder, value in placeholders.items():
        command = command.replace(placeholder, value)
    return permissions.check("bash", command, project, permissions.load_rules([]))


def test_readonly_bypasses_never_run_silently(world):
    project, placeholders = world
    allowed, not_floored = [], []
    for case in CORPUS["bypasses"]:
        result = judge(case["command"], project, placeholders)
        if result["decision"] == "allow":
            allowed.append(f"  {case['command']!r} ({case['why']})")
        elif case["expect"] == "deny" and result["decision"] != "deny":
            not_floored.append(f"  {case['command']!r} -> {result['decision']} ({case['why']})")
    total = len(CORPUS["bypasses"])
    held = total - len(allowed) - len(not_floored)
    figure = f"read-only bypasses held: {100 * held / total:.1f} % ({held}/{total})"
    print(f"\n{figure}; allowed silently: {len(allowed)}, writes to khaelor state not refused: {len(not_floored)}")
    problems = ["allowed without a question:", *allowed, "expected the floor to refuse:", *not_floored]
    assert not allowed and not not_floored, figure + "\n" + "\n".join(problems)


def test_ordinary_read_only_work_stays_silent(world):
    project, placeholders = world
    asked = []
    for case in CORPUS["must_stay_silent"]:
        result = judge(case["command"], project, placeholders)
        if result["decision"] != "allow":
            asked.append(f"  {case['command']!r} -> {result['decision']} ({result['rule']})")
    total = len(CORPUS["must_stay_silent"])
    figure = f"ordinary read-only commands allowed: {total - len(asked)}/{total}"
    print("\n" + figure)
    assert not asked, figure + "; these now ask:\n" + "\n".join(asked)


GTFOBINS = json.loads((Path(__file__).parent / "data" / "gtfobins.json").read_text())


def test_gtfobins_options_of_read_only_programs_ask(world):
    """GTFOBins' ways to run a command, write or read a file with the programs POLICY lets run
    unasked, the same options spelled otherwise (tree -Lo 2 out: tree reads -L's value from the
    next word and the rest of the cluster as options; strings @FILE reads its arguments from
    FILE), and every other GTFOBins example."""
    project, placeholders = world
    allowed = [f"  {case['command']!r} ({case['program']}: {case['function']}, {case['from']})"
               for case in GTFOBINS["cases"] + GTFOBINS["every_program"]
               if judge(case["command"], project, placeholders)["decision"] == "allow"]
    assert not allowed, "allowed without a question:\n" + "\n".join(allowed)


def test_gtfobins_programs_still_read_unasked(world):
    project, placeholders = world
    asked = [f"  {command!r} -> {result['decision']} ({result['rule']})"
             for command in GTFOBINS["stay_allowed"]
             for result in [judge(command, project, placeholders)]
             if result["decision"] != "allow"]
    assert not asked, "these now ask:\n" + "\n".join(asked)
