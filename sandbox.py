"""sandbox.py: Linux Landlock through ctypes, so that every command khaelor starts is confined to what its
permission decision granted; and the git configuration that keeps a repository from running code.

Owns: probing the Landlock ABI, building a ruleset in the parent from a `confine` dict, the preexec hook
that enters it in the child, the ports the session's own servers listen on, the secret locations that are
always closed, the git settings every command carries, and the note that explains a refusal.
Must not: import anything of ours, run a program (tools.py starts every process), or claim to confine
what it does not: `status()` says what the kernel offers, and without Landlock nothing is confined.

What Landlock cannot confine, even at ABI 7: UDP (so DNS), raw sockets (root), pathname unix sockets
(e.g. /var/run/docker.sock), TCP connect by address (a port rule allows that port on every host), the
files a command was given open (its stdin, stdout, stderr), and /proc (readable, and so is
/proc/<pid>/environ of khaelor, whose environment every command gets anyway; another process's memory
is refused by Landlock's ptrace rule). Names stay listable (READ_DIR is inherited; see _grant).
"""

import ctypes
import errno
import os
import re
from pathlib import Path

# ---------------------------------------------------------------- Landlock constants (linux/landlock.h)

SYS_CREATE_RULESET = 444
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
# The Landlock syscalls got one number on every architecture (asm-generic and x86 tables alike); mips and
# alpha offset theirs, so only these machines are trusted with the numbers above.
MACHINES = {
    "x86_64", "i686", "aarch64", "arm64", "armv7l", "armv8l",
    "riscv64", "ppc64le", "s390x", "loongarch64",
}
# landlock_create_ruleset flag: return the ABI version
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
PR_SET_NO_NEW_PRIVS = 38

# right -> (bit, first ABI that has it). Filesystem rights, then network, then scopes.
LANDLOCK = {
    "EXECUTE": (1 << 0, 1),
    "WRITE_FILE": (1 << 1, 1),
    "READ_FILE": (1 << 2, 1),
    "READ_DIR": (1 << 3, 1),
    "REMOVE_DIR": (1 << 4, 1),
    "REMOVE_FILE": (1 << 5, 1),
    "MAKE_CHAR": (1 << 6, 1),
    "MAKE_DIR": (1 << 7, 1),
    "MAKE_REG": (1 << 8, 1),
    "MAKE_SOCK": (1 << 9, 1),
    "MAKE_FIFO": (1 << 10, 1),
    "MAKE_BLOCK": (1 << 11, 1),
    "MAKE_SYM": (1 << 12, 1),
    "REFER": (1 << 13, 2),
    "TRUNCATE": (1 << 14, 3),
    "IOCTL_DEV": (1 << 15, 5),
    # BIND_TCP (1 << 0) is left unhandled: dev servers may bind
    "CONNECT_TCP": (1 << 1, 4),
    "SCOPE_ABSTRACT_UNIX_SOCKET": (1 << 0, 6),
    "SCOPE_SIGNAL": (1 << 1, 6),
}
FS_NAMES = [name for name in LANDLOCK if not name.startswith(("CONNECT", "SCOPE"))]
# Rights a rule on a file (not a directory) may carry; the kernel refuses the others there.
FILE_ONLY = {"EXECUTE", "WRITE_FILE", "READ_FILE", "TRUNCATE", "IOCTL_DEV"}
READ = {"EXECUTE", "READ_FILE", "READ_DIR"}
# Everything but MAKE_CHAR/MAKE_BLOCK: a device node made in the project would open the raw disk.
WRITE = READ | {
    "WRITE_FILE", "TRUNCATE", "IOCTL_DEV", "REFER",
    "REMOVE_DIR", "REMOVE_FILE",
    "MAKE_DIR", "MAKE_REG", "MAKE_SOCK", "MAKE_FIFO", "MAKE_SYM",
}
DEVICE = {"READ_FILE", "WRITE_FILE", "TRUNCATE", "IOCTL_DEV"}

# ---------------------------------------------------------------- what is always closed

