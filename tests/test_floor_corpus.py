"""The hardline floor measured against Hermes Agent's public approval tests (issue 11, item 4).

tests/data/hermes_approval.json holds the command strings Hermes' tests expect to be refused under
--yolo ("hardline"), to stay off that floor ("not_hardline"), and to need approval
("needs_approval"); its "source" names the files and lists. Targets: >= 95 % of the hardline
commands refused by the floor, <= 1 % of the not_hardline commands; the checks hold the floor at
the figures measured (all 332, no false floor), so no refusal is lost silently. Every command
is only passed to permissions.check as a string: nothing here runs it. Run with -s to see the
measured figures.
"""

import json
import shutil
import tempfile
from pathlib import Path

import pytest

import permissions

CORPUS = json.loads((Path(__file__).parent / "data" / "hermes_approval.json").read_text())
# The measured figures, pinned both ways: a lost refusal fails, and so does a new one (raise
# HARDLINE_REFUSED then, after checking it is right).
HARDLINE_REFUSED = 332          # of Hermes' 332 hardline commands (100 %; the target is 95 %)
NOT_HARDLINE_FLOORED = 0        # of its 173 must-not-be-hardline commands (the limit is 1 %)


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A project and a HOME outside /tmp, as on a real machine: Hermes' "/tmp/..." cases must not
    be judged as deletions of the directory that holds the user's home or the project."""
    base = Path(tempfile.mkdtemp(prefix="khaelor-floor-", dir=_outside_tmp(tmp_path)))
    home = base / "home"
    project = base / "project"
    (project / ".git").mkdir(parents=True)
    (project / "src").mkdir()
    (project / "src" / "app.py").write_text("print(1)\n")
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KHAELOR_HOME", str(base / "khaelor-home"))
    yield project
    shutil.rmtree(base, ignore_errors=True)


def _outside_tmp(tmp_path):
    var_tmp = Path("/var/tmp")
    if var_tmp.is_dir() and tempfile.gettempdir() != str(var_tmp):
        return str(var_tmp)
    return str(tmp_path)     # no /var/tmp here: the "/tmp" cases may then judge stricter


def judge(commands, project):
    """(command, check result or the exception text) for each command."""
    rules = permissions.load_rules([])
    results = []
    for command in commands:
        try:
            results.append((command, permissions.check("bash", command, project, rules)))
        except Exception as error:        # a crash on a peer's input is a finding, not a skip
            results.append((command, {"decision": "error", "floor": False, "error": repr(error)}))
    return results


def percent(part, whole):
    return f"{100 * part / whole:.1f} % ({part}/{whole})"


def listing(results):
    return "\n".join(f"  {command!r} -> {result}" for command, result in results)


def test_floor_refuses_hermes_hardline_commands(world):
    results = judge(CORPUS["hardline"], world)
    misses = [(command, result) for command, result in results if result["floor"] is not True]
    refused = len(results) - len(misses)
    figure = f"hardline commands refused by the floor: {percent(refused, len(results))}"
    print("\n" + figure)
    assert refused == HARDLINE_REFUSED, \
        f"{figure}, measured {HARDLINE_REFUSED}; not refused:\n{listing(misses)}"


def test_floor_leaves_hermes_not_hardline_commands(world):
    results = judge(CORPUS["not_hardline"], world)
    false_floors = [(command, result) for command, result in results if result["floor"] is True]
    errors = [(command, result) for command, result in results if result["decision"] == "error"]
    figure = f"not_hardline commands refused by the floor: {percent(len(false_floors), len(results))}"
    print("\n" + figure)
    assert len(false_floors) <= NOT_HARDLINE_FLOORED, \
        f"{figure}, measured {NOT_HARDLINE_FLOORED}; false floors:\n{listing(false_floors)}"
    assert not errors, f"permissions.check raised on:\n{listing(errors)}"


def test_hermes_dangerous_commands_are_never_allowed(world):
    results = judge(CORPUS["needs_approval"], world)
    allowed = [(command, result) for command, result in results if result["decision"] not in ("ask", "deny")]
    figure = f"needs_approval commands that ask or deny: {percent(len(results) - len(allowed), len(results))}"
    print("\n" + figure)
    assert not allowed, f"{figure}; allowed (or crashed):\n{listing(allowed)}"


def test_disputed_cases_are_reported_not_scored(world):
    """The cases where we believe Hermes' expectation is wrong for khaelor are kept out of the
    figures above; each must carry its reason, and none may be silently allowed either."""
    disputed = CORPUS["disputed"]
    assert all(entry["reason"] and entry["peer"] for entry in disputed)
    scored = set(CORPUS["hardline"]) | set(CORPUS["not_hardline"])
    assert not [entry["command"] for entry in disputed if entry["command"] in scored]
    results = judge([entry["command"] for entry in disputed], world)
    allowed = [(command, result) for command, result in results if result["decision"] == "allow"]
    for command, result in results:
        print(f"disputed: {command!r} -> {result['decision']} floor={result['floor']}")
    assert not allowed, f"disputed commands allowed without a question:\n{listing(allowed)}"
