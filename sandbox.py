"""sandbox.py: the boundary. Every command khaelor starts is held by the kernel to what its
permission decision granted, whatever the judgement of its text got wrong: Landlock (files, TCP
ports, signal and abstract-socket scopes), seccomp-BPF (socket families, other processes, the
kernel's other doors, the terminal), an approved command's mount namespace (the rest read-only,
the terminals and other programs' shared memory out of reach), capabilities dropped, rlimits, an
allow-listed environment; all through ctypes, no helper binary.

Owns: the one secret vocabulary (what the kernel closes, what permissions.py asks before reading);
the sandbox shape a decision grants (`Confine`); probing Landlock and seccomp; the read allow-list
and the secrets closed inside it (the home's, the system's, the project's own secret files and
their hard links); building a ruleset in the parent from a `Confine`; the seccomp programs; an
approved command's mounts; the preexec hook that enters all of it in the child; the connect
supervisor that keeps an approved command's TCP on loopback (connects: the session's servers); the
child's environment; the git settings every command carries; the note that explains a refusal;
opening a path through no symbolic link (openat2), for khaelor's own file tools; the one
gitignore-style glob translator; and the project folders that run code later (GUARDED_DIRS).
Must not: import anything of ours, run a program (tools.py starts every process), or claim to
confine what it does not: `layers()` says which layer this kernel enforces, and without Landlock or
seccomp every command asks (permissions.py).

What stays open: the files a command was given open (its stdin, stdout, stderr);
/proc/<pid>/cmdline of other processes; names stay listable along the way to a closed location
(READ_DIR; see _grant).
"""

import contextlib
import ctypes
import errno
import fnmatch
import functools
import glob
import os
import re
import resource
import select
import socket
import stat
import struct
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from socket import AF_INET, AF_INET6, AF_UNIX, IPPROTO_TCP, SOCK_SEQPACKET, SOCK_STREAM

# ------------------------------------------------------- Landlock constants (linux/landlock.h)

SYS_CREATE_RULESET = 444
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
# The Landlock syscalls got one number on every architecture (asm-generic and x86 tables alike);
# mips and alpha offset theirs, so only these machines are trusted with the numbers above.
MACHINES = {
    "x86_64", "i686", "aarch64", "arm64", "armv7l", "armv8l",
    "riscv64", "ppc64le", "s390x", "loongarch64",
}
# landlock_create_ruleset flag: return the ABI version
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_SET_CHILD_SUBREAPER = 36
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# What a read-only command may use: one file's size, CPU seconds, memory; the temp dir's total.
READ_ONLY_FILE_CAP = 512 << 20
READ_ONLY_CPU_S = 600
READ_ONLY_MEMORY = 8 << 30
TEMP_DIR_CAP = 1 << 30

# Landlock's filesystem rights, bit i being the i-th, each in ABI 1 unless FIRST_ABI says
FS_NAMES = (
    "EXECUTE", "WRITE_FILE", "READ_FILE", "READ_DIR", "REMOVE_DIR", "REMOVE_FILE", "MAKE_CHAR",
    "MAKE_DIR", "MAKE_REG", "MAKE_SOCK", "MAKE_FIFO", "MAKE_BLOCK", "MAKE_SYM", "REFER", "TRUNCATE",
    "IOCTL_DEV",
)
FIRST_ABI = {"REFER": 2, "TRUNCATE": 3, "IOCTL_DEV": 5}
# right -> (bit, first ABI that has it): the filesystem's, then network, then scopes.
LANDLOCK = {name: (1 << bit, FIRST_ABI.get(name, 1)) for bit, name in enumerate(FS_NAMES)}
LANDLOCK.update({
    # BIND_TCP (1 << 0) is left unhandled: dev servers may bind
    "CONNECT_TCP": (1 << 1, 4),
    "SCOPE_ABSTRACT_UNIX_SOCKET": (1 << 0, 6),
    "SCOPE_SIGNAL": (1 << 1, 6),
})
# Sets of rights are frozen, so that _mask can remember them.
# Rights a rule on a file (not a directory) may carry; the kernel refuses the others there.
FILE_ONLY = frozenset({"EXECUTE", "WRITE_FILE", "READ_FILE", "TRUNCATE", "IOCTL_DEV"})
READ = frozenset({"EXECUTE", "READ_FILE", "READ_DIR"})
# Everything but MAKE_CHAR/MAKE_BLOCK: a device node made in the project would open the raw disk.
WRITE = frozenset(FS_NAMES) - {"MAKE_CHAR", "MAKE_BLOCK"}
DEVICE = frozenset({"READ_FILE", "WRITE_FILE", "TRUNCATE", "IOCTL_DEV"})
READ_DEVICE = frozenset({"READ_FILE", "IOCTL_DEV"})
LIST_ONLY = frozenset({"READ_DIR"})

# ---------------------------------------------------------------- what is always closed

# The one secret vocabulary: what the kernel closes, what permissions.py asks before reading, what
# grep and glob skip. Secret files by name (lower-cased: .ENV is .env on a case-insensitive file
# system); a command searching a tree that holds one asks.
# Environment files, KEY=value lines (direnv's: export KEY=value): tools.py also masks their
# values in every output.
ENV_FILES = (".env", ".env.*", "*.env", ".envrc")
SECRET_NAMES = (
    *ENV_FILES,
    # credentials of git, package registries and hosts
    ".git-credentials", ".npmrc", ".pypirc", ".netrc", "_netrc",
    # SSH identities are named id_<algorithm> (id_*), spelled out so that id_utils.py stays code
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "id_xmss*",
    # keys and certificates
    "*.pem", "*.key", "*.p12", "*.pfx",
    # files named for what they hold
    "credentials", "credentials.*", "secrets.*", ".pgpass",
)
# Templates that hold placeholders, not secrets (.env.dist is not one: projects commit real values
# under that name too, so it asks and its values are masked).
SECRET_TEMPLATES = (".env.example", ".env.sample", ".env.template", "*.env.example")
# Under the user's home: neither readable nor writable unless the user approved that very path:
# these folders, and each secret file SECRET_NAMES spells out (~/.netrc, ~/.pgpass, …).
SECRET_HOME_PATHS = [
    ".ssh", ".aws", ".gnupg", ".config/gcloud",
    ".docker", ".kube",
    ".config/gh", ".azure", ".password-store",
    # in the folders HOME_READABLE opens: git's other credential store, cargo's registry token,
    # Maven's master password (settings.xml's passwords are encrypted with it)
    ".config/git/credentials", ".cargo/credentials", ".cargo/credentials.toml",
    ".m2/settings-security.xml",
    # coding agents' sign-ins (Claude Code's, Codex's), which an approval naming ~ would open
    ".claude/.credentials.json", ".codex/auth.json",
] + [name for name in SECRET_NAMES if not any(ch in name for ch in "*?[")]


# A gitignore-style glob, token by token, as git's wildmatch reads it ({a,b} as ripgrep's): `*`, `?`
# and a [class] stay within one directory, `**` crosses them only as a whole component, `\` escapes.
GLOB_TOKEN = re.compile(r"(?<![^/])(\*\*/|\*\*\Z)|(\*+|\?|\[[!^]?\]?+(?:\[:[a-z]+:\]|\\.|[^]\\])*\]"
                        r"|\{[^}]*\}|\\?.)", re.S)
GLOB_FIXED = {"**/": "(?s:.*/)?", "**": "(?s:.*)", "*": "[^/]*", "?": "[^/]"}
# POSIX classes as ASCII, alike in a regex and in fnmatch ("!" never first): globs', grep's
POSIX_CLASSES = {
    "alpha": "a-zA-Z", "digit": "0-9", "alnum": "a-zA-Z0-9", "upper": "A-Z", "lower": "a-z",
    "space": " \t\n\v\f\r", "blank": " \t", "punct": ":-@!-/[-`{-~", "xdigit": "0-9A-Fa-f",
    "word": "a-zA-Z0-9_", "cntrl": "\0-\x1f\x7f", "print": " -~", "graph": "!-~",
}
# a [class]'s member: a [:name:], a character or a range (a character may be escaped)
GLOB_MEMBER = re.compile(r"\[:(" + "|".join(POSIX_CLASSES) + r"):\]|\\?(.)(?:-\\?([^]]))?", re.S)


def glob_regex(pattern: str) -> str:
    """The regex source for a gitignore-style glob. The one translator: Claude Code's path rules
    (permissions.py) and grep/glob's patterns (tools.py)."""
    out = []
    for deep, token in GLOB_TOKEN.findall(pattern):
        if deep or token[0] in "*?":
            out.append(GLOB_FIXED[deep or token[0]])
        elif token[0] == "[" and len(token) > 1:
            negated = token[1] in "!^"
            members = GLOB_MEMBER.sub(_glob_member, token[1 + negated:-1])
            out.append("(?!/)[" + "^" * negated + members + "]")
        elif token[0] == "{" and len(token) > 1:
            alternatives = map(glob_regex, token[1:-1].split(","))
            out.append("(?:" + "|".join(alternatives) + ")")
        else:
            out.append(re.escape(token[-1]))
    return "".join(out)


def _glob_member(member: re.Match) -> str:
    if member[3] and member[3] < member[2]:
        return "\0"    # a reversed range ([z-a]) matches nothing, as in git: no path holds a NUL
    low = POSIX_CLASSES.get(member[1]) or re.escape(member[2])
    return low + ("-" + re.escape(member[3]) if member[3] else "")


def glob_base(pattern: str) -> str:
    """The directory a glob starts from: its components before the first wildcard. The one rule:
    what a glob call reads (tools.py) and what a wildcard may delete (permissions.py)."""
    parts = pattern.split("/")
    wild = [n for n, part in enumerate(parts) if any(ch in part for ch in "*?[{")]
    base = "/".join(parts[:min(wild, default=len(parts))])
    if base:
        return base
    return "/" if pattern.startswith("/") else "."


@functools.cache
def secret_matcher(patterns: tuple[str, ...], paths: tuple[str, ...] = ()):
    """Whether a path is secret: its name matches one of `patterns` (SECRET_NAMES, or a decision's
    `hide`) in any case (.ENV holds what .env would), and is never a template; or all of it one of
    the `paths` regexes (a decision's hide_paths, deny_paths: project-relative)."""
    secret = re.compile("|".join(map(fnmatch.translate, patterns)) or "(?!)", re.IGNORECASE).match
    template = re.compile("|".join(map(fnmatch.translate, SECRET_TEMPLATES)), re.IGNORECASE).match
    whole = re.compile("|".join(paths) or "(?!)").fullmatch
    named = lambda name: secret(name) is not None and template(name) is None
    return lambda path: named(path.rpartition("/")[2]) or whole(path) is not None


def is_secret_name(name: str) -> bool:
    """A file name (or path: its last component) that holds credentials; not a template."""
    return secret_matcher(SECRET_NAMES)(name)