# Under the user's home: neither readable nor writable unless the user approved that very path.
SECRET_HOME_PATHS = [
    ".ssh", ".aws", ".gnupg", ".config/gcloud", ".netrc",
    ".git-credentials", ".docker", ".kube", ".npmrc", ".pypirc",
    ".config/gh", ".azure", ".password-store",
]
# /dev is closed too (raw disks would bypass every rule); these devices stay usable.
# Writable even by read-only commands:
NULL_DEVICES = ["/dev/null", "/dev/zero", "/dev/full"]
READABLE_DEVICES = ["/dev/random", "/dev/urandom"]
# Writable for approved commands:
TERMINAL_DEVICES = ["/dev/tty", "/dev/ptmx", "/dev/pts"]
# POSIX semaphores and shared memory (multiprocessing): approved commands.
SHARED_MEMORY = "/dev/shm"

# ---------------------------------------------------------------- git: a repository must not run code
# Sent as GIT_CONFIG_COUNT/KEY_n/VALUE_n, which outranks every config file. Values tested on git 2.39.
GIT_ALWAYS = [
    ("core.fsmonitor", "false"),
    ("core.pager", "cat"),
    ("protocol.ext.allow", "never"),
    ("safe.bareRepository", "explicit"),
    # plain ssh: a repository's own ssh command never runs, pushes still work
    ("core.sshCommand", "ssh"),
]
GIT_READ_ONLY = [("core.hooksPath", "/dev/null")]
# Drivers a repository's own config (local or worktree scope) may define; git_settings replaces external
# diff commands for every command and the rest for read-only ones. No git setting turns textconv or
# filters off wholesale (the .gitattributes naming them outrank core.attributesFile; GIT_ATTR_SOURCE
# needs git 2.42 and still reads .git/info/attributes), so each name the repository defines is
# overridden one by one. An empty diff.external, diff.<x>.command or textconv makes git fail ("cannot
# run"): hence a note and `cat`. An empty filter is git's pass-through.
GIT_DRIVER_KEYS = re.compile(
    r"^(diff\.external"
    r"|diff\..+\.(command|textconv)"
    r"|filter\..+\.(clean|smudge|process)"
    r"|gpg\.program"
    r"|gpg\.(openpgp|x509|ssh)\.program)$",
    re.I)
# The closing "#": git appends "$@", which it comments out.
EXTERNAL_DIFF_NOTE = (
    'echo "[khaelor: not running the diff command this repository '
    'configures, for $1; git diff --no-ext-diff shows the diff]" #')
GPG_PROGRAMS = {
    "gpg.program": "gpg",
    "gpg.openpgp.program": "gpg",
    "gpg.x509.program": "gpgsm",
    "gpg.ssh.program": "ssh-keygen",
}

# ---------------------------------------------------------------- probing


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    # __attribute__((packed)) in the header
    _pack_ = 1
    _fields_ = [
        ("allowed_access", ctypes.c_uint64),
        ("parent_fd", ctypes.c_int32),
    ]


class _NetPort(ctypes.Structure):
    _fields_ = [
        ("allowed_access", ctypes.c_uint64),
        ("port", ctypes.c_uint64),
    ]


# (ABI, status line), once per process
_probed: tuple[int, str] | None = None
_libc = None


