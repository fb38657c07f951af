"""Issue 20: a checkpoint before every step that may change the work tree, and `khaelor rewind`.
Real git in tmp dirs; the real program under --yes with the scripted fake API where only it proves
the point (each costs ~2 s of SDK import), in-process elsewhere."""
import asyncio
import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

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
            "staged": git(root, "ls-files", "--stage"),
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
    toolbox = tools.Toolbox(tools.Workspace(root), tmp_path / "home", lambda *a, **k: {}, tools.events.State)
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


# The spellings that wiped uncommitted work under --yes while protection was a list of them.
DESTRUCTIVE = [
    "git reset --hard",
    "git checkout -f master",
    "git checkout-index -f -a",
]
# an alias may stand for anything: --yes never runs it, so it wipes nothing to rewind
ALIAS = "git config alias.nuke 'reset --hard'; git nuke"


def steps_of(khaelor) -> list[str]:
    listed = khaelor.run("rewind", "--list")
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.splitlines()


def test_rewind_brings_back_what_each_destructive_command_wiped(khaelor, fake, project):
    make_repository(project)
    start = work_tree(project)
    before = repository_facts(project)
    # step 1 deletes a tracked and an untracked file; then each command wipes an edit made just
    # before it (steps 2, 4, 6, 8), and the agent installs an ignored file (step 9)
    calls = [tool_use("bash", {"command": "rm gone.txt u.txt"})]
    for n, command in enumerate(DESTRUCTIVE):
        if n:
            calls.append(tool_use("bash", {"command": f"printf 'v1\\nmine {n}\\n' > a.txt"}))
        calls.append(tool_use("bash", {"command": command}))
    calls.append(tool_use("bash", {"command": "printf 'v1\\nmine 3\\n' > a.txt"}))
    calls.append(tool_use("bash", {"command": ALIAS}))
    calls.append(tool_use("bash", {"command": "echo new > node_modules/new.js"}))
    fake.enqueue(*[reply(call) for call in calls], reply(text("done")))
    result = khaelor.run("-p", "clean up", "--yes")
    assert result.returncode == 0, result.stderr
    assert (project / "a.txt").read_text() == "v1\nmine 3\n"       # the alias never ran
    assert "may be an alias" in str(khaelor.log()) or "defines what a later git" in str(khaelor.log())
    steps = steps_of(khaelor)
    assert len(steps) == 8 and "git reset --hard" in steps[-2], steps
    # newest first: each destructive step, then the first
    for step, wiped in ((6, "v1\nmine 2\n"), (4, "v1\nmine 1\n")):
        rewound = khaelor.run("rewind", str(step), "--yes")
        assert rewound.returncode == 0, rewound.stderr
        assert (project / "a.txt").read_text() == wiped, (step, rewound.stdout)
    assert khaelor.run("rewind", "1", "--yes").returncode == 0
    assert work_tree(project) == {**start, "node_modules/new.js": (b"new\n", False)}
    assert repository_facts(project)["status"] == before["status"]
    # the index as it was (its bytes differ: git refreshes the stat data of rewritten files)
    assert repository_facts(project)["staged"] == before["staged"]
    assert git(project, "stash", "list") == before["stash"]
    # the model's next request says what was undone
    fake.enqueue(reply(text("ok")))
    assert khaelor.run("-c", "-p", "go on", "--yes").returncode == 0
    sent = str(fake.requests[-1]["body"]["messages"])
    assert "rewound the work tree to before step 1" in sent and "rm gone.txt u.txt" in sent


def test_rewinding_a_file_the_user_changed_since_asks(khaelor, fake, project):
    git(project, "init", "-q")
    (project / "a.txt").write_text("v1\n")
    fake.enqueue(reply(tool_use("write", {"file_path": "c.txt", "content": "one\n"})),
                 reply(tool_use("edit", {"file_path": "c.txt", "old_string": "one",
                                         "new_string": "two"})),
                 reply(tool_use("bash", {"command": "echo agent > a.txt; echo agent > b.txt;"
                                                    " echo three > c.txt"})),
                 reply(text("done")))
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    (project / "a.txt").write_text("the user's own\n")
    refused = khaelor.run("rewind")
    assert refused.returncode == 2 and "you changed it" in refused.stdout
    assert (project / "b.txt").exists()
    # step 0 is no step: not the default, the last changing one
    nothing = khaelor.run("rewind", "0", "--yes")
    assert nothing.returncode == 2 and "no step 0" in nothing.stderr
    assert (project / "b.txt").exists()
    kept = khaelor.run("rewind", "--yes")
    assert kept.returncode == 0, kept.stderr
    assert (project / "a.txt").read_text() == "the user's own\n"
    assert not (project / "b.txt").exists() and "Kept as you left them" in kept.stdout
    # before the edit: what the write left; before the write: no file
    assert (project / "c.txt").read_text() == "two\n"
    assert khaelor.run("rewind", "2", "--yes").returncode == 0
    assert (project / "c.txt").read_text() == "one\n"
    assert khaelor.run("rewind", "1", "--yes").returncode == 0
    assert not (project / "c.txt").exists()