def is_secret_path(path: str, home: str) -> bool:
    """An absolute path that holds credentials: a secret name, or in a secret location of `home`
    (as named, or as resolved: a dotfile manager links ~/.kube to where it keeps it)."""
    if is_secret_name(path):
        return True
    return within(path, _home_secret_places(home))


@functools.cache
def _home_secret_places(home: str) -> tuple[str, ...]:
    """SECRET_HOME_PATHS and HOME_CREDENTIALS in `home`, as named and as resolved, once a process:
    the judge asks for every path it reads (16,000 realpath calls for 983 commands), and a link
    made later is still closed by the sandbox, which resolves them anew for each ruleset
    (closed_locations)."""
    places = [os.path.join(home, name) for name in SECRET_HOME_PATHS + HOME_CREDENTIALS]
    return tuple(places + [os.path.realpath(place) for place in places])


# /dev is closed too (raw disks would bypass every rule); these devices stay usable.
# Writable even by read-only commands:
NULL_DEVICES = ["/dev/null", "/dev/zero", "/dev/full"]
READABLE_DEVICES = ["/dev/random", "/dev/urandom"]
# Approved commands' only, for ptys of their own (a read-only one would read the user's keys):
TERMINAL_DEVICES = ["/dev/tty", "/dev/ptmx", "/dev/pts"]
# POSIX semaphores and shared memory (multiprocessing): approved commands.
SHARED_MEMORY = "/dev/shm"

# ---------------------------------------------------------------- the shape a decision grants


@dataclass(frozen=True)
class Confine:
    """The sandbox one call runs in: permissions.py builds it for a decision, tools.py and this
    module enforce it. The defaults: an approved command's (project writes, no network)."""
    # writes in the project; False: read-only (only the session temp dir is writable)
    write: bool = True
    # any network; False: TCP only to the session's own loopback servers (none when read-only)
    network: bool = False
    # real paths outside the project the call may open (read, or write with `write`)
    paths: tuple[str, ...] = ()
    # of them, those it only reads, even with `write`: `cat ~/.bashrc > out && make` reads ~/.bashrc
    read_paths: tuple[str, ...] = ()
    # the approved paths are writable though the project is not (a checkpoint's shadow repository)
    paths_write: bool = False
    # reading the project's secret files was approved
    secrets: bool = False
    # the secret files that approval named (real paths): a read-only line opens those, not every
    # secret of the project (none named: all, as `khaelor sandbox --secrets` asks)
    secret_paths: tuple[str, ...] = ()
    # a read the user's or the project's rules ask about was approved (hide_paths then opened): as
    # a secret file's, a person's to answer, never --yes's
    rule_asked: bool = False
    # name patterns of the project's secret files, closed to a read-only command (SECRET_NAMES)
    hide: tuple[str, ...] = ()
    # regexes over project paths the user's rules ask about or deny reading (closed as `hide` is)
    hide_paths: tuple[str, ...] = ()
    # those of them denied: closed to every command, approved or not
    deny_paths: tuple[str, ...] = ()
    # regexes over project paths the user's rules deny writing: read-only to every command
    frozen_paths: tuple[str, ...] = ()
    # and project files by name: the project's permission files, changed only by the user
    frozen_files: tuple[str, ...] = ()
    # what --yes grants of `network`: only where every program of the line is known to need it
    unattended_network: bool = False
    # what --yes grants of `paths`: only where an approved install puts packages
    unattended_paths: tuple[str, ...] = ()
    # the line runs git's network (fetch, push) and plain settings alone: under --yes only such a
    # line sees the credentials in .git/config (tools.prepare)
    git_network: bool = False
    # approved by --yes, not by a person: the project's secret files stay closed, as to a
    # read-only command (no copy or encoding of them reaches the model or a network it is given)
    unattended: bool = False
    # the user saw this very call: what it names, it may change (tools.guard_check)
    attended: bool = False
    # the user's own `!` commands: no sandbox at all
    unconfined: bool = False


# ------------------------------------------------------- git: a repository must not run code
# Sent as GIT_CONFIG_COUNT/KEY_n/VALUE_n, which outranks every config file (tested on git 2.39).
# git config entries a command may set freely (anything else can run code or reroute git): the
# guard keeps the rest of .git/config as it was, and permissions.py asks before a `git config` that
# sets one, every time (git in the same line would run it before the guard looks)
GIT_CONFIG_PLAIN = re.compile(
    r"remote\..*\.(url|pushurl|fetch|push|tagopt|prune)|branch\..*|submodule\..*\.(url|active)"
    r"|user\.\w+|init\.defaultbranch|pull\.\w+|push\.default|gc\.\w+|extensions\.\w+"
    r"|core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase"
    r"|precomposeunicode|autocrlf|eol|symlinks)", re.I)
GIT_ALWAYS = [
    ("core.fsmonitor", "false"),
    ("core.pager", "cat"),
    ("protocol.ext.allow", "never"),
    ("safe.bareRepository", "explicit"),
    # plain ssh: a repository's own ssh command never runs, pushes still work
    ("core.sshCommand", "ssh"),
]
GIT_READ_ONLY = [("core.hooksPath", "/dev/null")]
# The project's folders whose files run code or grant rights later, unconfined: git's hooks,
# khaelor's and Claude Code's permission files, the editor's workspace settings (interpreters,
# terminal environments, tasks, as the folder opens), a dev container's initializeCommand (run on
# the host), Zed's language servers, Cursor's MCP servers (MCPoison: a changed approved server ran
# unasked). tools.py's guard puts back what a step changed there unasked, and the write tool asks
# a person (permissions.runs_later: not acceptEdits, not --yes).
GUARDED_DIRS = (".git/hooks", ".khaelor", ".claude", ".vscode", ".devcontainer", ".zed", ".cursor")
# Drivers a repository's own config (local or worktree scope) may define; git_settings replaces
# external diff commands for every command and the rest for read-only ones. No git setting turns
# textconv or filters off wholesale (the .gitattributes naming them outrank core.attributesFile;
# GIT_ATTR_SOURCE needs git 2.42 and still reads .git/info/attributes), so each name the repository
# defines is overridden one by one. An empty diff.external, diff.<x>.command or textconv makes git
# fail ("cannot run"): hence a note and `cat`. An empty filter is git's pass-through.
# The closing "#": git appends "$@", which it comments out.
EXTERNAL_DIFF_NOTE = (
    'echo "[khaelor: not running the diff command this repository '
    'configures, for $1; git diff --no-ext-diff shows the diff]" #')
# (key, what replaces it, for every command: else for read-only ones only); a textconv gets the
# file's path, which cat shows unconverted.
GIT_DRIVERS = [
    (r"diff\.external|diff\..+\.command", EXTERNAL_DIFF_NOTE, True),
    (r"diff\..+\.textconv", "cat", False),
    (r"filter\..+\.(clean|smudge|process)", "", False),
    (r"gpg\.program|gpg\.openpgp\.program", "gpg", False),
    (r"gpg\.x509\.program", "gpgsm", False),
    (r"gpg\.ssh\.program", "ssh-keygen", False),
]
GIT_DRIVER_KEYS = re.compile("^(" + "|".join(key for key, _, _ in GIT_DRIVERS) + ")$", re.I)

# ---------------------------------------------------------------- probing

# the C library through ctypes, loaded by probe(): every system call here goes through it
_libc = None
UNAVAILABLE = {
    errno.ENOSYS: "the kernel has no Landlock (Linux < 5.13)",
    errno.EOPNOTSUPP: "Landlock is disabled at boot (add landlock to lsm=)",
}


@functools.cache
def probe() -> tuple[int, str]:
    """(Landlock ABI, status line): (7, "landlock ABI 7") or (0, "unavailable: <why>"), once per
    process."""
    global _libc
    machine = os.uname().machine
    if os.uname().sysname != "Linux":
        return (0, "unavailable: not Linux")
    if machine not in MACHINES:
        return (0, f"unavailable: Landlock syscall numbers unknown on {machine}")
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.syscall.restype = ctypes.c_long
    try:
        abi = _syscall(SYS_CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
    except OSError as error:
        why = UNAVAILABLE.get(error.errno, error.strerror)
        return (0, f"unavailable: {why}")
    return (abi, f"landlock ABI {abi}")


def _longs(*args) -> list:
    """Arguments for syscall(2) and prctl(2): ints as C longs, pointers as they are."""
    return [ctypes.c_long(arg) if isinstance(arg, int) else arg for arg in args]


def _syscall(number: int, *args, what: str = "") -> int:
    """syscall(2); OSError with its errno when it fails."""
    result = _libc.syscall(*_longs(number, *args))
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}{os.strerror(error)}")
    return result


def status() -> str:
    return probe()[1]


def enforced() -> bool:
    """Whether the whole boundary holds here: Landlock and seccomp."""
    return probe()[0] > 0 and seccomp_available()


def notice() -> str | None:
    """The one line to show at interactive start and on stderr headless when a layer is missing."""
    missing = [name for name, held, _ in layers()[:5] if not held]
    if not missing:
        return None
    if enforced():
        return f"sandbox: this kernel lacks {', '.join(missing)}; the rest holds."
    return (f"sandbox: this kernel lacks {', '.join(missing)} ({status()}): commands are not "
            "held to their decision, so every command asks first.")


@functools.cache
def _mask(names: tuple | frozenset, abi: int, directory: bool = True) -> int:
    """The bits of the rights `names` that Landlock `abi` knows; for a file (not a `directory`),
    only the FILE_ONLY ones (asked for every rule: cached)."""
    if not directory:
        names = names & FILE_ONLY
    return sum(LANDLOCK[name][0] for name in names if LANDLOCK[name][1] <= abi)

# ---------------------------------------------------------------- reads: an allow-list

# System directories every command may read, where they exist.
SYSTEM_READABLE = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/var",
    "/nix", "/snap", "/proc", "/sys", "/run/systemd/resolve", "/run/resolvconf",
]
# ... except what they keep secret (host keys are added by name: /etc/ssh/ssh_host_*_key).
SYSTEM_SECRETS = [
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
    "/etc/sudoers.d", "/etc/ssl/private", "/etc/krb5.keytab", "/etc/security/opasswd",
    "/var/lib/sss", "/var/lib/docker", "/var/lib/containers", "/var/lib/libvirt",
    # root's own stores (a root khaelor, as in a CI container, reads its 0600 files): debconf's
    # and MySQL's passwords, Wi-Fi, VPN and TLS keys
    "/var/cache/debconf/passwords.dat", "/etc/mysql/debian.cnf",
    "/etc/NetworkManager/system-connections", "/etc/wireguard", "/etc/ipsec.secrets",
    "/etc/ppp/chap-secrets", "/etc/ppp/pap-secrets", "/etc/letsencrypt",
    # the user's own under /var: mail, print and cron jobs, what programs keep in /var/tmp (an
    # editor's recovery copy of a file edited elsewhere); the system's copies of /etc/shadow
    "/var/mail", "/var/spool", "/var/tmp", "/var/backups",
]
# Under $HOME only the toolchains and git's own config are readable; the rest (shell histories,
# ~/.claude, ~/.config/*, browser profiles) opens only by an approval that names a path.
HOME_READABLE = [
    ".pyenv", ".rbenv", ".nodenv", ".nvm", ".volta", ".asdf", ".cargo", ".rustup", "go",
    ".sdkman", ".bun", ".deno", ".local/bin", ".local/lib", ".local/pipx", ".m2", ".gradle",
    ".gitconfig", ".config/git",
]
# ... whose build tools keep plaintext credentials in files they read on every build: closed to
# read-only commands, and secret to the judge (a command that names one asks, and --yes never
# approves it), but readable by an approved build, which needs them (--yes's reads a copy without
# their secrets: tools.Workspace.home_credentials_masked)
HOME_CREDENTIALS = [".gradle/gradle.properties", ".m2/settings.xml"]