def probe() -> tuple[int, str]:
    """(Landlock ABI, status line): (7, "landlock ABI 7") or (0, "unavailable: <why>")."""
    global _probed, _libc
    if _probed is not None:
        return _probed
    machine = os.uname().machine
    if os.uname().sysname != "Linux":
        _probed = (0, "unavailable: not Linux")
    elif machine not in MACHINES:
        why = f"Landlock syscall numbers unknown on {machine}"
        _probed = (0, f"unavailable: {why}")
    else:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
        abi = _libc.syscall(
            ctypes.c_long(SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
            ctypes.c_uint32(CREATE_RULESET_VERSION))
        if abi > 0:
            _probed = (abi, f"landlock ABI {abi}")
        else:
            _probed = (0, f"unavailable: {_why(ctypes.get_errno())}")
    return _probed


def _why(error: int) -> str:
    if error == errno.ENOSYS:
        return "the kernel has no Landlock (Linux < 5.13)"
    if error == errno.EOPNOTSUPP:
        return "Landlock is disabled at boot (add landlock to lsm=)"
    return os.strerror(error)


def status() -> str:
    return probe()[1]


def notice() -> str | None:
    """The one line to show at interactive start and on stderr headless when nothing is confined."""
    if probe()[0]:
        return None
    return (f"sandbox {status()}: commands run unconfined, "
            "so every command that is not provably read-only asks first.")


def _mask(names, abi: int) -> int:
    return sum(LANDLOCK[name][0] for name in names if LANDLOCK[name][1] <= abi)

# ---------------------------------------------------------------- the ruleset


def closed_locations(home: Path, khaelor_home: Path, approved: list[str]) -> list[str]:
    """Real paths no command may read or write: the secret home locations, $KHAELOR_HOME and /dev
    (its usable devices are granted one by one). Only an approval that names one opens it:
    approving `cp -r dotfiles/. ~` grants ~ around them, never ~/.ssh itself, and approving
    `cat ~/.ssh/config` grants that file, never ~/.ssh/id_rsa beside it."""
    paths = [os.path.realpath(home / name) for name in SECRET_HOME_PATHS]
    paths += [os.path.realpath(khaelor_home), "/dev"]
    opened = [os.path.realpath(path) for path in approved]
    return [path for path in paths if not _opened_by(path, opened)]


def _opened_by(path: str, grants: list[str]) -> bool:
    """Whether one of `grants` is `path` itself. A grant inside it gets its own rule, and the
    rest of the location stays closed."""
    return path in grants


def build_ruleset(confine: dict, project: Path, temp_dir: Path | None,
                  home: Path, khaelor_home: Path, ports: set[int]) -> int:
    """A Landlock ruleset fd (O_CLOEXEC) for one command. Reads stay open everywhere but the closed
    locations; writes go where `confine` says; TCP connect only with network or to `ports`."""
    abi = probe()[0]
    closed = closed_locations(home, khaelor_home, confine["paths"])
    # Results point at spill files, so those stay readable.
    grants = [("/", READ), (project, READ), (khaelor_home / "spill", READ)]
    grants += [(device, DEVICE) for device in NULL_DEVICES]
    for device in READABLE_DEVICES + TERMINAL_DEVICES:
        grants.append((device, {"READ_FILE", "IOCTL_DEV"}))
    grants += [("/dev", {"READ_DIR"})]
    # "paths_write": the approved paths are writable though the project is not (a checkpoint writes
    # its shadow repository under $KHAELOR_HOME and nothing else).
    approved_rights = WRITE if confine["write"] or confine.get("paths_write") else READ
    for path in confine["paths"]:
        grants.append((_existing(path), approved_rights))
    # The session's TMPDIR is writable even for read-only commands: sort spills big inputs there, and git
    # writes the blobs it hands to a textconv or an external diff there. Nothing else is.
    if temp_dir:
        grants.append((temp_dir, WRITE))
    if confine["write"]:
        grants += [(project, WRITE), (SHARED_MEMORY, WRITE)]
        grants += [(device, DEVICE) for device in TERMINAL_DEVICES]
    network = confine["network"] or abi < 4
    connect = 0 if network else _mask(["CONNECT_TCP"], abi)
    scopes = _mask(["SCOPE_ABSTRACT_UNIX_SOCKET", "SCOPE_SIGNAL"], abi)
    attr = _RulesetAttr(_mask(FS_NAMES, abi), connect, scopes)
    fd = _libc.syscall(
        ctypes.c_long(SYS_CREATE_RULESET), ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if fd < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"landlock_create_ruleset: {os.strerror(error)}")
    try:
        for path, rights in grants:
            _grant(fd, os.path.realpath(path), rights, closed, abi)
        for port in [] if network else sorted(ports):
            rule = _NetPort(_mask(["CONNECT_TCP"], abi), port)
            _add_rule(fd, RULE_NET_PORT, ctypes.byref(rule), f"port {port}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _existing(path: str) -> str:
    """An approved path, or for one still to be made (mkdir, cp to a new name) its nearest existing
    directory: Landlock rules hold on to inodes, and creating a name needs rights on its directory."""
    path = os.path.realpath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent in (path, "/"):
            break
        path = parent
    return path


def _grant(fd: int, path: str, rights: set[str], closed: list[str], abi: int) -> None:
    """Grant `rights` beneath `path`, except beneath the closed locations. Landlock rules only add and are
    inherited, so a closed location inside `path` means: the directory itself gets READ_DIR (its names,
    and those below it, stay listable), and every entry of it but the closed one is granted in turn."""
    if not any(_beneath(place, path) for place in closed):
        _add_path(fd, path, rights, abi)
        return
    _add_path(fd, path, rights & {"READ_DIR"}, abi)
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        # A link is checked where it leads, so it needs no rule
        # (and a rule on it would grant its target).
        if entry.path not in closed and not entry.is_symlink():
            _grant(fd, entry.path, rights, closed, abi)


def within(path: str, places: list[str]) -> bool:
    """Whether `path` is one of `places` or lies inside one."""
    return any(path == place or _beneath(path, place) for place in places)


def _beneath(path: str, parent: str) -> bool:
    """Whether `path` lies strictly inside `parent` (plain strings: pathlib is too slow for this walk)."""
    inside = path.startswith(parent.rstrip("/") + "/")
    return inside and path != parent


def _add_path(fd: int, path: Path, rights: set[str], abi: int) -> None:
    try:
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        # missing (a device this machine lacks): nothing to grant
        return
    try:
        if not os.path.isdir(path):
            rights = rights & FILE_ONLY
        if rights:
            rule = _PathBeneath(_mask(rights, abi), target)
            _add_rule(fd, RULE_PATH_BENEATH, ctypes.byref(rule), str(path))
    finally:
        os.close(target)


def _add_rule(fd: int, kind: int, rule, what: str) -> None:
    failed = _libc.syscall(
        ctypes.c_long(SYS_ADD_RULE), ctypes.c_long(fd), ctypes.c_long(kind),
        rule, ctypes.c_uint32(0))
    if failed:
        error = ctypes.get_errno()
        raise OSError(error, f"landlock_add_rule({what}): {os.strerror(error)}")


def child_hook(fd: int):
    """The preexec_fn that enters the ruleset. It runs after fork in a threaded process, so it only calls
    ctypes functions with arguments built here. CPython calls it before close_fds, so the ruleset fd is
    still open; close_fds and its O_CLOEXEC close it before exec. If it fails, Popen raises in the parent
    and the command does not run."""
    syscall = _libc.syscall
    prctl = _libc.prctl
    args_nnp = (
        ctypes.c_int(PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1),
        ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    args_restrict = (
        ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_long(fd),
        ctypes.c_uint32(0))

    def enter() -> None:
        if prctl(*args_nnp) or syscall(*args_restrict):
            raise OSError("could not enter the Landlock sandbox")
    return enter

# ---------------------------------------------------------------- ports of the session's own servers


def listening_ports(pgids: set[int]) -> set[int]:
    """TCP ports on which processes of these process groups listen: their socket inodes from
    /proc/<pid>/fd, matched with the LISTEN (0A) rows of /proc/net/tcp and tcp6."""
    inodes = set()
    for pid in _pids_in_groups(pgids):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds]
        except OSError:
            continue
        for link in links:
            # "socket:[<inode>]"
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            fields = row.split()
            listening = len(fields) > 9 and fields[3] == "0A"
            if listening and fields[9] in inodes:
                # local_address is <address>:<port>, in hex
                port = fields[1].rsplit(":", 1)[1]
                ports.add(int(port, 16))
    return ports


def _pids_in_groups(pgids: set[int]) -> list[int]:
    if not pgids:
        return []
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) in pgids:
            pids.append(int(entry.name))
    return pids

# ---------------------------------------------------------------- git settings


def git_settings(read_only: bool, repository_keys: list[str]) -> list[tuple[str, str]]:
    """(key, value) pairs for GIT_CONFIG_*: the fixed ones; each external diff command the repository's
    own config defines; and for read-only commands its other drivers too, each replaced by something
    that runs nothing."""
    pairs = list(GIT_ALWAYS)
    if read_only:
        pairs += GIT_READ_ONLY
    for key in repository_keys:
        lowered = key.lower()
        if lowered.endswith((".command", "diff.external")):
            pairs.append((key, EXTERNAL_DIFF_NOTE))
        elif not read_only:
            continue
        elif lowered.endswith(".textconv"):
            # textconv gets the file's path: cat shows it unconverted
            pairs.append((key, "cat"))
        elif lowered.startswith("filter."):
            # an empty filter is a pass-through
            pairs.append((key, ""))
        else:
            pairs.append((key, GPG_PROGRAMS.get(lowered, "gpg")))
    return pairs


def git_env(environ: dict, pairs: list[tuple[str, str]]) -> dict:
    """The GIT_CONFIG_* variables for `pairs`, after any the environment already carries (later wins)."""
    try:
        first = int(environ.get("GIT_CONFIG_COUNT", "0"))
    except ValueError:
        first = 0
    env = {"GIT_CONFIG_COUNT": str(first + len(pairs))}
    for index, (key, value) in enumerate(pairs, first):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env

# ---------------------------------------------------------------- explaining a refusal

DENIED = re.compile(
    r"Permission denied|Operation not permitted|Read-only file system"
    r"|\bEACCES\b|\bEPERM\b",
    re.I)
# Where such a line names its path: quoted ('x', "x", `x', ‘x’), or as "<path>: Permission denied".
DENIED_PATH = re.compile(
    r"""['"`‘]([^'"`’\n]+)['"`’]"""
    r"""|([^\s:'"]+): (?:Permission denied|Operation not permitted|Read-only)""",
    re.I)
CONNECTING = re.compile(
    r"connect|socket|urlopen|https?://|network|port \d+", re.I)
# curl does not say why; Landlock makes it fail at once
CURL_REFUSED = re.compile(r"Couldn't connect to server")


def explain(output: str, confine: dict, cwd: Path, project: Path,
            temp_dir: Path | None, home: Path,
            khaelor_home: Path) -> str | None:
    """A note for the model when a confined command's failure looks like the sandbox refusing it: what
    it would need (a path, write access outside the project, network) and that the user can grant it."""
    lines = [line for line in output.splitlines() if DENIED.search(line)]
    closed = closed_locations(home, khaelor_home, confine["paths"])
    writable = [_existing(path) for path in confine["paths"]]
    if temp_dir:
        writable.append(str(temp_dir))
    if confine["write"]:
        writable.append(str(project))
    needs = []
    for line in lines:
        for match in DENIED_PATH.finditer(line):
            named = match.group(1) or match.group(2)
            path = os.path.realpath(cwd / named)
            need = _need(path, closed, writable, project)
            if need:
                needs.append(need)
    # Landlock refuses a TCP connect with EACCES and names no path. Ports are fixed when a command starts.
    local = ("; a local server is reachable only when it was started "
             "with the process tool before this command, "
             "not by this command itself")
    maybe_network = not needs and not confine["network"]
    if maybe_network and lines and CONNECTING.search(output):
        needs.append(f"network access{local}")
    elif maybe_network and CURL_REFUSED.search(output):
        needs.append("network access, unless the server it connects to "
                     f"is simply not running{local}")
    if not needs:
        return None
    wanted = "; ".join(dict.fromkeys(needs))
    return ("[khaelor sandbox: this command ran confined to what its "
            "permission allowed, and the sandbox refused it: "
            f"it would need {wanted}. "
            "The same command will fail the same way. "
            "If the task needs this, ask the user: say so in your reply, "
            "or run a command that names that path or URL itself, "
            "so that the user's permission question covers it.]")


def _need(path: str, closed: list[str], writable: list[str], project: Path) -> str | None:
    """What a refused path would have needed, or None when the sandbox allowed it (the failure is another)."""
    if within(path, closed):
        return f"access to {path} (a protected location)"
    if "/dev/" in path:
        return None
    roots = [root for root in writable if within(path, [root])]
    if not roots:
        where = ", outside the project"
        if _beneath(path, str(project)):
            where = ""
        return f"write access to {path}{where}"
    # See _grant: rights to make names in this folder would open the
    # protected location inside it.
    folder = os.path.dirname(path)
    holding = []
    if folder in roots:
        holding = [place for place in closed if _beneath(place, folder)]
    if holding:
        return (f"{path} made by the user: it was approved, "
                "but its folder holds a protected location "
                f"({holding[0]}), "
                "where the sandbox cannot let a command make new names")
    return None
