"""The judge measured against peer agents' own shell-command checks: Gemini CLI's shell-utils and
policy-engine tests, Codex's execpolicy prefix rules, and every Bash permission fix in Claude
Code's CHANGELOG (tests/data/peer_shell_checks.json names each file and commit).

Each case is a command line and the rules the user's own Claude Code settings hold; what the peer
refuses must not run silently here (expected ask: anything but allow; deny: deny). The cases where
we answer otherwise are listed in the corpus with the measured answer and the reason ("known_gap":
we allow what the peer refuses, and why that is no harm; "stricter": we ask where the peer allows);
their numbers are pinned, so none is lost or gained silently. The judge only reads the commands;
the cases whose payload would do something (always `touch m`) also run in the real sandbox, where
the read-only shape a silent allow gets must keep m from being created. Run with -s for figures.
"""

import json
import os
from pathlib import Path

import pytest

import permissions
import sandbox
from conftest import run_khaelor
from fake_api import reply, text, tool_use

CORPUS = json.loads((Path(__file__).parent / "data" / "peer_shell_checks.json").read_text())
CASES = CORPUS["cases"]
# measured, pinned: a new gap fails, and so does a closed one (then lower the number)
KNOWN_GAPS = 2
STRICTER = 16


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A home with a key and a Desktop file, a project with a README and src/."""
    home = tmp_path / "home"
    for directory in (".ssh", ".claude", ".khaelor", "Desktop"):
        (home / directory).mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("key\n")
    (home / "Desktop" / "notes.txt").write_text("notes\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KHAELOR_HOME", str(home / ".khaelor"))
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "src").mkdir()
    (project / "README.md").write_text("x\n")
    (project / "src" / "app.py").write_text("x = 1\n")
    monkeypatch.chdir(project)
    return project


def judge(case, project):
    return decision_for(case, project).action


def decision_for(case, project):
    """The decision for the case's command under the user's own Claude Code settings."""
    settings = json.dumps({"permissions": case["rules"]})
    layers = [permissions.claude_layer("~/.claude/settings.json", settings, project)]
    rules = permissions.load_rules(layers if case["rules"] else [])
    mode = case.get("mode")
    return permissions.decide("bash", {"command": case["command"]}, project, rules,
                              mode=mode or "default")


def meets(decision, expected):
    if expected == "ask":
        return decision != "allow"
    return decision == expected


def label(case):
    return f"{case['source']}: {case['command'][:50]!r}"


@pytest.mark.parametrize("case", CASES, ids=[label(c) for c in CASES])
def test_what_the_peer_refuses_never_runs_silently(case, world):
    decision = judge(case, world)
    where = (f"{case['command']!r} under {case['rules']} -> {decision}; peer: {case['peer']}, "
             f"expected {case['expected']} ({case['why']}; {case['source']}: {case['test']})")
    if "ours" in case:
        assert decision == case["ours"], "a recorded difference changed: " + where
    else:
        assert meets(decision, case["expected"]), where


YES = [c for c in CASES if "yes" in c]


@pytest.mark.parametrize("case", YES, ids=[label(c) for c in YES])
def test_what_yes_approves_is_what_a_checkpoint_undoes(case, world):
    """The kernel's rule for --yes: a step that destroys what no checkpoint brings back asks."""
    decision = decision_for(case, world)
    asks = bool(decision.destructive) and not permissions.checkpoint_undoes(decision.destructive)
    assert ("asks" if asks else "runs") == case["yes"], (case["command"], decision.destructive)