@functools.cache
def readable_roots(home: str, path: str) -> list[str]:
    """What every command may read besides the project: system directories, the toolchains under
    `home`, each entry of `path` (PATH) with the prefix its programs load from, and this
    interpreter's prefix."""
    roots = list(SYSTEM_READABLE)
    roots += [os.path.join(home, name) for name in HOME_READABLE]
    for config in (".gitconfig", ".config/git/config"):
        roots += git_includes(os.path.join(home, config), home)
    roots += [sys.prefix, sys.base_prefix]
    for entry in path.split(os.pathsep):
        if os.path.isabs(entry):
            roots += _toolchain(entry)
    real = [os.path.realpath(root) for root in roots if os.path.exists(root)]
    # ~ itself on PATH is no toolchain (build_ruleset leaves it out of one that holds it)
    return [root for root in dict.fromkeys(real) if root != os.path.realpath(home)]


def git_includes(config: str, home: str, depth: int = 0) -> list[str]:
    """The files a git config includes ([include] and [includeIf] path = …), and theirs, as git
    does, ten deep: one it cannot read fails every git command (a ~/.gitconfig.local is common)."""
    try:
        with open(config, errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    found = []
    section = ""
    for line in lines:
        line = line.strip()
        if line.startswith("["):
            section = line[1:].split("]")[0].split(" ")[0].lower()
            continue
        key, _, value = line.partition("=")
        if section not in ("include", "includeif") or key.strip().lower() != "path":
            continue
        value = value.strip().strip('"')
        if value.startswith("~/"):
            value = os.path.join(home, value[2:])
        path = os.path.join(os.path.dirname(config), value)
        found.append(path)
        if depth < 10:
            found += git_includes(path, home, depth + 1)
    return found


def _toolchain(entry: str) -> list[str]:
    """A PATH entry and, for a `…/bin`, the libraries beside it (a venv, /opt/node, ~/.nvm/…)."""
    if os.path.basename(entry.rstrip("/")) not in ("bin", "sbin"):
        return [entry]
    prefix = os.path.dirname(entry.rstrip("/"))
    beside = ["lib", "lib64", "libexec", "include", "pyvenv.cfg"]
    return [entry] + [os.path.join(prefix, name) for name in beside]


def home_credentials(home: str) -> list[str]:
    """HOME_CREDENTIALS that exist in `home`, as real paths (what a ruleset or a cover names)."""
    paths = [os.path.realpath(os.path.join(home, name)) for name in HOME_CREDENTIALS]
    return [path for path in paths if os.path.isfile(path)]


@functools.cache
def system_secrets() -> list[str]:
    return SYSTEM_SECRETS + glob.glob("/etc/ssh/ssh_host_*key")


class SecretScan:
    """The project's secret files: names matching the `hide` patterns and every hard link to one
    (a link elsewhere named notes.txt is the same inode). The walk follows no link (a symbolic
    link to a secret is refused by Landlock where it leads) and skips .git; a directory is
    listed again only when its mtime changed, so a .env made mid-session is left out of the next
    command."""

    def __init__(self, skipped: tuple[str, ...] = ()):
        self.matches = self.root = None
        # folders not walked, by name (masking's look for .env files leaves dependencies out)
        self.skipped = (".git", *skipped)
        # directory -> (mtime_ns, {secret inodes}, [subdirectory names], {inode: [entry names]})
        self.listings: dict[str, tuple] = {}
        # counts the folders listed anew: unchanged, no folder of the project changed
        self.version = 0

    def find(self, root: str, names: tuple[str, ...], paths: tuple[str, ...] = ()) -> list[str]:
        if not (names or paths):
            return []
        matches = secret_matcher(tuple(names), tuple(paths))
        if (matches, root) != (self.matches, self.root):
            self.matches, self.root = matches, root
            self.listings = {}
        visited = {}
        stack = [root]
        while stack:
            directory = stack.pop()
            listing = self._listing(directory)
            visited[directory] = listing
            stack += [os.path.join(directory, name) for name in listing[2]]
        self.listings = visited
        inodes = set().union(*(listing[1] for listing in visited.values()))
        secrets = []
        for directory, (_, _, _, by_inode) in visited.items():
            for inode in inodes & by_inode.keys():
                secrets += [os.path.join(directory, name) for name in by_inode[inode]]
        return secrets

    def _listing(self, directory: str) -> tuple:
        try:
            mtime = os.stat(directory, follow_symlinks=False).st_mtime_ns
        except OSError:
            return (0, set(), [], {})
        cached = self.listings.get(directory)
        if cached and cached[0] == mtime:
            return cached
        self.version += 1
        found = set()
        subdirectories = []
        by_inode = {}
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                path = entry.path[len(self.root) + 1:]
                folder = entry.is_dir(follow_symlinks=False)
                # a secret path, or a folder whose every entry is one (secrets/**; NUL: any name)
                if self.matches(path) or folder and self.matches(path + "/\0"):
                    found.add(entry.inode())
                # a secret folder is walked too: a hard link elsewhere to a file in it is secret
                if folder and entry.name not in self.skipped:
                    subdirectories.append(entry.name)
                by_inode.setdefault(entry.inode(), []).append(entry.name)
        return (mtime, found, subdirectories, by_inode)


# ---------------------------------------------------------------- the ruleset


def closed_locations(home: Path, khaelor_home: Path, approved: list[str]) -> list[str]:
    """Real paths no command may read or write: the secret home locations, $KHAELOR_HOME, the
    system's secrets and /dev (its usable devices are granted one by one). Only an approval that
    names one opens it: approving `cp -r dotfiles/. ~` grants ~ around them, never ~/.ssh
    itself, and approving `cat ~/.ssh/config` grants that file, never ~/.ssh/id_rsa beside it."""
    paths = [os.path.realpath(home / name) for name in SECRET_HOME_PATHS]
    paths += [os.path.realpath(khaelor_home), "/dev"] + system_secrets()
    opened = [os.path.realpath(path) for path in approved]
    return [path for path in paths if path not in opened]


def spill_folder(khaelor_home: Path, project: Path) -> Path:
    """Where the outputs too long for a result are kept for one project: results point at them, so
    its commands read them, and never another project's (one may hold what a command printed of
    that project's secrets)."""
    # here, not at the top: hashlib costs `khaelor --version` ~4 ms
    from hashlib import sha256
    digest = sha256(os.path.realpath(project).encode()).hexdigest()[:12]
    return Path(khaelor_home) / "spill" / digest


def _grants(confine: Confine, project: Path, temp_dir: Path | None, home: Path,
            khaelor_home: Path) -> list[tuple[str, frozenset[str]]]:
    """(real path, rights beneath it) for one command, what its ruleset grants and what explain
    reads: reads from the allow-list (system directories, toolchains, the project, its spill
    files, the temp dir), writes where `confine` says."""
    roots = readable_roots(str(home), os.environ.get("PATH", ""))
    # one inside a closed location (a git include of ~/.ssh/config, ~/.aws/bin on PATH) opens
    # nothing there
    closed = closed_locations(home, khaelor_home, confine.paths)
    grants = [(root, READ) for root in roots if not within(root, closed)]
    grants += [(project, READ), (spill_folder(khaelor_home, project), READ)]
    grants += [(device, DEVICE) for device in NULL_DEVICES]
    grants += [(device, READ_DEVICE) for device in READABLE_DEVICES]
    grants += [("/dev", LIST_ONLY)]
    writes_paths = confine.write or confine.paths_write
    read = [path for path in confine.paths if not writes_paths or path in confine.read_paths]
    grants += [(target, READ) for target in filter(None, map(approved_target, read))]
    if confine.write:
        grants += [(device, DEVICE) for device in TERMINAL_DEVICES]
    grants = [(os.path.realpath(path), rights) for path, rights in grants]
    # as _writes names them: the shm folder must not be resolved
    return grants + [(place, WRITE) for place in _writes(confine, project, temp_dir)]


def _writes(confine: Confine, project: Path, temp_dir: Path | None) -> list[str]:
    """The paths a command may write beneath (devices aside): real, but for the shm folder."""
    # The session's TMPDIR is writable even for read-only commands: sort spills big inputs there,
    # and git writes the blobs it hands to a textconv or an external diff there.
    places = [temp_dir] if temp_dir else []
    if confine.write or confine.paths_write:
        written = [path for path in confine.paths if path not in confine.read_paths]
        places += filter(None, map(approved_target, written))
    if confine.write:
        places += [project, SHARED_MEMORY]
    places = [os.path.realpath(place) for place in places]
    if confine.write and temp_dir:
        # what its mount namespace shows as /dev/shm (Mounts): Landlock checks no rule on the way
        # up from a mount through the place it is mounted on, so this folder needs its own. Not
        # resolved: every command writes the temp dir, so a read-only one could leave a link to ~
        # there, which must open nothing (_add_path and _bind_no_links refuse a link)
        places.append(shared_memory_folder(temp_dir))
    return places


def shared_memory_folder(temp_dir: Path) -> str:
    """The session temp dir's folder an approved command sees as /dev/shm."""
    return os.path.join(os.path.realpath(temp_dir), "shm")


def build_ruleset(confine: Confine, project: Path, temp_dir: Path | None, home: Path,
                  khaelor_home: Path, ports: set[int], hidden: list[str] = ()) -> int:
    """A Landlock ruleset fd (O_CLOEXEC) for one command: its _grants, except beneath the closed
    locations and reading `hidden` (secret files); TCP connect only with network or to `ports`."""
    abi = probe()[0]
    closed = closed_locations(home, khaelor_home, confine.paths)
    grants = _grants(confine, project, temp_dir, home, khaelor_home)
    network = confine.network or abi < 4
    connect = 0 if network else _mask(("CONNECT_TCP",), abi)
    scopes = _mask(("SCOPE_ABSTRACT_UNIX_SOCKET", "SCOPE_SIGNAL"), abi)
    # handled_access_fs, handled_access_net, scoped
    attr = (ctypes.c_uint64 * 3)(_mask(FS_NAMES, abi), connect, scopes)
    fd = _syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0,
                  what="landlock_create_ruleset: ")
    try:
        # what a command changes is opened afresh: the project, and the temp dir (its shm folder)
        fresh = [os.path.realpath(place) for place in filter(None, (project, temp_dir))]
        # a read grant that holds the home (a PATH entry of ~ or /; /var, where a CI user's home
        # is) leaves it out: only HOME_READABLE's part of it is read (its own grants)
        closed_to_reads = closed + [os.path.realpath(home)]
        for path, rights in grants:
            kept_out = closed_to_reads if rights == READ else closed
            _grant(fd, path, rights, kept_out, abi, fresh, list(hidden))
        for port in [] if network else sorted(ports):
            # allowed_access, port
            rule = (ctypes.c_uint64 * 2)(_mask(("CONNECT_TCP",), abi), port)
            _syscall(SYS_ADD_RULE, fd, RULE_NET_PORT, ctypes.byref(rule), 0,
                     what=f"landlock_add_rule(port {port}): ")
    except BaseException:
        os.close(fd)
        raise
    return fd