def test_rewinding_a_write_that_followed_a_command_keeps_what_the_command_made(khaelor, fake,
                                                                              project):
    """QA (tmux): a turn ran `touch a.txt`, then wrote b.txt; `/rewind 2` (before the write) said
    "delete a.txt, delete b.txt": the write took no checkpoint of its own (the turn had one, from
    before the command), so going back to before it went back to before the command too."""
    git(project, "init", "-q")
    fake.enqueue(reply(tool_use("bash", {"command": "echo made > a.txt"})),
                 reply(tool_use("write", {"file_path": "b.txt", "content": "b\n"})),
                 reply(text("done")))
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    rewound = khaelor.run("rewind", "2", "--yes")
    assert rewound.returncode == 0, rewound.stderr
    assert "a.txt" not in rewound.stdout, rewound.stdout
    assert (project / "a.txt").read_text() == "made\n" and not (project / "b.txt").exists()
    assert khaelor.run("rewind", "1", "--yes").returncode == 0
    assert work_tree(project) == {}


def test_a_project_without_git_rewinds_a_find_delete(khaelor, fake, project):
    (project / ".git").rmdir()
    (project / "src").mkdir()
    (project / "src" / "main.py").write_text("print('mine')\n")
    (project / "tool").write_bytes(b"#!/bin/sh\n")
    (project / "tool").chmod(0o755)
    start = work_tree(project)
    find = "find . -type f -not -path './.git/*' -delete"
    fake.enqueue(reply(tool_use("bash", {"command": find})), reply(text("done")))
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    assert work_tree(project) == {}
    rewound = khaelor.run("rewind", "--yes")
    assert rewound.returncode == 0, rewound.stderr
    assert work_tree(project) == start
    again = khaelor.run("rewind", "--yes")           # said "no step … changed the work tree"
    assert again.returncode == 1 and "rewound already" in again.stderr, again.stderr
    assert work_tree(project) == start


def test_after_a_kill_9_mid_step_the_rewind_works(khaelor, fake, project):
    git(project, "init", "-q")
    (project / "a.txt").write_text("mine\n")
    fake.enqueue(reply(tool_use("bash", {"command": "echo agent > a.txt; sleep 5"})))
    proc = khaelor.popen("-p", "go", "--yes")
    deadline = time.time() + 30
    while (project / "a.txt").read_text() != "agent\n" and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rewound = khaelor.run("rewind", "--yes")
    assert rewound.returncode == 0, rewound.stderr
    assert (project / "a.txt").read_text() == "mine\n"


