"""Issue 20: a checkpoint before every step that may change the work tree, and `khaelor rewind`.
Real git in tmp dirs; the real program under --yes with the scripted fake API where only it proves
the point (each costs ~2 s of SDK import), in-process elsewhere."""
import hashlib
import os
import subprocess
from pathlib import Path

import tools
from fake_api import reply, text, tool_use


def git(root: Path, *args: str) -> str:
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    done = subprocess.run(["git", *identity, *args], cwd=root, capture_output=True, text=True,
                          check=True)
    return done.stdout


def make_repository(root: Path) -> None:
    """A repository with work in every place git keeps it: a commit, a staged file, an uncommitted
    edit (on an executable too), an untracked file, an ignored node_modules file, a stash, a
    second branch."""
    git(root, "init", "-q", "-b", "master")
    (root / "a.txt").write_text("v1\n")
    (root / "gone.txt").write_text("tracked, then deleted\n")
    (root / "run.sh").write_text("#!/bin/sh\necho v1\n")
    (root / "run.sh").chmod(0o755)
    (root / ".gitignore").write_text("node_modules/\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    git(root, "branch", "feature")
    (root / "a.txt").write_text("stashed\n")
    git(root, "stash", "-q")
    (root / "staged.txt").write_text("staged\n")
    git(root, "add", "staged.txt")
    (root / "a.txt").write_text("v1\nmine\n")
    (root / "run.sh").write_text("#!/bin/sh\necho mine\n")
    (root / "u.txt").write_bytes(b"untracked \x00\xff\n")
    (root / "node_modules").mkdir()
    (root / "node_modules" / "m.js").write_text("ignored\n")


def repository_facts(root: Path) -> dict:
    """What a checkpoint must never change."""
    git_dir = root / ".git"
    return {"status": git(root, "status", "--porcelain=v2", "--branch", "--untracked-files=all"),
            "index": hashlib.sha256((git_dir / "index").read_bytes()).hexdigest(),
            "stash": git(root, "stash", "list"),
            "branches": git(root, "branch", "-av"),
            "reflog": git(root, "reflog", "--all"),
            "refs": git(root, "for-each-ref"),
            "objects": git(root, "count-objects", "-v"),
            "config": (git_dir / "config").read_text()}


def work_tree(root: Path) -> dict:
    """Every file outside .git: (bytes, executable)."""
    files = {}
    for path in sorted(root.rglob("*")):
        if ".git" in path.relative_to(root).parts or not path.is_file():
            continue
        files[path.relative_to(root).as_posix()] = (path.read_bytes(), os.access(path, os.X_OK))
    return files


def test_checkpoints_leave_the_users_repository_as_it_was(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    make_repository(root)
    before = repository_facts(root)
    toolbox = tools.Toolbox(tools.Workspace(root), tmp_path / "home", lambda *a, **k: {})
    first = toolbox.checkpoints.take()
    (root / "a.txt").write_text("changed by a step\n")
    second = toolbox.checkpoints.take(first["tree"])
    (root / "a.txt").write_text("v1\nmine\n")
    assert repository_facts(root) == before
    assert second["changed"] == [["M", "a.txt"]] and first["branch"] == "master"
    shadow = toolbox.checkpoints.shadow(root)
    assert shadow.stat().st_mode & 0o777 == 0o700
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", first["tree"]], cwd=root,
                            env={**os.environ, "GIT_DIR": str(shadow)}, capture_output=True,
                            text=True, check=True).stdout.split()
    # untracked recorded, ignored not copied
    assert "u.txt" in listed and "staged.txt" in listed and "node_modules/m.js" not in listed