def approved_target(path: str) -> str | None:
    """What approving `path` opens: the path itself; for one still to be made (mkdir, cp to a new
    name), its folder, only while that folder is empty (khaelor makes missing ones: make_parents):
    making a name needs rights on its folder, and rights on ~ would open all of ~. None: nothing."""
    path = os.path.realpath(path)
    if os.path.lexists(path):
        return path
    folder = os.path.dirname(path)
    if os.path.isdir(folder) and not os.listdir(folder):
        return folder
    return None


def make_parents(paths: list[str]) -> None:
    """Make the missing folders of approved paths still to be made (the user approved the path,
    so khaelor makes its folders), left empty for the command to make the path itself."""
    for path in paths:
        folder = os.path.dirname(os.path.realpath(path))
        if not os.path.lexists(path) and not os.path.lexists(folder):
            os.makedirs(folder, mode=0o700)


def _grant(fd: int, path: str, rights: frozenset[str], closed: list[str], abi: int,
           fresh: list[str], hidden: list[str]) -> None:
    """Grant `rights` beneath `path`, except beneath the closed locations and reading the `hidden`
    ones. Landlock rules only add and are inherited, so a closed location inside `path` means: the
    directory itself gets READ_DIR (its names, and those below it, stay listable), and every entry
    of it but the closed one is granted in turn; a hidden one, the rights but reading (an approved
    command still writes beside a file it may not read)."""
    prefix = path.rstrip("/") + "/"
    inside = [place for place in closed if place.startswith(prefix)]
    unread = [place for place in hidden if place.startswith(prefix)]
    if not (inside or unread):
        _add_path(fd, path, rights, abi, fresh)
        return
    kept = rights & LIST_ONLY if inside else rights - {"READ_FILE", "EXECUTE"}
    _add_path(fd, path, kept, abi, fresh)
    entries = []
    with contextlib.suppress(OSError):
        entries = list(os.scandir(path))
    for entry in entries:
        # A link is checked where it leads, so it needs no rule
        # (and a rule on it would grant its target).
        if entry.path not in inside + unread and not entry.is_symlink():
            _grant(fd, entry.path, rights, inside, abi, fresh, unread)


def within(path: str, places: list[str]) -> bool:
    """Whether `path` is one of `places` or lies inside one (plain strings: pathlib is too slow for
    the walks that ask it)."""
    return any(path == place or path.startswith(place.rstrip("/") + "/") for place in places)


# path -> (O_PATH fd, is a directory), for the paths outside the project, which every command's
# ruleset grants again: opened once per session, so a ruleset costs its add_rule calls only.
_opened: dict[str, tuple[int, bool]] = {}
OPENED_CAP = 512


def _add_path(fd: int, path: str, rights: frozenset[str], abi: int, fresh: list[str]) -> None:
    opened = _opened.get(path)
    if opened is None:
        try:
            # `path` is real (no link in it): a link there now was swapped in since, by a process
            # of the session's (the rule would grant where it leads, ~/.ssh as well)
            target = open_no_links(path, O_PATH)
        except OSError:
            # missing (a device this machine lacks), or that link: nothing to grant
            return
        opened = (target, stat.S_ISDIR(os.fstat(target).st_mode))
    try:
        mask = _mask(rights, abi, opened[1])
        if mask:
            # struct landlock_path_beneath_attr, packed: allowed_access, parent_fd
            rule = ctypes.create_string_buffer(struct.pack("=Qi", mask, opened[0]))
            _syscall(SYS_ADD_RULE, fd, RULE_PATH_BENEATH, ctypes.byref(rule), 0,
                     what=f"landlock_add_rule({path}): ")
    finally:
        # the project's entries are opened afresh: they come and go during a session
        if within(path, fresh):
            os.close(opened[0])
        else:
            _hold(path, opened)


def _hold(path: str, opened: tuple[int, bool]) -> None:
    """Keep a path's descriptor for the next ruleset; past OPENED_CAP (one process serving many
    homes and projects, as the tests do) the held ones are let go first."""
    if path not in _opened and len(_opened) >= OPENED_CAP:
        for fd, _ in _opened.values():
            os.close(fd)
        _opened.clear()
    _opened[path] = opened


# ------------------------------------------------------- mounts: the rest of the machine read-only
# Landlock has no right for a file's mode, owner, times or extended attributes. A read-only command
# has those system calls refused (METADATA_SYSCALLS); an approved one needs them in the project
# (chmod +x, tar, cp -p), so it gets a mount namespace of its own in which every mount is read-only
# but the places it may write, each bound over itself: `chmod 777 ~/.ssh` fails there with EROFS.
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWIPC = 0x08000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
SYS_MOUNT_SETATTR = 442    # one number on every machine (the unified table)
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 1
# a cover's mount: read-only, no set-uid, no device, no program (as MS_* flags and MOUNT_ATTR_*)
SEALED = 0xF
# no set-uid, no program: MS_NOSUID | MS_NOEXEC
NO_PROGRAMS = 0xA


@dataclass(frozen=True)
class Mounts:
    """An approved command's mount namespace: where it may write (what its ruleset lets it write
    beneath), the folder it sees as /dev/shm (one of the session temp dir's), and the real paths
    it cannot open (_cover): what the user's rules deny reading, its folders keeping every right;
    and the real paths it cannot change (_freeze): what their rules deny writing."""
    writable: tuple[str, ...]
    shared_memory: str = ""
    covered: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()
    # what a covered file shows: an empty file of mode 0 (cover_file); /dev/null without it
    cover: str = ""
    # (real path, the file it shows instead): .git/config without its credentials
    replaced: tuple[tuple[str, str], ...] = ()


def cover_file(khaelor_home: Path) -> str:
    """The file a secret file is covered with: regular, so `test -f .env` answers as it would
    outside, and of mode 0, so no open passes it without a capability ("" if it cannot be made)."""
    path = os.path.join(os.path.realpath(khaelor_home), "cover")
    try:
        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0))
    except FileExistsError:
        pass
    except OSError:
        return ""
    return path


def mounts_for(confine: Confine, project: Path, temp_dir: Path | None, denied: list[str] = (),
               frozen: list[str] = (), cover: str = "", replaced: tuple = ()) -> Mounts | None:
    """None: a read-only command needs none (unless to show a copy), or the kernel gives none."""
    if not (confine.write or confine.paths_write or replaced) or not mount_namespace_available():
        return None
    shared_memory = ""
    if confine.write and temp_dir:
        shared_memory = shared_memory_folder(temp_dir)
    mounts = _mount_points() if confine.write and (denied or frozen) else []
    covered = _places(denied, [], mounts)
    # (a file both denied reading and writing is covered: it cannot be opened at all)
    frozen = _places(frozen, covered, mounts)
    # the temp dir's bind makes its shm folder writable; binding it by name would follow a link
    writable = [place for place in _writes(confine, project, temp_dir) if place != shared_memory]
    return Mounts(tuple(writable), shared_memory, tuple(covered), tuple(frozen), cover,
                  tuple(replaced))


def _places(paths: list[str], covered: list[str], mounts: list[tuple]) -> list[str]:
    """Where each of `paths` shows, outermost only: a link is judged where it leads, what a folder
    holds goes with it."""
    tops = []
    # each path's folders looked up in a set: compared with every top before it, 20,000 frozen
    # files took 70 s before each approved command
    outer = {place.rstrip("/") or "/" for place in covered}
    for path in sorted(paths) if mounts else ():
        if not (_in_or_under(path, outer) or os.path.islink(path)):
            tops.append(path)
            outer.add(path)
    return [place for path in tops for place in _shown_at(path, mounts)]


def _in_or_under(path: str, places: set[str]) -> bool:
    """within(path, places) for a set of places."""
    while path not in places:
        if path == os.path.dirname(path):
            return False
        path = os.path.dirname(path)
    return True


def _shown_at(path: str, mounts: list[tuple]) -> list[str]:
    """Where the file at `path` (real) shows: there, at its place in every other mount of its file
    system that holds it (the project bound at a second place, a btrfs pool's top mounted), and
    for a folder, wherever a folder inside it is mounted too."""
    # the mount it is reached through: the last one on the longest mount point above it
    mount = max(reversed([m for m in mounts if within(path, [m[0]])]), key=lambda m: len(m[0]))
    inner = os.path.join(mount[3], os.path.relpath(path, mount[0]))
    places = []
    for other in [other for other in mounts if other[2] == mount[2]]:
        if within(inner, [other[3]]):
            place = os.path.join(other[0], os.path.relpath(inner, other[3]))
            places.append(os.path.normpath(place))
        elif within(other[3], [inner]):
            places.append(other[0])
    return places