def test_yes_does_not_delete_on_the_host(khaelor, fake, tmp_path):
    """Headless under --yes, a gh deletion nobody approved is refused before it runs: a gh on
    PATH that would record its call is never started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = khaelor.project / "gh-calls"
    (bin_dir / "gh").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "gh").chmod(0o755)
    commands = ["gh repo delete o/r --yes", "gh api -X DELETE repos/o/r", "gh pr list"]
    fake.enqueue(*[reply(tool_use("bash", {"command": c})) for c in commands], reply(text("done")))
    path = f"{bin_dir}:{os.environ['PATH']}"
    result = khaelor.run("-p", "clean up the host", "--yes", env={"PATH": path})
    assert result.returncode == 0, result.stderr
    denied = [e for e in khaelor.log() if e["type"] == "PermissionDenied"]
    assert len(denied) == 2, denied
    assert calls.read_text() == "pr list\n"


def test_the_differences_are_few_and_each_has_its_reason():
    gaps = [c for c in CASES if "known_gap" in c]
    stricter = [c for c in CASES if "stricter" in c]
    for case in gaps:
        assert case["ours"] == "allow" and case["expected"] != "allow" and case["known_gap"], case
    for case in stricter:
        assert case["ours"] == "ask" and case["expected"] == "allow" and case["stricter"], case
    unexplained = [c for c in CASES if "ours" in c and "known_gap" not in c and "stricter" not in c]
    print(f"\npeer cases: {len(CASES)}, known gaps: {len(gaps)}, stricter: {len(stricter)}")
    for case in gaps:
        print(f"  gap: {case['command']!r} under {case['rules']}: {case['known_gap']}")
    assert (len(gaps), len(stricter), unexplained) == (KNOWN_GAPS, STRICTER, [])


def test_the_corpus_is_well_formed():
    sources = {c["source"] for c in CASES}
    assert sources == set(CORPUS["files"]), sources
    for case in CASES:
        assert case["expected"] in ("allow", "ask", "deny"), case
        assert case["why"].strip() and case["test"].strip(), case
        assert not case["contain"] or case["harmful"], case


def _case_scripts(project: Path) -> list[Path]:
    """One directory per payload that can run on its own, each with its run.sh; m lands there."""
    directories = []
    for number, case in enumerate(c for c in CASES if c["contain"]):
        directory = project / "cases" / f"{number:03d}"
        directory.mkdir(parents=True)
        (directory / "run.sh").write_text(case["command"] + "\n")
        directories.append(directory)
    return directories


RUN_EACH = ('for d in cases/*/; do (cd "$d" && timeout 3 bash run.sh) '
            '</dev/null >/dev/null 2>&1; done; echo ran')


def _created(directories: list[Path]) -> list[str]:
    return sorted(d.name for d in directories if (d / "m").exists())


@pytest.mark.skipif(not sandbox.probe()[0] or not sandbox.seccomp_available(),
                    reason="no Landlock or seccomp here")
def test_the_payloads_run_but_the_read_only_sandbox_contains_them(project, env):
    """The same payloads, as bash runs them: with project writes granted each creates m (so they
    are real), in the read-only shape a silent allow gets none does."""
    directories = _case_scripts(project)
    shell = {**env, "PATH": os.environ["PATH"]}
    contained = run_khaelor(["sandbox", "--read-only", "--", "bash", "-c", RUN_EACH], project,
                            shell)
    assert "ran" in contained.stdout, contained.stdout + contained.stderr
    assert _created(directories) == []
    written = run_khaelor(["sandbox", "--write", "--", "bash", "-c", RUN_EACH], project, shell)
    assert "ran" in written.stdout, written.stdout + written.stderr
    created = _created(directories)
    print(f"\npayloads that create m when writes are granted: {len(created)}/{len(directories)}")
    assert len(created) == len(directories), sorted(set(d.name for d in directories) - set(created))


@pytest.mark.skipif(not sandbox.probe()[0] or not sandbox.seccomp_available(),
                    reason="no Landlock or seccomp here")
def test_the_find_write_an_allow_grants_stays_in_the_project(project, env, tmp_path):
    """The known gap: an allow of Bash(find:*) covers find -fprint; the approved shape it runs in
    keeps the write inside the project."""
    outside = tmp_path / "outside"
    outside.mkdir()
    command = f"find . -maxdepth 0 -fprint {outside / 'm'}; find . -maxdepth 0 -fprint m"
    done = run_khaelor(["sandbox", "--write", "--", "bash", "-c", command], project, env)
    assert not (outside / "m").exists(), done.stdout + done.stderr
    assert (project / "m").exists(), done.stdout + done.stderr