def test_a_shadow_repository_unused_for_30_days_is_pruned(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    git(root, "init", "-q")
    (root / "a.txt").write_text("a\n")
    git(root, "add", "a.txt")
    home = tmp_path / "home"
    toolbox = tools.Toolbox(tools.Workspace(root), home, lambda *a, **k: {}, tools.events.State)
    toolbox.checkpoints.take()
    shadow = toolbox.checkpoints.shadow(root)
    tools.prune_versions(home)
    assert shadow.is_dir()
    old = time.time() - 31 * 86_400
    os.utime(shadow / "info" / "exclude", (old, old))
    (home / "versions" / tools.VERSIONS_PRUNE_MARKER).unlink()
    tools.prune_versions(home)
    assert not shadow.exists()


def test_a_folder_a_step_replaced_by_a_link_outside_is_restored_inside(tmp_path):
    root = tmp_path / "project"
    outside = tmp_path / "outside"
    (root / "src").mkdir(parents=True)
    outside.mkdir()
    (root / "src" / "main.py").write_text("mine\n")
    checkpoints = tools.Toolbox(tools.Workspace(root), tmp_path / "home",
                                lambda *a, **k: {}, tools.events.State).checkpoints
    before = checkpoints.take()
    (root / "src" / "main.py").unlink()
    (root / "src").rmdir()
    (root / "src").symlink_to(outside)
    after = checkpoints.take(before["tree"])
    restores = checkpoints.plan(root, before, {}, after["tree"], after["tree"])
    assert checkpoints.apply(root, restores) == []
    assert not (root / "src").is_symlink() and (root / "src" / "main.py").read_text() == "mine\n"
    assert list(outside.iterdir()) == []


def test_a_rewind_puts_head_back_only_in_the_repository_the_session_found(tmp_path):
    """A step makes .git a "gitdir: <another repository>" file: the rewind's update-ref and its
    index write would land in that repository (here one nested in the project, which the read-only
    sandbox lets git read; or anywhere outside it)."""
    root = tmp_path / "project"
    root.mkdir()
    make_repository(root)
    other = root / "vendor"
    git(tmp_path, "clone", "-q", str(root), str(other))
    box = tools.Toolbox(tools.Workspace(root), tmp_path / "home", lambda *a, **k: {}, tools.events.State)
    recorded = box.checkpoints.take()
    (root / ".git").rename(tmp_path / "moved.git")
    (root / ".git").write_text(f"gitdir: {other / '.git'}\n")
    repo = box.checkpoints.repository()
    assert repo.git_dir == other / ".git"
    before = repository_facts(other)
    try:
        box.checkpoints.restore_head(repo, recorded)
    except tools.CheckpointError as error:
        assert "not put back" in str(error)
    else:
        raise AssertionError("restore_head wrote into another repository")
    assert repository_facts(other) == before


def test_a_rewind_whose_head_cannot_move_back_still_restores_the_files(khaelor, fake, project):
    """git refuses the update-ref (another git holds the branch's lock): the files come back and
    the report says what was not put back, instead of the rewind failing half done."""
    git(project, "init", "-q", "-b", "master")
    (project / "a.txt").write_text("v1\n")
    git(project, "add", "a.txt")
    git(project, "commit", "-qm", "one")
    fake.enqueue(reply(tool_use("bash", {"command": "echo agent > a.txt"})), reply(text("done")))
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    git(project, "commit", "-qam", "the user's commit")
    (project / ".git" / "refs" / "heads" / "master.lock").write_text("")
    rewound = khaelor.run("rewind", "--yes")
    assert rewound.returncode == 0, rewound.stderr
    assert (project / "a.txt").read_text() == "v1\n"
    assert "Not restored:" in rewound.stdout and "update-ref" in rewound.stdout


def test_a_rewind_with_nothing_to_rewind_exits_1_as_git_commit_does(khaelor, fake, project):
    """`khaelor rewind 5 --yes && git commit …` went on as if files were put back: with no step
    that changed anything it said "no steps…" and exited 0. Nothing to do is exit 1 (git commit
    with nothing to commit); listing nothing is still a listing (0)."""
    fake.enqueue(reply(text("nothing changed")))
    assert khaelor.run("-p", "hello").returncode == 0
    for argv in (["rewind", "5", "--yes"], ["rewind", "--yes"]):
        result = khaelor.run(*argv)
        assert result.returncode == 1, (argv, result.stdout, result.stderr)
        assert "nothing to rewind" in result.stderr, result.stderr
    assert khaelor.run("rewind", "--list").returncode == 0


def test_a_rewind_in_a_project_with_no_session_is_nothing_to_rewind_too(khaelor, project):
    """README: exit 1 when `khaelor rewind` finds nothing to rewind. With no session yet it said
    so as a usage error (2), and `--list` listed nothing as one."""
    rewound = khaelor.run("rewind", "--yes")
    assert rewound.returncode == 1, rewound.stderr
    assert "nothing to rewind" in rewound.stderr, rewound.stderr
    assert khaelor.run("rewind", "--list").returncode == 0
    assert khaelor.run("rewind", "-r", "2026").returncode == 2


def rewind_one_step(tmp_path, before_step, step, overlay=None) -> tuple[Path, list[str]]:
    """A project set up by `before_step(root)`, a checkpoint, `step(root)`, a checkpoint, and the
    rewind to before the step (in-process): (the project, what apply could not restore)."""
    root = tmp_path / "project"
    root.mkdir()
    git(root, "init", "-q")
    before_step(root)
    checkpoints = tools.Toolbox(tools.Workspace(root), tmp_path / "home",
                                lambda *a, **k: {}, tools.events.State).checkpoints
    before = checkpoints.take()
    step(root)
    after = checkpoints.take(before["tree"])
    restores = checkpoints.plan(root, before, overlay or {}, after["tree"], after["tree"])
    return root, checkpoints.apply(root, restores)


def test_a_link_a_step_replaced_by_a_file_comes_back_as_the_link(tmp_path):
    """OpenCode's snapshot tests track links; `rm link && echo x > link` was rewound to
    "link.txt: File exists": the file stayed, the link was lost."""
    def step(root):
        (root / "link.txt").unlink()
        (root / "link.txt").write_text("a file now\n")
    root, problems = rewind_one_step(
        tmp_path, lambda root: (root / "link.txt").symlink_to("target.txt"), step)
    assert problems == []
    assert (root / "link.txt").is_symlink() and os.readlink(root / "link.txt") == "target.txt"


def test_an_untracked_file_over_the_cap_that_a_step_overwrote_is_not_deleted(tmp_path):
    """A checkpoint leaves out an untracked file over 20 MB: absent from its tree, it read as
    "created by the step", and the rewind deleted the user's file (now 6 bytes, but theirs)."""
    def big(root):
        with open(root / "data.bin", "wb") as handle:
            handle.truncate(tools.CHECKPOINT_FILE_CAP_BYTES + 1)
    root, problems = rewind_one_step(
        tmp_path, big, lambda root: (root / "data.bin").write_text("small\n"))
    assert problems == [] and (root / "data.bin").read_text() == "small\n"


def test_a_folder_a_rewind_empties_and_fills_again_keeps_its_mode(tmp_path):
    """A step renamed private/key.txt to private/new.txt: the rewind deleted new.txt, removed the
    emptied private/ (0700) and made it anew for key.txt with the umask's 0755."""
    def before_step(root):
        (root / "private").mkdir(mode=0o700)
        (root / "private" / "key.txt").write_text("k\n")
    root, problems = rewind_one_step(
        tmp_path, before_step,
        lambda root: (root / "private" / "key.txt").rename(root / "private" / "new.txt"))
    assert problems == [] and os.listdir(root / "private") == ["key.txt"]
    assert (root / "private").stat().st_mode & 0o777 == 0o700


def test_a_file_written_back_from_its_version_keeps_its_exec_bit(tmp_path):
    """Two edits in one turn took run.sh from v1 to v2 and back: rewinding to between them wrote
    v2 back as 100644 (the checkpoints saw no change to take a mode from) and dropped the x."""
    def before_step(root):
        (root / "run.sh").write_text("v1\n")
        (root / "run.sh").chmod(0o755)
    root, problems = rewind_one_step(tmp_path, before_step, lambda root: None,
                                     overlay={"run.sh": b"v2\n"})
    assert problems == [] and (root / "run.sh").read_text() == "v2\n"
    assert os.access(root / "run.sh", os.X_OK)


def test_an_ignored_file_that_write_or_edit_changed_is_rewound(khaelor, fake, project):
    """No checkpoint records a file git ignores, so undoing an edit of local.cfg (a .env.local, a
    config kept out of git) said "nothing differs" and changed nothing, where Claude Code's rewind
    puts back what its edit tools changed. Its kept versions are written back now; a file the user
    changed since is kept under --yes."""
    git(project, "init", "-q")
    (project / ".gitignore").write_text("*.cfg\n")
    (project / "local.cfg").write_text("mine\n")
    (project / "user.cfg").write_text("mine\n")
    edits = [tool_use("edit", {"file_path": name, "old_string": "mine", "new_string": "agent"})
             for name in ("local.cfg", "user.cfg")]
    fake.enqueue(reply(tool_use("read", {"file_path": "local.cfg"})),
                 reply(tool_use("read", {"file_path": "user.cfg"})), *map(reply, edits),
                 reply(tool_use("write", {"file_path": "new.cfg", "content": "made\n"})),
                 *[reply(text("done"))] * 3)
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    assert (project / "local.cfg").read_text() == "agent\n"
    (project / "user.cfg").write_text("the user's own\n")
    # a kept version pruned meanwhile: the rewind stops, naming the file
    versions = Path(khaelor.env["KHAELOR_HOME"]) / "versions"
    versions.rename(versions.with_name("away"))
    refused = khaelor.run("rewind", "1", "--yes")
    named = ("the version of local.cfg", "the version of user.cfg")
    assert refused.returncode == 1 and any(n in refused.stderr for n in named), refused.stderr
    versions.with_name("away").rename(versions)
    rewound = khaelor.run("rewind", "1", "--yes")
    assert rewound.returncode == 0, rewound.stderr
    assert "write back `local.cfg`" in rewound.stdout and "delete `new.cfg`" in rewound.stdout
    assert (project / "local.cfg").read_text() == "mine\n" and not (project / "new.cfg").exists()
    assert (project / "user.cfg").read_text() == "the user's own\n"


def test_a_read_only_file_a_step_rewrote_is_rewound(tmp_path):
    """write and edit leave a read-only file alone; a rewind still puts back what a step (sed -i,
    which renames over the file as write did) changed in one."""
    def before_step(root):
        (root / "locked.txt").write_text("v1\n")
        (root / "locked.txt").chmod(0o444)

    def step(root):
        subprocess.run(["sed", "-i", "s/v1/v2/", "locked.txt"], cwd=root, check=True)
    root, problems = rewind_one_step(tmp_path, before_step, step)
    assert problems == [] and (root / "locked.txt").read_text() == "v1\n"
    assert (root / "locked.txt").stat().st_mode & 0o777 == 0o444


def test_a_file_outside_the_project_that_an_approved_edit_changed_is_left_unmentioned(tmp_path):
    """A rewind never writes outside the project; an approved edit of ../notes.txt was listed as
    "write back `../notes.txt`", then reported as "its folder now leads outside the project"."""
    (tmp_path / "notes.txt").write_text("the agent's\n")
    root, problems = rewind_one_step(tmp_path, lambda root: None, lambda root: None,
                                     overlay={"../notes.txt": b"mine\n"})
    assert problems == [] and (tmp_path / "notes.txt").read_text() == "the agent's\n"


def tree_of(root: Path) -> dict:
    """Everything outside .git: links (their target), files (bytes, mode), folders."""
    found = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            found[rel] = ("folder",)
        else:
            found[rel] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return found


def sh(command: str):
    return lambda root: subprocess.run(command, shell=True, cwd=root, check=True)


# OpenCode's snapshot tests (packages/opencode/test/snapshot/snapshot.test.ts) as steps a rewind
# must undo (OpenCode's revert leaves the folders a step made; ours removes those it empties):
# (test, the project before, the step).
SNAPSHOT_CASES = [
    ("tracks deleted files correctly", "", "rm a.txt"),
    ("revert should remove new files", "", "echo NEW > new.txt"),
    ("revert in subdirectory", "", "mkdir -p sub && echo SUB > sub/file.txt"),
    ("multiple file operations", "",
     "rm a.txt; echo C > c.txt; mkdir -p dir; echo D > dir/d.txt; echo MODIFIED > b.txt"),
    ("binary file handling", "printf '\\211PNG\\0' > old.png",
     "printf '\\211PNG\\1\\377' > image.png; printf '\\0\\2' > old.png"),
    ("symlink handling", "ln -s a.txt old-link", "ln -s a.txt link.txt; ln -sfn b.txt old-link"),
    ("large file handling", "", "head -c 1048576 /dev/zero | tr '\\0' x > large.txt"),
    ("nested directory revert", "", "mkdir -p l1/l2/l3 && echo DEEP > l1/l2/l3/deep.txt"),
    ("special characters in filenames", "",
     "echo S > 'file with spaces.txt'; echo D > file-with-dashes.txt;"
     " echo N > \"$(printf 'a\\nb')\""),
    ("unicode filenames (and their modification)", "echo orig > 文件.txt",
     "echo mod > 文件.txt; echo e > 🚀rocket.txt; mkdir -p 目录/подкаталог; echo d > 目录/подкаталог/f"),
    ("very long filenames", "", "echo long > " + "a" * 200 + ".txt"),
    ("hidden files", "", "echo h > .hidden; echo '*.log' > .gitignore; echo c > .config"),
    ("nested symlinks", "", "mkdir -p sub/dir && echo t > sub/dir/target.txt &&"
     " ln -s target.txt sub/dir/link.txt && ln -s sub sub-link"),
    ("file permissions (the exec bit)", "", "chmod 755 a.txt"),
    ("circular symlinks", "", "ln -s circular circular"),
    ("revert should not delete files that existed but were deleted in snapshot", "rm a.txt",
     "echo recreated > a.txt"),
    ("revert preserves file that existed in snapshot when deleted then recreated",
     "echo original > existing.txt",
     "rm existing.txt; echo recreated > existing.txt; echo n > newf"),
    ("a file that becomes a folder, a folder that becomes a file", "mkdir d && echo in > d/in",
     "rm a.txt && mkdir a.txt && echo x > a.txt/in && rm -r d && echo f > d"),
]


@pytest.mark.parametrize("before, step", [case[1:] for case in SNAPSHOT_CASES],
                         ids=[case[0] for case in SNAPSHOT_CASES])
def test_opencode_snapshot_case_is_rewound(tmp_path, before, step):
    def prepare(root):
        (root / "a.txt").write_text("A\n")
        (root / "b.txt").write_text("B\n")
        git(root, "add", ".")
        git(root, "commit", "-qm", "init")
        if before:
            sh(before)(root)
    start = {}

    def step_after_looking(root):
        start.update(tree_of(root))
        sh(step)(root)
    root, problems = rewind_one_step(tmp_path, prepare, step_after_looking)
    assert problems == [] and tree_of(root) == start


def test_what_git_ignores_a_command_made_is_not_rewound(tmp_path):
    """OpenCode's "gitignore changes": the ignored file is not in a snapshot, so no rewind touches
    it (write and edit keep versions of their own changes, see above)."""
    root, problems = rewind_one_step(
        tmp_path, lambda root: (root / ".gitignore").write_text("*.ignored\n"),
        sh("echo mine > test.ignored; echo normal > normal.txt"))
    assert problems == [] and (root / "test.ignored").read_text() == "mine\n"
    assert not (root / "normal.txt").exists()


def test_esc_during_a_checkpoint_waits_for_its_git(project, env, fake, monkeypatch, tmp_path):
    """Esc while a checkpoint's git ran in its thread ended the turn at once: the thread went on
    writing the shadow repository, where the next turn's checkpoint (or a /rewind) would meet it."""
    import asyncio

    import events
    import khaelor as cli
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    real_git = tools.shutil.which("git")
    # the first git run on the shadow repository (all it may write) takes a second
    (slow / "git").write_text(
        '#!/bin/sh\ncase "$GIT_DIR" in *checkpoints*) [ -e "$GIT_DIR/started" ] ||\n'
        '  { touch "$GIT_DIR/started"; sleep 1; echo slow-done >> "$GIT_DIR/runs"; };; esac\n'
        f'exec {real_git} "$@"\n')
    (slow / "git").chmod(0o755)
    for key in ("KHAELOR_HOME", "ANTHROPIC_API_KEY", "ANTHROPIC_CONFIG_DIR"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    monkeypatch.setenv("PATH", f"{slow}:{os.environ['PATH']}")
    monkeypatch.chdir(project)
    fake.enqueue(reply(tool_use("bash", {"command": "touch made.txt"})), reply(text("done")))
    home = Path(env["KHAELOR_HOME"])

    async def answer(request):
        return "once", ""

    async def cancelled_turn():
        args = cli.parse_args(["-p", "x"])
        store = events.SessionStore.create(events.sessions_dir(home, project))
        agent = cli.build_kernel(args, cli.load_settings(args, home, project), store,
                                 events.Bus(store), home, project, answer)
        agent.submit("make a file")
        turn = asyncio.ensure_future(agent.run())
        try:
            while not list(home.glob("checkpoints/*/started")):
                assert not turn.done()
                await asyncio.sleep(0.02)
            turn.cancel()
            with pytest.raises(asyncio.CancelledError):
                await turn
            # the slow git had finished when the cancel returned
            assert list(home.glob("checkpoints/*/runs")), "the cancel left git running"
            return store.events
        finally:
            await agent.toolbox.close()
            await agent.model.close()

    log = asyncio.run(cancelled_turn())
    kinds = [event.get("reason") or event["type"] for event in log]
    assert kinds[-3:] == ["PermissionGranted", "interrupted by the user", "Interrupted"], kinds
    assert not (project / "made.txt").exists()


def test_slash_rewind_asks_before_writing_over_a_file_the_user_changed(khaelor, fake, project,
                                                                      env, monkeypatch):
    """QA: README says a file edited after the agent's last step is asked about, but /rewind kept
    it without asking (only `khaelor rewind` asked). It asks: overwrite, keep, or (Esc) nothing."""
    from test_sessions import in_session
    git(project, "init", "-q")
    fake.enqueue(reply(tool_use("write", {"file_path": "a.txt", "content": "agent\n"})),
                 reply(text("done")))
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    (project / "a.txt").write_text("the user's own\n")

    async def answer(session, choice):
        question = await session.run_command("/rewind 1")
        assert question["descriptor"].startswith("overwrite the files you changed"), question
        return await question["answer"](choice)
    said = in_session(project, env, monkeypatch, lambda session: answer(session, "deny"))
    assert said == "Not rewound." and (project / "a.txt").read_text() == "the user's own\n"
    said = in_session(project, env, monkeypatch, lambda session: answer(session, "overwrite"))
    assert not (project / "a.txt").exists() and "(1 file): 1 deleted." in said, said
    # what the panel's answer showed is replayed on resume, as a command's answer is
    answers = in_session(project, env, monkeypatch, lambda session: asyncio.sleep(
        0, [e["text"] for e in session.store.events if e["type"] == "CommandAnswered"]))
    assert answers and "(1 file): 1 deleted." in answers[-1], answers


def rewind_question_answered(line, khaelor, fake, project, env, monkeypatch):
    """A step wrote a.txt, the user changed it, then `line` asks about it and is answered yes: the
    screen live and replayed (in a session at 60 columns), and the log."""
    import ui
    from test_sessions import in_session, live_and_replayed_mid_reply
    git(project, "init", "-q")
    fake.enqueue(reply(tool_use("write", {"file_path": "a.txt", "content": "agent\n"})),
                 reply(text("done")))
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    (project / "a.txt").write_text("the user's own\n")
    steps = [line, ui.Key("text", "y"), lambda e: e["type"] == "CommandAnswered"]
    shown, replayed, log = in_session(
        project, env, monkeypatch, lambda session: live_and_replayed_mid_reply(session, steps, 60))
    return shown, replayed, log


def test_what_the_rewind_question_answered_shows_under_its_command_live_and_replayed(
        khaelor, fake, project, env, monkeypatch):
    """QA: the answer to /rewind's question showed bare, where a resume showed it under
    `› /rewind 1`, as every command's answer (its CommandAnswered names the command). And the
    ◇ line of its Rewound showed above `› /rewind 1`: the line typed comes first."""
    shown, replayed, _ = rewind_question_answered("/rewind 1", khaelor, fake, project, env,
                                                  monkeypatch)
    assert shown.startswith("› /rewind 1\n◇ Rewound the work tree to before step 1\n\n"
                            "Rewinding to before step 1") and "1 deleted." in shown, shown
    assert shown.count("› /rewind 1") == 1, shown
    assert replayed.endswith(shown) and not (project / "a.txt").exists()


def test_an_open_undo_question_shows_the_line_typed_above_it_where_it_settles(
        khaelor, fake, project, env, monkeypatch):
    """QA: while `/undo`'s question was open the screen had no `› /undo`: the line typed showed
    only once the question was answered. It shows above the question, in the row it then keeps."""
    from test_sessions import in_session, live_and_replayed_mid_reply
    git(project, "init", "-q")
    fake.enqueue(reply(tool_use("write", {"file_path": "a.txt", "content": "agent\n"})),
                 reply(text("done")))
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    (project / "a.txt").write_text("the user's own\n")
    shown, _, _ = in_session(project, env, monkeypatch,
                             lambda session: live_and_replayed_mid_reply(session, ["/undo"], 60))
    assert shown.startswith("\n› /undo\n⚠ Overwrite the files you changed"), shown
    # answered, it settles there once (test_undo_that_asks_shows_undo_above_its_answer_…)


def test_a_rewind_question_answered_after_a_turn_changed_the_tree_rewinds_nothing(
        khaelor, fake, project, env, monkeypatch):
    """QA (tmux): `/undo` asked; a message sent while it was open ran a turn that wrote c.txt;
    then `y` carried out the plan made before that turn: a.txt went, c.txt stayed, and the log
    called the write of c.txt undone (a later /undo found nothing to undo). A plan the session
    has moved past is not carried out."""
    import ui
    from test_sessions import in_session, live_and_replayed_mid_reply
    git(project, "init", "-q")
    fake.enqueue(reply(tool_use("write", {"file_path": "a.txt", "content": "agent\n"})),
                 reply(text("done")))
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    (project / "a.txt").write_text("the user's own\n")
    fake.enqueue(reply(tool_use("write", {"file_path": "c.txt", "content": "c\n"})),
                 reply(text("wrote c")))

    async def script(session):
        session.cycle_mode()            # accept edits: the turn's write does not ask
        ended = lambda e: e["type"] == "TaskCompleted" and not session.working  # noqa: E731
        steps = ["/undo", "write c", ended, ui.Key("text", "y"),
                 lambda e: e["type"] == "CommandAnswered"]
        return await live_and_replayed_mid_reply(session, steps, 80)
    shown, _, log = in_session(project, env, monkeypatch, script)
    assert "changed since the question; not rewound" in shown, shown
    assert not [e for e in log if e["type"] == "Rewound"]
    assert (project / "a.txt").read_text() == "the user's own\n" and (project / "c.txt").exists()


def test_undo_that_asks_shows_undo_above_its_answer_live_and_replayed(khaelor, fake, project,
                                                                     env, monkeypatch):
    """QA: `/undo` that asked about a file the user changed showed its answer under
    `› /rewind 1`, live and on resume: the line typed was `/undo`, and it shows, once."""
    shown, replayed, log = rewind_question_answered("/undo", khaelor, fake, project, env,
                                                    monkeypatch)
    assert shown.startswith("› /undo\n◇ Rewound the work tree to before step 1\n\n"), shown
    assert shown.count("› /undo") == 1 and "/rewind 1" not in shown, shown
    assert replayed.endswith(shown) and not (project / "a.txt").exists()
    answered = [(e["command"], e.get("echoed")) for e in log if e["type"] == "CommandAnswered"]
    assert answered == [("/undo", True)], answered


def test_slash_rewind_and_undo_show_the_line_typed_above_their_rewound_line(
        khaelor, fake, project, env, monkeypatch):
    """QA: `/rewind 1` (nothing to ask) and `/undo` showed their ◇ Rewound line above the line
    typed, then the report: the line typed first, once, then the ◇ line, then the report, live
    and replayed."""
    from test_sessions import in_session, live_and_replayed
    git(project, "init", "-q")
    fake.enqueue(reply(tool_use("write", {"file_path": "a.txt", "content": "a\n"})),
                 reply(tool_use("write", {"file_path": "b.txt", "content": "b\n"})),
                 reply(text("done")))
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    shown, replayed, log = in_session(
        project, env, monkeypatch, lambda session: live_and_replayed(session,
                                                                     ["/undo", "/rewind 1"], 60))
    assert not (project / "a.txt").exists() and not (project / "b.txt").exists()
    assert replayed.endswith(shown), (shown, replayed)
    for line, step in (("/undo", 2), ("/rewind 1", 1)):
        head = f"› {line}\n◇ Rewound the work tree to before step {step}\n\nRewinding to before"
        assert head in shown and shown.count(f"› {line}") == 1, shown
    assert shown.index("› /undo") < shown.index("› /rewind 1")
    rewound = [(e["step"], e["typed"]) for e in log if e["type"] == "Rewound"]
    assert rewound == [(2, "/undo"), (1, "/rewind 1")]


def test_slash_rewind_says_it_keeps_a_file_the_user_changed_and_each_line_stands_alone(
        khaelor, fake, project, env, monkeypatch):
    """QA: /rewind listed "• delete a.txt (you changed it …)" and then kept a.txt, and the report's
    lines ran together as markdown ("Kept as you left them (…): a.txt What a rewind cannot …")."""
    from test_sessions import in_session
    git(project, "init", "-q")
    fake.enqueue(reply(tool_use("write", {"file_path": "a.txt", "content": "agent\n"})),
                 reply(tool_use("write", {"file_path": "b.txt", "content": "agent\n"})),
                 reply(text("done")))
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    (project / "a.txt").write_text("the user's own\n")

    async def rewind(session):
        question = await session.run_command("/rewind 1")
        assert question["capability"] == "rewind.overwrite", question
        assert "- delete `a.txt`  (you changed it after" in question["preview"], question
        return await question["answer"]("keep")
    answer = in_session(project, env, monkeypatch, rewind)
    assert (project / "a.txt").read_text() == "the user's own\n" and not (project / "b.txt").exists()
    assert "- keep `a.txt`  (you changed it" in answer and "- delete `b.txt`" in answer, answer
    assert "step): a.txt\n\nWhat a rewind" in answer, answer
    # b.txt was deleted, a.txt kept: said so, not "2 files restored" (QA)
    assert "Rewound to before step 1 (2 files): 1 deleted, 1 kept." in answer, answer