def enter_read_only_mounts(mounts: Mounts) -> None:
    """In the child, while it still has its capabilities: a mount namespace (and, for a user
    other than root, the user namespace that lets it make one, mapping only itself) where every
    mount is read-only but `mounts.writable`. Nothing propagates out (MS_PRIVATE); Landlock,
    entered next, forbids the command any mount or unmount of its own. What was read-only stays
    so (a project mounted read-only, a read-only volume in it): the namespace only takes away."""
    writable_mounts = [mount[0] for mount in _mount_points() if not mount[1]]
    writable = []
    for path in mounts.writable:
        with contextlib.suppress(OSError):
            if not os.statvfs(path).f_flag & os.ST_RDONLY:
                writable.append(path)
    uid = os.getuid()
    gid = os.getgid()
    # and an IPC namespace: other programs' System V shared memory, semaphores, queues stay theirs
    flags = CLONE_NEWNS | CLONE_NEWIPC if uid == 0 else CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUSER
    _syscall(SYSCALLS[os.uname().machine]["unshare"], flags, what="unshare: ")
    if uid != 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as file:
                file.write(text)
    if _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None):
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    _mount_attributes(b"/", set_=MOUNT_ATTR_RDONLY, flags=AT_RECURSIVE)
    for path in writable:
        if _libc.mount(path.encode(), path.encode(), None, MS_BIND | MS_REC, None) != 0:
            continue
        # its mounts that were writable, one by one (a user namespace may not clear the others);
        # one that cannot be cleared stays read-only: the command meets EROFS, explain() says why
        for point in [path] + [point for point in writable_mounts if within(point, [path])]:
            with contextlib.suppress(OSError):
                _mount_attributes(point.encode(), clear=MOUNT_ATTR_RDONLY)
    # other programs' shared memory (a browser's) stays theirs: it reads and writes its own
    if mounts.shared_memory:
        _bind_no_links(mounts.shared_memory, b"/dev/shm")
    # The folders on the way to a covered file, where it may write, each bound onto itself: a
    # mount point is neither renamed nor removed (EBUSY), so `mv conf elsewhere` cannot carry the
    # file out from under the user's rule for the next command to read. Before the covers: a bind
    # made after one would show the file bare beneath it.
    replaced = tuple(path for path, _ in mounts.replaced)
    for folder in _folders_holding(mounts.covered + mounts.frozen + replaced, mounts.writable):
        with contextlib.suppress(FileNotFoundError):
            _bind_no_links(folder)
    for path in mounts.covered:
        _cover(path, mounts.cover)
    for path, copy in mounts.replaced:
        _cover(path, copy, as_is=True)
    for path in mounts.frozen:
        _freeze(path)
    # No terminal of the user's is in its sight, open now or opened while it runs (a long one
    # would read the keys typed there): a command reaches the terminal only through khaelor, which
    # cleans what it shows. Its ptys are in a devpts of its own, where /dev/ptmx makes them (the
    # one at /dev/pts, also where it links to pts/ptmx), granted by _grant_own_ptys.
    if os.path.isdir("/dev/pts") and _libc.mount(b"devpts", b"/dev/pts", b"devpts", NO_PROGRAMS,
                                                  b"newinstance,mode=0600,ptmxmode=0666"):
        raise OSError(ctypes.get_errno(), "mount devpts")
    # the working directory was entered on the read-only mount beneath (a deleted one stays)
    with contextlib.suppress(OSError):
        os.chdir(os.getcwd())


def _grant_own_ptys(ruleset: int) -> None:
    """In the child: the rule that opens its own devpts. It goes into the ruleset the Workspace
    keeps, naming this child's devpts, which no other process can reach (no ptrace, no setns)."""
    fd = os.open("/dev/pts", O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    rule = ctypes.create_string_buffer(struct.pack("=Qi", _mask(DEVICE, probe()[0]), fd))
    _syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0,
             what="landlock_add_rule(/dev/pts): ")
    os.close(fd)


def _bind_no_links(folder: str, target: bytes | None = None) -> None:
    """Bind the very folder opened at `folder` through no link at `target` (None: onto itself): a
    command may have swapped the shm folder for a link (to ~) since the parent looked; then the
    open fails, and so does the command."""
    fd = open_no_links(folder, O_PATH | os.O_DIRECTORY)
    opened = f"/proc/self/fd/{fd}".encode()
    failed = _libc.mount(opened, target or opened, None, MS_BIND | MS_REC, None)
    os.close(fd)
    if failed and target is None:
        raise OSError(ctypes.get_errno(), f"mount --bind {folder}")


def _folders_holding(paths: tuple[str, ...], places: tuple[str, ...]) -> list[str]:
    """The folders on the way to each of `paths` inside `places` (not the places), outermost
    first."""
    folders = set()
    for path in paths:
        folder = os.path.dirname(path)
        while within(folder, list(places)) and folder not in places:
            folders.add(folder)
            folder = os.path.dirname(folder)
    return sorted(folders, key=len)


def _cover(path: str, cover: str = "", as_is: bool = False) -> None:
    """Cover `path` in this namespace: a file with `cover` (an empty file of mode 0, where it is
    one still: no open passes it, the command has no capability; `as_is`: whatever it holds) or
    /dev/null, on a mount where no device opens, a folder with an empty tmpfs no one enters (mode
    0), a mount point it can neither unmount (Landlock), rename nor remove (EBUSY). Opened through
    no link: one swapped in since the scan fails the command, never moves the cover; a file gone
    is not read."""
    try:
        fd = open_no_links(path, O_PATH)
    except FileNotFoundError:
        return
    # the mount lands on the very file opened, whatever its path is now
    target = f"/proc/self/fd/{fd}".encode()
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        failed = _libc.mount(b"tmpfs", target, b"tmpfs", SEALED, b"mode=0,size=4k")
    else:
        # a bind takes no flags: sealed once made (mount_setattr raises when it cannot seal it)
        source = f"/proc/self/fd/{open_no_links(cover, O_PATH)}".encode() if as_is else None
        failed = _libc.mount(source or _cover_source(cover), target, None, MS_BIND, None)
        if not failed:
            _mount_attributes(path.encode(), set_=SEALED)
    os.close(fd)
    if failed:
        raise OSError(ctypes.get_errno(), f"mount over {path}")


def _cover_source(cover: str) -> bytes:
    """`cover` opened through no link while it is an empty regular file of mode 0 with no other
    name (as a /proc/self/fd path, open until exec), else /dev/null."""
    try:
        fd = open_no_links(cover, O_PATH)
    except OSError:
        return b"/dev/null"
    info = os.fstat(fd)
    alone = stat.S_ISREG(info.st_mode) and info.st_nlink == 1
    if alone and not (info.st_size or info.st_mode & 0o7777):
        return f"/proc/self/fd/{fd}".encode()
    os.close(fd)
    return b"/dev/null"


def _freeze(path: str) -> None:
    """Make `path` read-only in this namespace: the file (or folder, with all it holds) bound onto
    itself, a mount point it can neither write, rename nor remove (EROFS, EBUSY). Opened through
    no link, as _cover's is."""
    try:
        fd = open_no_links(path, O_PATH)
    except FileNotFoundError:
        return
    opened = f"/proc/self/fd/{fd}".encode()
    failed = _libc.mount(opened, opened, None, MS_BIND | MS_REC, None)
    os.close(fd)
    if failed:
        raise OSError(ctypes.get_errno(), f"mount --bind {path}")
    _mount_attributes(path.encode(), set_=MOUNT_ATTR_RDONLY, flags=AT_RECURSIVE)


def _mount_attributes(path: bytes, set_: int = 0, clear: int = 0, flags: int = 0) -> None:
    # struct mount_attr: attr_set, attr_clr, propagation, userns_fd
    attr = (ctypes.c_uint64 * 4)(set_, clear, 0, 0)
    _syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path, flags, ctypes.byref(attr), ctypes.sizeof(attr),
             what="mount_setattr: ")


def _mount_points() -> list[tuple[str, bool, str, str]]:
    """(mount point, read-only, device, the folder of it mounted there) of each mount, from
    /proc/self/mountinfo (a space is \\040)."""
    points = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            point, root = (re.sub(r"\\([0-7]{3})", lambda code: chr(int(code[1], 8)), field)
                           for field in (fields[4], fields[3]))
            points.append((point, "ro" in fields[5].split(","), fields[2], root))
    return points


@functools.cache
def mount_namespace_available() -> bool:
    """Whether an approved command can get its read-only mounts here (not in a container that
    forbids namespaces, nor where AppArmor gives a new user namespace no capabilities): tried
    once, in a child that does nothing else."""
    if probe()[0] == 0:
        return False
    pid = os.fork()
    if pid == 0:
        code = 1
        with contextlib.suppress(BaseException):
            enter_read_only_mounts(Mounts(()))
            code = 0
        os._exit(code)
    return os.waitpid(pid, 0)[1] == 0


def child_hook(ruleset: int | None, program: tuple | None, limits: list, listener_to=None,
               mounts: Mounts | None = None):
    """The preexec_fn that confines a child: its `mounts` (an approved command's); no
    capabilities (a root child could otherwise read khaelor's /proc/PID/environ through Landlock),
    lower rlimits, no new privileges, the Landlock ruleset, then the seccomp filter; with
    `listener_to` (a socket) the filter's notification fd is sent there for the supervisor (see
    Supervisor). It runs after fork in a threaded process, so it calls only ctypes, the resource
    module and os with arguments built here. CPython calls it before close_fds, so the fds it
    needs are still open; close_fds closes them before exec. If it fails, Popen raises in the
    parent and the command does not run."""
    syscall = _libc.syscall
    prctl = _libc.prctl
    # every capability a 64-bit set can name (past the kernel's last one, the drop fails: EINVAL)
    drops = [_longs(PR_CAPBSET_DROP, cap, 0, 0, 0) for cap in range(64)]
    clear_ambient = _longs(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    # version, pid (0: this process); then twice effective, permitted, inheritable: all 0
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    no_capabilities = (ctypes.c_uint32 * 6)()
    no_new_privs = _longs(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    restrict = _longs(SYS_RESTRICT_SELF, ruleset or 0, 0)
    if program:
        steps = (_SockFilter * len(program))(*[_SockFilter(*step) for step in program])
        fprog = _SockFprog(len(program), steps)
        flags = SECCOMP_FILTER_FLAG_NEW_LISTENER if listener_to else 0
        install = _longs(SYSCALLS[os.uname().machine]["seccomp"], SECCOMP_SET_MODE_FILTER, flags,
                         ctypes.byref(fprog))

    def enter() -> None:
        if mounts:
            enter_read_only_mounts(mounts)
        if mounts and ruleset is not None:
            _grant_own_ptys(ruleset)
        for drop in drops:
            # EPERM without CAP_SETPCAP (not root): there is nothing to drop then
            prctl(*drop)
        prctl(*clear_ambient)
        if _libc.capset(ctypes.byref(header), no_capabilities):
            raise OSError("could not drop capabilities")
        for kind, value in limits:
            resource.setrlimit(kind, (value, value))
        if prctl(*no_new_privs):
            raise OSError("could not set no_new_privs")
        if ruleset is not None and syscall(*restrict):
            raise OSError("could not enter the Landlock sandbox")
        if program:
            listener = syscall(*install)
            if listener < 0:
                raise OSError("could not enter the seccomp filter")
            if listener_to:
                socket.send_fds(listener_to, [b"L"], [listener])
                os.close(listener)
    return enter


def become_subreaper() -> None:
    """Orphans among this process's descendants are handed to it, not to init (`khaelor sandbox`
    ends them with its command)."""
    _libc.prctl(*_longs(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))


def limits_for(confine: Confine) -> list[tuple[int, int]]:
    """(resource, value) a command runs under: a read-only command cannot fill the disk (one
    file, and the session temp dir, see tools) or the memory; none dumps core. RLIMIT_AS would
    break V8, Go and the JVM, which reserve far more address space than they use: RLIMIT_DATA
    counts what is really allocated. A limit is only ever lowered."""
    wanted = [(resource.RLIMIT_CORE, 0)]
    if not confine.write:
        wanted += [(resource.RLIMIT_FSIZE, READ_ONLY_FILE_CAP),
                   (resource.RLIMIT_CPU, READ_ONLY_CPU_S),
                   (resource.RLIMIT_DATA, READ_ONLY_MEMORY)]
    limits = []
    for kind, value in wanted:
        hard = resource.getrlimit(kind)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        limits.append((kind, value))
    return limits


# ------------------------------------------------------- seccomp: sockets, processes, terminal
# Landlock confines files, TCP ports and signals; seccomp-BPF covers what it cannot see: sockets of
# every other family (UDP, raw, packet, netlink), unix sockets (none, network or not: docker.sock
# or the session bus would start a process outside), TCP fast open, ptrace and process_vm_*,
# io_uring (which would run its own connect and open), namespaces, keyrings, bpf, perf, and the
# ioctls that type into a terminal. One filter, built in the parent, per kind of command.

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# name -> its number on (x86_64, aarch64): asm/unistd_64.h; asm-generic/unistd.h
SYSCALL_NUMBERS = {
    "socket": (41, 198), "connect": (42, 203), "sendto": (44, 206), "sendmsg": (46, 211),
    "sendmmsg": (307, 269), "ioctl": (16, 29), "clone": (56, 220), "unshare": (272, 97),
    "clone3": (435, 435), "ptrace": (101, 117), "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271), "pidfd_getfd": (438, 438), "bpf": (321, 280),
    "perf_event_open": (298, 241), "keyctl": (250, 219), "add_key": (248, 217),
    "request_key": (249, 218), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "setns": (308, 268), "open_by_handle_at": (304, 265),
    "userfaultfd": (323, 282), "seccomp": (317, 277), "setsid": (112, 157), "setpgid": (109, 154),
    "socketpair": (53, 199), "prlimit64": (302, 261), "bind": (49, 200), "listen": (50, 201),
    "open": (2, None), "openat": (257, 56), "openat2": (437, 437), "creat": (85, None),
    "mknod": (133, None), "mknodat": (259, 33),
}
# Refused where nothing but the temp dir is writable (why: the mounts above; None: aarch64 has only
# the *at forms), and System V IPC, whose objects no path names (Landlock and mounts miss them): a
# read-only command would read and write another program's shared memory, semaphores and queues.
METADATA_SYSCALLS = {
    "chmod": (90, None), "fchmod": (91, 52), "fchmodat": (268, 53), "fchmodat2": (452, 452),
    "chown": (92, None), "fchown": (93, 55), "lchown": (94, None), "fchownat": (260, 54),
    "utime": (132, None), "utimes": (235, None), "futimesat": (261, None),
    "utimensat": (280, 88), "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7),
    "removexattr": (197, 14), "lremovexattr": (198, 15), "fremovexattr": (199, 16),
    "setxattrat": (463, 463), "removexattrat": (466, 466),
}
IPC_SYSCALLS = {
    "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195), "semget": (64, 190),
    "semop": (65, 193), "semtimedop": (220, 192), "semctl": (66, 191), "msgget": (68, 186),
    "msgsnd": (69, 189), "msgrcv": (70, 188), "msgctl": (71, 187),
}
SYSCALL_NUMBERS.update(METADATA_SYSCALLS, **IPC_SYSCALLS)
SYSCALLS = {machine: {name: pair[column] for name, pair in SYSCALL_NUMBERS.items()
                      if pair[column] is not None}
            for column, machine in enumerate(["x86_64", "aarch64"])}
# Refused for every confined command: each reaches another process, the kernel or the network
# behind the other rules' backs.
DENIED_SYSCALLS = [
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "bpf", "perf_event_open",
    "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "setns", "open_by_handle_at", "userfaultfd",
]
# clone and unshare flags that make a namespace: mount, IPC, user; cgroup, UTS, PID, network
NAMESPACE_FLAGS = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUSER | 0x02000000 | 0x04000000 \
    | 0x20000000 | 0x40000000
TERMINAL_INJECTION = [0x5412, 0x541C]    # TIOCSTI, TIOCLINUX
# TIOCSCTTY: after a setsid that only pretended, taking a pty as the controlling terminal fails
# (EPERM), and with it pty.fork() and forkpty(); so it pretends too (the child has no controlling
# terminal, and reads and writes its pty as before)
TAKE_TERMINAL = 0x540E
# S_ISUID | S_ISGID, and which argument of each call that sets or creates a mode holds it (an open
# only when its flags, the argument before, create: O_CREAT | O_TMPFILE; else the mode is junk)
SET_ID_BITS = 0o6000
MODE_ARGUMENT = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "creat": 1, "mknod": 1,
                 "mknodat": 2}
CREATE_FLAGS_ARGUMENT = {"open": 1, "openat": 2}
CREATES = 0o100 | 0o20000000
MSG_FASTOPEN = 0x20000000
X32_SYSCALL_BIT = 0x40000000
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
RET_ALLOW = 0x7FFF0000
RET_USER_NOTIF = 0x7FC00000
RET_ERRNO = 0x00050000
# classic BPF opcodes
LD_ABS = 0x20
JEQ = 0x15
JSET = 0x45
JGE = 0x35
RET = 0x06
AND = 0x54
# offsets into struct seccomp_data: nr, arch, then 64-bit args from 16 (the low half first)
NR = 0
ARCH = 4


def _arg(index: int) -> int:
    return 16 + 8 * index


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _assemble(program: list[tuple]) -> list[tuple[int, int, int, int]]:
    """Classic BPF from a list of ("label", name) markers and (code, k, jump-if-true label) steps;
    a false test falls through. Jumps only go forward and at most 255 steps, as BPF requires."""
    where = {}
    steps = []
    for item in program:
        if item[0] == "label":
            where[item[1]] = len(steps)
        else:
            steps.append(item)
    jumps = [where[target[0]] - index - 1 if target else 0
             for index, (_, _, *target) in enumerate(steps)]
    if not all(0 <= jump < 256 for jump in jumps):
        raise ValueError("a seccomp jump goes back or past 255 steps (its field is one byte)")
    return [(op, jump, 0, k) for jump, (op, k, *_) in zip(jumps, steps)]


@functools.cache
def seccomp_available() -> bool:
    """Whether this kernel filters system calls for a machine whose numbers are listed here (asked
    for every command, read once)."""
    if os.uname().machine not in SYSCALLS:
        return False
    with contextlib.suppress(OSError):
        return "Seccomp:" in Path("/proc/self/status").read_text()
    return False


def filter_for(confine: Confine, supervised: bool) -> tuple[tuple[int, int, int, int], ...] | None:
    """The seccomp program for a command confined as `confine`: a read-only one opens no socket
    (socketpair and pipes only); an approved one opens TCP stream sockets, to serve and to reach,
    through the supervisor (`supervised`), only the session's own servers on loopback (without
    one, no connect at all); one approved for the network opens any socket but a unix one. None of
    them makes a datagram socket pair: its ends can still send to any unix socket by name."""
    if not seccomp_available():
        return None
    metadata = confine.write or confine.paths_write
    return _filter(confine.write, confine.network, supervised, metadata)


@functools.cache
def _filter(write: bool, network: bool, supervised: bool,
            metadata: bool) -> tuple[tuple[int, int, int, int], ...]:
    """filter_for's program, a pure function of four facts (metadata: whether the command may
    change modes, owners, times and attributes): each shape is built once."""
    machine = os.uname().machine
    nr = SYSCALLS[machine]
    # an approved command without the network: TCP stream sockets only
    tcp = write and not network
    deny = (RET, RET_ERRNO | errno.EPERM)
    refuse = (RET, RET_ERRNO | errno.EACCES)
    allow = (RET, RET_ALLOW)
    program = [(LD_ABS, ARCH), (JEQ, AUDIT_ARCH[machine], "native"), deny, ("label", "native"),
               (LD_ABS, NR)]
    if machine == "x86_64":
        program += [(JGE, X32_SYSCALL_BIT, "deny")]
    program += [(JEQ, nr[name], "deny") for name in DENIED_SYSCALLS]
    if not metadata:
        program += [(JEQ, nr[name], "deny") for name in [*METADATA_SYSCALLS, *IPC_SYSCALLS]
                    if name in nr]
    # No set-user-ID or set-group-ID bit: a copy of sh made so in the project would run as its
    # owner (root, or the user) for any local user: not by chmod, nor by creating it so (aarch64
    # has no chmod, open, creat or mknod)
    program += [(JEQ, nr[name], f"mode {index}") for name, index in MODE_ARGUMENT.items()
                if name in nr]
    program += [(JEQ, nr[name], f"creates {index}") for name, index in CREATE_FLAGS_ARGUMENT.items()
                if name in nr]
    # glibc falls back to clone when clone3 is missing, openat2's mode and clone3's flags are out of
    # a filter's reach (glibc's open never uses openat2)
    program += [(JEQ, nr["clone3"], "enosys"), (JEQ, nr["openat2"], "enosys"),
                (JEQ, nr["ioctl"], "ioctl"),
                (JEQ, nr["clone"], "clone"), (JEQ, nr["unshare"], "clone")]
    # a new session or process group would outlive the kill of the command's group at its end
    # (and, writing the project after the guard looked, plant a hook): both answer success and
    # change nothing, so that a daemon starts as it expects and still ends with the command
    program += [(JEQ, nr["setsid"], "pretend"), (JEQ, nr["setpgid"], "pretend")]
    program += [(JEQ, nr["socket"], "socket"), (JEQ, nr["socketpair"], "pair")]
    # prlimit also sets another process's limits (khaelor's own RLIMIT_FSIZE at 0 would stop it)
    program += [(JEQ, nr["prlimit64"], "prlimit")]
    if not network:
        program += [(JEQ, nr["sendto"], "flags3"), (JEQ, nr["sendmmsg"], "flags3"),
                    (JEQ, nr["sendmsg"], "flags2"), (JEQ, nr["connect"], "connect"),
                    # a server's too: the supervisor keeps it to the loopback device
                    (JEQ, nr["bind"], "connect"), (JEQ, nr["listen"], "connect")]
    program += [allow,
                ("label", "ioctl"), (LD_ABS, _arg(1))]
    program += [(JEQ, request, "deny") for request in TERMINAL_INJECTION]
    program += [(JEQ, TAKE_TERMINAL, "pretend")]
    program += [allow,
                ("label", "clone"), (LD_ABS, _arg(0)), (JSET, NAMESPACE_FLAGS, "deny"), allow,
                ("label", "prlimit"), (LD_ABS, _arg(0)), (JEQ, 0, "allow"), deny,
                ("label", "creates 1"), (LD_ABS, _arg(1)), (JSET, CREATES, "mode 2"), allow,
                ("label", "creates 2"), (LD_ABS, _arg(2)), (JSET, CREATES, "mode 3"), allow,
                ("label", "mode 1"), (LD_ABS, _arg(1)), (JSET, SET_ID_BITS, "deny"), allow,
                ("label", "mode 2"), (LD_ABS, _arg(2)), (JSET, SET_ID_BITS, "deny"), allow,
                ("label", "mode 3"), (LD_ABS, _arg(3)), (JSET, SET_ID_BITS, "deny"), allow,
                ("label", "pair"), (LD_ABS, _arg(0)), (JEQ, AF_UNIX, "unix pair"), refuse,
                ("label", "unix pair"), (LD_ABS, _arg(1)), (AND, 0xF), (JEQ, SOCK_STREAM, "allow"),
                (JEQ, SOCK_SEQPACKET, "allow"), refuse,
                ("label", "socket")]
    if network:
        program += [(LD_ABS, _arg(0)), (JEQ, AF_UNIX, "refuse"), allow]
    elif tcp:
        program += [(LD_ABS, _arg(0)), (JEQ, AF_INET, "inet"), (JEQ, AF_INET6, "inet"), refuse,
                    ("label", "inet"), (LD_ABS, _arg(1)), (AND, 0xF), (JEQ, SOCK_STREAM, "stream"),
                    refuse,
                    ("label", "stream"), (LD_ABS, _arg(2)), (JEQ, 0, "allow"),
                    (JEQ, IPPROTO_TCP, "allow")]
    program += [refuse,
                ("label", "flags3"), (LD_ABS, _arg(3)), (JSET, MSG_FASTOPEN, "refuse"), allow,
                ("label", "flags2"), (LD_ABS, _arg(2)), (JSET, MSG_FASTOPEN, "refuse"), allow,
                ("label", "connect"),
                (RET, RET_USER_NOTIF) if tcp and supervised else refuse,
                ("label", "enosys"), (RET, RET_ERRNO | errno.ENOSYS),
                ("label", "pretend"), (RET, RET_ERRNO | 0),
                ("label", "refuse"), refuse,
                ("label", "allow"), allow,
                ("label", "deny"), deny]
    return tuple(_assemble(program))


class Entry:
    """What one child needs to enter its sandbox, built in the parent; close() once it has started.
    The ruleset fd is the entry's own (a copy of the one the Workspace keeps for reuse)."""

    def __init__(self, ruleset: int | None, program: tuple | None, limits: list,
                 supervisor: "Supervisor | None" = None, mounts: Mounts | None = None):
        self.ruleset = ruleset
        self.supervisor = supervisor
        listener_to = supervisor.theirs if supervisor else None
        self.hook = child_hook(ruleset, program, limits, listener_to, mounts)

    def started(self) -> None:
        """The child has exec'd: its supervisor starts."""
        if self.supervisor:
            self.supervisor.start()
            self.supervisor = None

    def close(self) -> None:
        """Once the child started, or failed to: nothing of this is needed by the parent."""
        if self.ruleset is not None:
            os.close(self.ruleset)
            self.ruleset = None
        if self.supervisor:
            # never started: the child did not run
            self.supervisor.theirs.close()
            self.supervisor.ours.close()


def layers() -> list[tuple[str, bool, str]]:
    """(layer, enforced here, what it holds), for `khaelor permissions` and `khaelor sandbox`."""
    abi = probe()[0]
    seccomp = seccomp_available()
    return [
        ("landlock", abi > 0,
         f"files: reads from an allow-list, writes where approved ({status()})"),
        ("landlock-net", abi >= 4, "TCP connect only with network approval"),
        ("landlock-scope", abi >= 6, "signals and abstract unix sockets stay inside the command"),
        ("seccomp", seccomp, "no unix socket but a stream socket pair; "
                             "no UDP, raw, packet or netlink socket without network; "
                             "no ptrace, io_uring, namespaces, bpf, keyrings, TIOCSTI; "
                             "no chmod, chown, utime or xattr from a read-only command; "
                             "no set-user-ID or set-group-ID bit from any; "
                             "setsid and setpgid leave a command in its group"),
        ("mount-namespace", mount_namespace_available(),
         "an approved command sees the rest read-only (no chmod, chown or utime outside), "
         "no terminal but the ptys it makes (a devpts of its own), a /dev/shm of the session's; "
         "what your rules deny writing and the project's permission files read-only"),
        ("capabilities", True, "every capability dropped, also for root"),
        ("rlimits", True, "a read-only command: file size, CPU, memory; the temp dir is watched"),
    ]

# ---------------------------------------------------------------- the connect supervisor
# Landlock's port rules cannot see an address, and seccomp cannot read connect()'s argument: a port
# open to the session's dev server would be open on every host. So an approved command's connect()
# stops in the kernel (seccomp user notification) and khaelor decides it from outside the sandbox.

NOTIF_RECV = 0xC0502100
NOTIF_SEND = 0xC0182101
NOTIF_ID_VALID = 0x40082102
LOOPBACK_V6 = bytes(15) + b"\x01"
V4_MAPPED = bytes(10) + b"\xff\xff"


class _Notif(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("nr", ctypes.c_int32), ("arch", ctypes.c_uint32), ("ip", ctypes.c_uint64),
                ("args", ctypes.c_uint64 * 6)]


def loopback_port(address: bytes) -> int | None:
    """The port of a sockaddr naming a loopback address (127/8, ::1, ::ffff:127.x), else None."""
    if len(address) < 8:
        return None
    family = int.from_bytes(address[:2], "little")
    port = int.from_bytes(address[2:4], "big")
    if family == AF_INET and address[4] == 127:
        return port
    if family == AF_INET6 and len(address) >= 24:
        host = address[8:24]
        if host == LOOPBACK_V6 or (host[:12] == V4_MAPPED and host[12] == 127):
            return port
    return None


class Supervisor:
    """Answers the connect(), bind() and listen() calls of one command's processes: a connect to a
    loopback port that `ports()` names (the session's own servers, asked at the moment of the call)
    or a bind is done by khaelor itself, on a duplicate of the command's socket and with the bytes
    it checked, so the command cannot change the address after the check; the rest gets EACCES."""

    def __init__(self, ports):
        self.ports = ports
        self.ours, self.theirs = socket.socketpair()

    def start(self) -> None:
        """After the child started: take the listener it sent and answer it in a thread."""
        self.theirs.close()
        self.ours.settimeout(5)
        try:
            _, fds, _, _ = socket.recv_fds(self.ours, 1, 1)
        finally:
            self.ours.close()
        if fds:
            threading.Thread(target=self._serve, args=(fds[0],), daemon=True,
                             name="khaelor connect supervisor").start()

    def _serve(self, listener: int) -> None:
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        try:
            while True:
                events = poller.poll()
                if any(mask & (select.POLLHUP | select.POLLERR) for _, mask in events):
                    return
                notif = _Notif()
                if _libc.ioctl(listener, ctypes.c_ulong(NOTIF_RECV), ctypes.byref(notif)):
                    continue
                error = self._decide(listener, notif)
                # struct seccomp_notif_resp: id, val, error, flags
                answer = ctypes.create_string_buffer(struct.pack("=QqiI", notif.id, 0, -error, 0))
                _libc.ioctl(listener, ctypes.c_ulong(NOTIF_SEND), ctypes.byref(answer))
        finally:
            os.close(listener)

    def _decide(self, listener: int, notif: _Notif) -> int:
        """0 once connected, bound or listening, or the errno the command's call returns."""
        # connect(sockfd, address pointer, length), bind alike; listen(sockfd, backlog)
        calls = SYSCALLS[os.uname().machine]
        address = b""
        try:
            if notif.nr != calls["listen"]:
                with open(f"/proc/{notif.pid}/mem", "rb", buffering=0) as memory:
                    memory.seek(notif.args[1])
                    address = memory.read(min(notif.args[2], 128))
        except (OSError, ValueError, OverflowError):
            return errno.EACCES
        # the pid may have died and been reused while we read
        valid = ctypes.c_uint64(notif.id)
        if _libc.ioctl(listener, ctypes.c_ulong(NOTIF_ID_VALID), ctypes.byref(valid)):
            return errno.EACCES
        port = loopback_port(address)
        if notif.nr == calls["connect"] and (port is None or port not in self.ports()):
            return errno.EACCES
        # khaelor may be root: a port below 1024 is not the command's to bind
        if notif.nr == calls["bind"] and 0 < int.from_bytes(address[2:4], "big") < 1024:
            return errno.EACCES
        try:
            with self._duplicate(notif.pid, notif.args[0]) as ours:
                if ours.family not in (AF_INET, AF_INET6):
                    return errno.EACCES
                # a server takes connections from this machine only, however it binds (0.0.0.0,
                # ::, a listen() before any bind): its socket is bound to the loopback device,
                # which the command cannot undo (that takes CAP_NET_RAW)
                device = ours.getsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, 16)
                if notif.nr != calls["connect"] and device.rstrip(b"\0") != b"lo":
                    ours.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
                call = {calls["connect"]: _libc.connect, calls["bind"]: _libc.bind}.get(notif.nr)
                if call and call(ours.fileno(), address, len(address)):
                    raise OSError(ctypes.get_errno(), "")
                if notif.nr == calls["listen"]:
                    ours.listen(min(notif.args[1], 4096))
        except OSError as error:
            return error.errno or errno.EACCES
        return 0

    def _duplicate(self, pid: int, sockfd: int) -> socket.socket:
        pidfd = os.pidfd_open(pid)
        try:
            duplicate = _syscall(SYSCALLS[os.uname().machine]["pidfd_getfd"], pidfd, sockfd, 0)
        finally:
            os.close(pidfd)
        try:
            return socket.socket(fileno=duplicate)
        except OSError:
            os.close(duplicate)
            raise
# ---------------------------------------------------------------- opening through no link
# khaelor's own file tools run outside the sandbox: they judge a real path (realpath leaves no link
# in it), then open that very path here, so a link swapped into it in between (by a background
# process) fails the open with ELOOP instead of redirecting it to ~/.ssh/id_rsa or out of the
# project.

# openat2(2), Linux 5.6: one number on the MACHINES, as the Landlock calls.
SYS_OPENAT2 = 437
# linux/openat2.h: refuse every symbolic link on the way, /proc's magic links too.
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
AT_FDCWD = -100
# Crossing a folder needs only its search permission, as a plain open would (macOS has no O_PATH).
O_PATH = getattr(os, "O_PATH", os.O_RDONLY)


# False once the kernel answered ENOSYS (before 5.6, or a seccomp filter that hides openat2).
_openat2_works = True


def open_no_links(path: str, flags: int, mode: int = 0, dir_fd: int = AT_FDCWD) -> int:
    """A descriptor (O_CLOEXEC) for `path`, relative to dir_fd or absolute, opened without following
    any symbolic link in it: OSError ELOOP when one is there now. A relative path stays beneath
    dir_fd (EXDEV for "..")."""
    global _openat2_works
    flags |= os.O_CLOEXEC
    resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
    if dir_fd != AT_FDCWD:
        resolve |= RESOLVE_BENEATH
    probe()
    if _openat2_works and _libc is not None:
        # flags, mode (openat2 refuses one without O_CREAT), resolve
        how = (ctypes.c_uint64 * 3)(flags, mode if flags & os.O_CREAT else 0, resolve)
        # directly, not through _syscall: every file tool's open comes here (the helper adds 20%)
        fd = _libc.syscall(
            ctypes.c_long(SYS_OPENAT2), ctypes.c_long(dir_fd),
            ctypes.c_char_p(os.fsencode(path)), ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        error = ctypes.get_errno()
        if error != errno.ENOSYS:
            raise OSError(error, os.strerror(error), path)
        _openat2_works = False
    return walk_open(path, flags, mode, dir_fd)


def walk_open(path: str, flags: int, mode: int = 0, dir_fd: int = AT_FDCWD) -> int:
    """open_no_links where openat2 is missing: one component at a time from "/" (or dir_fd), each
    opened with O_NOFOLLOW from its parent's descriptor."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), path)
    start = "/" if path.startswith("/") else "."
    fd = os.open(start, O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        for part in parts[:-1]:
            step = _open_step(part, O_PATH | os.O_DIRECTORY, 0, fd)
            os.close(fd)
            fd = step
        return _open_step(parts[-1] if parts else ".", flags | os.O_CLOEXEC, mode, fd)
    finally:
        os.close(fd)


def _open_step(name: str, flags: int, mode: int, dir_fd: int) -> int:
    try:
        return os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    except NotADirectoryError:
        # O_DIRECTORY meets a link as "not a directory": say it was a link, as openat2 does
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise

# ------------------------------------------------------- ports of the session's own servers


def listening_ports(pgids: set[int]) -> set[int]:
    """TCP ports on which processes of these process groups listen, and no other: their socket
    inodes from /proc/<pid>/fd, matched with the LISTEN (0A) rows of /proc/net/tcp and tcp6."""
    inodes = set()
    for pid in pids_in_groups(pgids):
        with contextlib.suppress(OSError):
            fds = os.listdir(f"/proc/{pid}/fd")
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds]
            # "socket:[<inode>]"
            inodes.update(link[8:-1] for link in links if link.startswith("socket:["))
    ports = set()
    foreign = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
                fields = row.split()
                if len(fields) > 9 and fields[3] == "0A":
                    # local_address is <address>:<port>, in hex
                    port = int(fields[1].rsplit(":", 1)[1], 16)
                    (ports if fields[9] in inodes else foreign).add(port)
    # a session server on 127.0.0.2:P (or [::1]:P) must not open 127.0.0.1:P, another program's
    return ports - foreign


def pids_in_groups(pgids: set[int]) -> list[int]:
    """Live processes (zombies left out: they hold nothing) of these process groups, from /proc."""
    if not pgids:
        return []
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = proc_stat(int(entry.name))
        if fields and int(fields[2]) in pgids and fields[0] != b"Z":
            pids.append(int(entry.name))
    return pids


def proc_stat(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields after the command's name (state, ppid, pgrp, …), or none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []

# ---------------------------------------------------------------- the child's environment

# A command's environment is built from these names only, plus those the user's own config passes
# (`pass_env`): a silent `env` shows nothing secret (no API key, no AWS_*, *_TOKEN, *_SECRET).
ENV_NAMES = {
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "COLORTERM",
    "NO_COLOR", "FORCE_COLOR", "CI", "COLUMNS", "LINES", "PWD",
    "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYENV_ROOT", "PYENV_VERSION",
    "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONIOENCODING",
    "JAVA_HOME", "GOPATH", "GOROOT", "GOCACHE", "GOMODCACHE", "CARGO_HOME", "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN", "NVM_DIR", "NVM_BIN", "NODE_PATH", "GEM_HOME", "GEM_PATH", "RBENV_ROOT",
    "PKG_CONFIG_PATH", "LD_LIBRARY_PATH", "CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS",
    "MAKEFLAGS", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
}
ENV_PREFIXES = ("LC_",)
# the search paths a program's name or library is looked up in
SEARCH_PATHS = ("PATH", "LD_LIBRARY_PATH")
# Only a command approved for the network needs its proxies. (Not SSH_AUTH_SOCK: no command opens a
# unix socket, and ~/.ssh is closed.)
NETWORK_ENV_NAMES = {
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
}


def child_environment(environ: dict, passed: list[str], network: bool, home: str) -> dict:
    """The allow-listed part of `environ`, and what the user's config passes (fnmatch patterns).
    HOME is pinned (a repository cannot point git or the shell at its own start-up files); PATH
    and LD_LIBRARY_PATH keep only absolute entries (with "." or "bin" on PATH, `cat` would run the
    repository's; with an empty entry of LD_LIBRARY_PATH, a trailing ":", `ls` its libselinux)."""
    names = ENV_NAMES | NETWORK_ENV_NAMES if network else ENV_NAMES
    env = {}
    for name, value in environ.items():
        wanted = name in names or name.startswith(ENV_PREFIXES)
        if wanted or any(fnmatch.fnmatchcase(name, pattern) for pattern in passed):
            env[name] = value
    env.setdefault("PATH", "")
    for name in SEARCH_PATHS:
        if name in env:
            entries = env[name].split(os.pathsep)
            env[name] = os.pathsep.join(entry for entry in entries if os.path.isabs(entry))
    env["HOME"] = home
    return env

# ---------------------------------------------------------------- git settings


def git_settings(read_only: bool, repository_keys: list[str]) -> list[tuple[str, str]]:
    """(key, value) pairs for GIT_CONFIG_*: the fixed ones; each external diff command the
    repository's own config defines; and for read-only commands its other drivers too, each
    replaced by something that runs nothing."""
    pairs = list(GIT_ALWAYS)
    if read_only:
        pairs += GIT_READ_ONLY
    for key in repository_keys:
        for pattern, value, always in GIT_DRIVERS:
            if (always or read_only) and re.fullmatch(pattern, key, re.I):
                pairs.append((key, value))
    return pairs


def git_env(environ: dict, pairs: list[tuple[str, str]]) -> dict:
    """The GIT_CONFIG_* variables for `pairs`, after any the environment already carries (later
    wins)."""
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
    r"Permission denied|Operation not permitted|Read-only file system|Device or resource busy"
    r"|\bEACCES\b|\bEPERM\b",
    re.I)
# Where such a line names its path: quoted ('x', "x", `x', ‘x’), or as "<path>: Permission denied".
DENIED_PATH = re.compile(
    r"""['"`‘]([^'"`’\n]+)['"`’]"""
    r"""|([^\s:'"]+): (?:Permission denied|Operation not permitted|Read-only|Device or)""",
    re.I)
CONNECTING = re.compile(
    r"connect|socket|urlopen|https?://|network|port \d+", re.I)
# docker's "dial unix /var/run/docker.sock", a socket path
UNIX_SOCKET = re.compile(r"\bunix\b|\.sock\b", re.I)
# curl does not say why; Landlock makes it fail at once
CURL_REFUSED = re.compile(r"Couldn't connect to server")


def explain(output: str, confine: Confine, cwd: Path, project: Path,
            temp_dir: Path | None, home: Path,
            khaelor_home: Path, asks_nobody: bool = False) -> str | None:
    """A note for the model when a confined command's failure looks like the sandbox refusing
    it: what it would need (a path, write access outside the project, network) and that the user
    can grant it (`asks_nobody`: -p without --yes, where no one answers a question)."""
    lines = [line for line in output.splitlines() if DENIED.search(line)]
    closed = closed_locations(home, khaelor_home, confine.paths)
    if lines and not confine.secrets and (confine.unattended or not confine.write):
        # the project's secret files, left out of a read-only command's ruleset (tools.prepare)
        closed += SecretScan().find(str(project), confine.hide, confine.hide_paths)
        if not confine.write:
            closed += home_credentials(str(home))
    granted = _grants(confine, project, temp_dir, home, khaelor_home)
    writable = [path for path, rights in granted if "WRITE_FILE" in rights]
    unopened = [os.path.realpath(path) for path in confine.paths if not approved_target(path)]
    needs = []
    for line in lines:
        for match in DENIED_PATH.finditer(line):
            named = match.group(1) or match.group(2)
            path = os.path.realpath(cwd / named)
            need = _need(path, closed, writable, unopened, project)
            if confine.write and _frozen(path, project, confine):
                need = f"write access to {path}, which only the user changes"
            if need:
                needs.append(need)
    # A refused connect names no path.
    local = ("; without it, only a server on this machine's loopback that khaelor's own "
             "processes listen on is reachable")
    if lines and not needs and UNIX_SOCKET.search(output):
        needs.append("a unix socket, which no confined command opens, approved or not (docker.sock "
                     "or the session bus would start processes outside); the user can run it "
                     "as their own `!` command")
    maybe_network = not needs and not confine.network
    if maybe_network and lines and CONNECTING.search(output):
        needs.append(f"network access{local}")
    elif maybe_network and CURL_REFUSED.search(output):
        needs.append("network access, unless the server it connects to "
                     f"is simply not running{local}")
    if not needs:
        return None
    wanted = "; ".join(dict.fromkeys(needs))
    way = ("or run a command that names that path or URL itself, "
           "so that the user's permission question covers it")
    if confine.unattended:
        way = "--yes opens nothing more: a person must approve it"
    elif asks_nobody:
        way = ("nobody answers a permission question in this run (khaelor -p): only the user's "
               "own rules (--allowedTools) let a command that names it run")
    if any(need.endswith("which only the user changes") for need in needs):
        way = "no command changes it, approved or not"
    return ("[khaelor sandbox: this command ran confined to what its "
            "permission allowed, and the sandbox refused it: "
            f"it would need {wanted}. "
            "The same command will fail the same way. "
            f"If the task needs this, ask the user: say so in your reply; {way}.]")


def _frozen(path: str, project: Path, confine: Confine) -> bool:
    """Whether `path` (or a folder above it) is one only the user changes (Confine.frozen_*)."""
    if not within(path, [str(project)]) or path == str(project):
        return False
    relative = os.path.relpath(path, project)
    if relative in confine.frozen_files:
        return True
    folders = [relative.rsplit("/", n)[0] for n in range(relative.count("/") + 1)]
    return any(secret_matcher((), confine.frozen_paths)(folder) for folder in folders)


def _need(path: str, closed: list[str], writable: list[str], unopened: list[str],
          project: Path) -> str | None:
    """What a refused path would have needed, or None when the sandbox allowed it (the failure
    is another)."""
    if within(path, closed):
        return f"access to {path} (a protected location)"
    if within(path, ["/dev"]):
        return None
    if path in unopened:
        return (f"{path} made by the user: it was approved, but it does not exist yet and its "
                "folder holds other files, and the sandbox opens an approved path only, never "
                "the folder around it")
    if not within(path, writable):
        where = ", outside the project"
        if within(path, [str(project)]):
            where = ""
        return f"write access to {path}{where}"
    return None
