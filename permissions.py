"""permissions.py: what a tool call may do, decided before it runs.

Owns: the capabilities a tool call needs (file.read, file.write.project,
filesystem.outsideProject, process.execute, git.modify, network.access), rules
{capability, pattern, action} evaluated last-match-wins, the hardline floor beneath the
rules, shell-word parsing of bash commands, "always" suggestions (the arity table) and the
config-dict edit that persists a grant.
Must not: import our other modules, write files, run commands. The only contact with the
world is reading it: os.path.realpath resolves symlinks, expanduser reads $HOME.

What a rule's pattern is matched against (fnmatch, case-sensitive; `*` also crosses `/`):
  file.read, file.write.project    the project-relative POSIX path after resolving `..` and
                                   symlinks: "src/app.py"
  filesystem.outsideProject        the absolute resolved path: "/etc/hosts" ("~" in a pattern
                                   is expanded)
  process.execute, git.modify,     one simple command's words after quote removal, joined by
  network.access                   single spaces: "git commit -m fix bug". A pattern ending in
                                   " *" also matches the bare command ("ls *" matches "ls").
A bash line is split into its simple commands (&&, ||, ;, |, &, newlines, $( ), backticks,
subshells, bash -c, eval, find -exec); every one is judged and the strictest answer wins
(deny > ask > allow). Each command needs exactly one of process.execute / git.modify /
network.access, plus file.read or filesystem.outsideProject for its path-like arguments and
file.write.project for its output redirections.

"Always" suggestions: a bash command gets the arity-table prefix plus " *" ("git push *");
destructive programs (rm, dd, curl, sudo, ...) and commands with options before the
subcommand get their exact text; a line with shell operators or redirections gets none.
A project write suggests the file's directory subtree ("src/api/*"; a root-level file
suggests itself); a secret read or anything outside the project suggests the exact path.
"""

import fnmatch
import glob
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

# ---------------------------------------------------------------- policy tables

CAPABILITIES = ("file.read", "file.write.project", "filesystem.outsideProject",
                "process.execute", "git.modify", "network.access")
ACTIONS = ("allow", "ask", "deny")
_STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}
_COMMAND_CAPABILITIES = ("process.execute", "git.modify", "network.access")
_RULE_KEYS = ("capability", "pattern", "action")

# Project files whose reading asks, then the harmless templates that share their names.
SECRET_PATTERNS = ("*.env", "*.env.*", "*.pem", "*.key", "*.p12", "*.pfx", "*id_rsa*",
                   "*id_dsa*", "*id_ecdsa*", "*id_ed25519*", "*.netrc", "*.pypirc")
SECRET_TEMPLATES = ("*.env.example", "*.env.sample", "*.env.template")

# Commands that only read. Their writing or executing forms are routed elsewhere: git's
# modifying subcommands are git.modify (so "git branch *" only ever sees listings), and
# READ_ONLY_EXCEPTIONS, evaluated after, ask again.
READ_ONLY_COMMANDS = (
    "ls", "cat", "head", "tail", "wc", "pwd", "echo", "printf", "cd", "which", "type",
    "whoami", "date", "stat", "du", "df", "tree", "grep", "egrep", "fgrep", "rg", "find",
    "sort", "cut", "tr", "diff", "cmp", "basename", "dirname", "realpath", "readlink", "true",
    "false", "test", "[", "[[", "nl", "jq", "uname", "id", "md5sum", "sha256sum", "shasum",
    "git status", "git diff", "git log", "git show", "git branch", "git tag", "git describe",
    "git rev-parse", "git ls-files", "git ls-tree", "git blame", "git shortlog", "git remote",
    "git stash", "git merge-base", "git show-ref", "git reflog", "git worktree", "git cat-file")
READ_ONLY_EXCEPTIONS = ("find *-exec*", "find *-ok*", "find *-delete*", "find *-fprint*",
                        "find *-fls*", "sort *-o*", "sort *--compress*", "tree *-o*", "rg *--pre*", "git *--output*")

# Programs whose "always" suggestion is the exact command: a wildcard over their arguments
# would grant far more than the user just saw (rm *, curl *, sudo *).
_EXACT_ONLY = frozenset((
    "rm", "rmdir", "dd", "chmod", "chown", "chgrp", "mv", "cp", "ln", "tee", "kill", "pkill",
    "killall", "shred", "truncate", "sudo", "doas", "su", "eval", "exec", "source", ".", "env",
    "xargs", "bash", "sh", "zsh", "dash", "fish", "ssh", "scp", "sftp", "rsync", "curl", "wget",
    "nc", "ncat", "telnet", "sed", "awk", "perl"))
# How many leading words name "the command" ("git push origin main" -> "git push *").
# Longest matching key wins; unknown programs have arity 1.
ARITY = {
    "git": 2, "git remote": 3, "git stash": 3, "git submodule": 3, "git worktree": 3,
    "npm": 2, "npm run": 3, "npm exec": 3, "npx": 2, "yarn": 2, "yarn run": 3, "pnpm": 2,
    "pnpm run": 3, "bun": 2, "bun run": 3, "bunx": 2, "deno": 2, "deno task": 3, "node": 2,
    "python": 2, "python -m": 3, "python3": 2, "python3 -m": 3, "python manage.py": 3,
    "python3 manage.py": 3, "pip": 2, "pip3": 2, "pipx": 2, "uv": 2, "uv run": 3, "uv pip": 3,
    "poetry": 2, "poetry run": 3, "ruby": 2, "bundle": 2, "bundle exec": 3, "rails": 2,
    "rake": 2, "cargo": 2, "rustup": 2, "go": 2, "go mod": 3, "make": 2, "just": 2, "ruff": 2,
    "docker": 2, "docker compose": 3, "docker-compose": 2, "kubectl": 2, "helm": 2,
    "terraform": 2, "gh": 3, "brew": 2, "apt": 2, "apt-get": 2, "mvn": 2, "gradle": 2,
    "./gradlew": 2, "dotnet": 2, "swift": 2, "pre-commit": 2, "systemctl": 2}

_GIT_NETWORK = frozenset(("fetch", "clone", "ls-remote"))
_GIT_MODIFY = frozenset((
    "add", "am", "apply", "checkout", "cherry-pick", "clean", "commit", "gc", "init", "merge",
    "mv", "pull", "push", "rebase", "reset", "restore", "revert", "rm", "switch", "update-ref",
    "update-index", "filter-branch", "replace", "bisect", "sparse-checkout", "prune", "lfs"))
_GIT_GLOBAL_WITH_VALUE = frozenset(("-C", "-c", "--git-dir", "--work-tree", "--namespace"))
_NETWORK_COMMANDS = frozenset(("curl", "wget", "ssh", "scp", "sftp", "nc", "ncat", "netcat",
                               "telnet", "ftp", "http", "https", "aria2c", "gh"))
# Package managers: the subcommands that download or publish.
_NETWORK_SUBCOMMANDS = {
    "pip": {"install", "download"}, "pip3": {"install", "download"},
    "pipx": {"install", "run", "upgrade"}, "uv": {"add", "sync", "pip", "tool", "lock"},
    "npm": {"install", "i", "ci", "add", "update", "publish"}, "pnpm": {"install", "i", "add",
    "update", "dlx"}, "yarn": {"install", "add", "upgrade", "dlx", ""}, "bun": {"install", "i",
    "add", "update", "x"}, "cargo": {"install", "add", "fetch", "update", "publish"},
    "go": {"get", "install"}, "gem": {"install", "update"}, "brew": {"install", "update",
    "upgrade", "tap"}, "apt": {"install", "update", "upgrade"}, "apt-get": {"install", "update",
    "upgrade"}, "docker": {"pull", "push", "login"}, "poetry": {"add", "install", "update"},
    "bundle": {"install", "update"}, "composer": {"install", "require", "update"}}

# Programs that run the rest of their words as a command; value: options taking a value.
_WRAPPERS = {
    "sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-T", "-U", "--user", "--group"},
    "doas": {"-u", "-C"}, "env": {"-u", "-C", "--unset", "--chdir"}, "command": set(),
    "builtin": set(), "exec": {"-a"}, "nohup": set(), "time": set(), "setsid": set(),
    "nice": {"-n", "--adjustment"}, "ionice": {"-c", "-n"}, "timeout": {"-s", "-k", "--signal",
    "--kill-after"}, "stdbuf": {"-i", "-o", "-e"}, "busybox": set(), "unbuffer": set(),
    "watch": {"-n", "-d"}, "xargs": {"-I", "-n", "-P", "-L", "-d", "-s", "-E", "-a"}}
_SHELLS = frozenset(("sh", "bash", "zsh", "dash", "ksh", "ash", "su"))
_KEYWORDS = frozenset(("if", "then", "else", "elif", "fi", "do", "done", "while", "until",
                       "!", "{", "}", "esac"))
_SKIPPED_STATEMENTS = frozenset(("for", "select", "case", "function"))
# First positional argument is a pattern or script, not a file.
_PATTERN_FIRST = frozenset(("grep", "egrep", "fgrep", "rg", "sed", "awk", "jq"))

# The floor's targets: deleting or chmod-ing these recursively is never what anyone wanted.
_PROTECTED_DIRS = frozenset((
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc",
    "/root", "/sbin", "/srv", "/sys", "/usr", "/var", "/Users", "/System", "/Library",
    "/Applications", "/private"))
_SAFE_DEVICES = frozenset(("/dev/null", "/dev/zero", "/dev/stdout", "/dev/stderr", "/dev/stdin",
                           "/dev/tty", "/dev/random", "/dev/urandom", "/dev/full"))

_OPERATORS = ("&&", "||", ";;", "|&", "&>>", "&>", ">>", ">|", ">&", "<<<", "<<-", "<<", "<&",
              "<>", ">", "<", "|", "&", ";", "(", ")", "\n")
_SEPARATORS = frozenset(("&&", "||", ";;", "|&", "|", "&", ";", "(", ")", "\n"))
_WRITE_REDIRECTS = frozenset((">", ">>", ">|", "&>", "&>>", "<>", ">&"))
_MAX_GLOB = 100          # paths a glob argument is checked against
_MAX_NESTING = 8          # bash -c "eval \"$(...)\"" ... deeper than this is refused as unparsable
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
_PARAMETER = re.compile(r"\$(?:\{([A-Za-z_]\w*|[0-9@*])\}|([A-Za-z_]\w*|[0-9@*]))")
_BRACES = re.compile(r"\{([^{}]*,[^{}]*)\}")
# NAME() { NAME | NAME & }: the name starts a word and is matched possessively (++), so a
# long command costs linear time, not quadratic backtracking.
_FORK_BOMBS = (re.compile(r"(?<![^\s;&|(){}])(?P<n>[^\s(){}|&;<>]++)\s*\(\s*\)\s*\{[^}]*?(?P=n)\s*\|\s*(?P=n)\s*&"),
               re.compile(r"\bfunction\s+(?P<n>[^\s(){}|&;<>]++)\s*(?:\(\s*\))?\s*\{[^}]*?"
                          r"(?P=n)\s*\|\s*(?P=n)\s*&"))


class PermissionConfigError(ValueError):
    """A config file's "permissions" list is malformed; the message names the file and entry."""


class _ParseError(ValueError):
    """A bash line this parser cannot follow; the line is then never allowed without asking."""


# ---------------------------------------------------------------- data types

@dataclass(frozen=True)
class Rule:
    capability: str   # a capability name, or an fnmatch pattern over them ("*", "file.*")
    pattern: str      # fnmatch pattern over the subject (see the module docstring)
    action: str       # "allow" | "ask" | "deny"
    source: str = "default"   # "default" or the config file the rule came from


@dataclass(frozen=True)
class Decision:
    action: str               # "allow" | "ask" | "deny"
    capability: str           # the capability that decided (the strictest one)
    descriptor: str           # what the user is asked about: the command or the path
    rule: Rule | None         # the rule that decided; None for the floor or when nothing matched
    floor: bool               # True when the hardline floor refused (no rule can override)
    suggestion: dict | None   # {"capability", "pattern"} an "always" would persist, or None
    reason: str = ""          # one line for the model/user: the rule, the floor item, or "no rule"


class _Request(NamedTuple):
    capability: str
    subject: str              # what patterns are matched against
    suggestion: str | None    # pattern an "always" grant would save for this request


class _Part(NamedTuple):
    words: tuple[str, ...]    # after quote removal and expansion: what rules match (joined)
    core: tuple[str, ...]     # assignments and wrappers (sudo, env ...) removed, program basename
    redirects: tuple[tuple[str, str], ...]   # (operator, expanded target)
    cwd: str                  # where it runs (follows `cd` earlier in the line)


# ---------------------------------------------------------------- public API

def default_rules() -> list[Rule]:
    """Reads allowed (secrets ask), read-only commands allowed, everything else asks."""
    table = [("file.read", "*", "allow"),
             *(("file.read", p, "ask") for p in SECRET_PATTERNS),
             *(("file.read", p, "allow") for p in SECRET_TEMPLATES),
             ("file.write.project", "*", "ask"),
             ("filesystem.outsideProject", "*", "ask"),
             ("process.execute", "*", "ask"),
             *(("process.execute", _escape(c) + " *", "allow") for c in READ_ONLY_COMMANDS),
             *(("process.execute", p, "ask") for p in READ_ONLY_EXCEPTIONS),
             ("git.modify", "*", "ask"),
             ("network.access", "*", "ask")]
    return [Rule(c, p, a, "default") for c, p, a in table]


def validate_config_rules(obj) -> str | None:
    """None when obj (a parsed config dict, or its "permissions" list) is well-formed;
    otherwise one message saying which entry is wrong and what a good one looks like."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        if "permissions" not in obj:
            return None
        obj = obj["permissions"]
    example = '{"capability": "process.execute", "pattern": "git push *", "action": "allow"}'
    if not isinstance(obj, list):
        return f'"permissions" must be a list of rules like {example}'
    for index, entry in enumerate(obj):
        where = f"permissions[{index}]"
        if not isinstance(entry, dict):
            return f"{where} must be an object like {example}"
        missing = [key for key in _RULE_KEYS if key not in entry]
        if missing:
            return f"{where} is missing {', '.join(missing)}; a rule looks like {example}"
        unknown = sorted(set(entry) - set(_RULE_KEYS))
        if unknown:
            return f"{where} has unknown key {', '.join(unknown)}; allowed: capability, pattern, action"
        bad = next((key for key in _RULE_KEYS if not isinstance(entry[key], str) or not entry[key]), None)
        if bad:
            return f"{where}.{bad} must be a non-empty string"
        if entry["action"] not in ACTIONS:
            return f'{where}.action "{entry["action"]}" is not one of allow, ask, deny'
        if not any(fnmatch.fnmatchcase(c, entry["capability"]) for c in CAPABILITIES):
            return (f'{where}.capability "{entry["capability"]}" names no capability; '
                    f"known: {', '.join(CAPABILITIES)}")
    return None


def load_rules(layers: list[tuple[str, dict]]) -> list[Rule]:
    """Defaults, then each (source, config) layer in order: pass user before project so the
    project's rules, evaluated later, win. Raises PermissionConfigError naming the file."""
    rules = default_rules()
    for source, config in layers:
        problem = validate_config_rules(config)
        if problem:
            raise PermissionConfigError(f"{source}: {problem}")
        for entry in (config or {}).get("permissions", []):
            rules.append(Rule(entry["capability"], entry["pattern"], entry["action"], source))
    return rules


def decide(tool_name: str, tool_input: dict, project_root: Path, rules: list[Rule]) -> Decision:
    """The floor first, then every capability the call needs; the strictest answer wins."""
    root = os.path.realpath(project_root)
    text = lambda key: _text(tool_input.get(key))  # noqa: E731 - tool input may hold non-strings
    if tool_name == "process" and text("action") != "start":
        # list/read/write/stop only touch processes that were approved when they started
        return Decision("allow", "process.execute", f"process {text('action')}", None, False, None)
    if tool_name in ("bash", "process"):
        return _decide_bash(text("command"), text("workdir"), root, rules)
    if tool_name in ("read", "write", "edit"):
        capability = "file.read" if tool_name == "read" else "file.write.project"
        descriptor, request = _path_request(text("file_path"), root, root, capability)
        return _judge(descriptor, [request], rules)
    if tool_name in ("grep", "glob"):
        where = text("path") or "."
        if tool_name == "glob":
            where = _glob_base(posixpath.join(where, text("pattern")))
        descriptor, request = _path_request(where, root, root, "file.read")
        return _judge(descriptor, [request], rules)
    return Decision("deny", "unknown", tool_name, None, False, None,
                    reason=f"unknown tool {tool_name!r}")


def check(kind: str, value: str, project_root: Path, rules: list[Rule]) -> dict:
    """What would happen, without doing anything: the `khaelor permissions check --json` object."""
    calls = {"bash": ("bash", {"command": value}), "read": ("read", {"file_path": value}),
             "write": ("write", {"file_path": value, "content": ""})}
    if kind not in calls:
        raise ValueError(f"check kind must be bash, read or write, not {kind!r}")
    decision = decide(*calls[kind], project_root, rules)
    rule = rule_text(decision.rule) if decision.rule else (decision.reason if decision.floor else None)
    return {"decision": decision.action, "capability": decision.capability, "rule": rule,
            "floor": decision.floor,
            "suggestion": decision.suggestion["pattern"] if decision.suggestion else None}


def describe_rules(rules: list[Rule]) -> list[str]:
    """One line per rule in evaluation order (the last matching line wins), with its source."""
    cap_width = max((len(r.capability) for r in rules), default=0)
    pattern_width = min(max((len(r.pattern) for r in rules), default=0), 40)
    return [f"{n:>3}  {r.action:<5}  {r.capability:<{cap_width}}  {r.pattern:<{pattern_width}}  {r.source}"
            for n, r in enumerate(rules, 1)]


def rule_text(rule: Rule) -> str:
    return f'{rule.action} {rule.capability} "{rule.pattern}" ({rule.source})'


def add_grant(config: dict, rule: dict) -> dict:
    """A copy of config with rule ({capability, pattern, action="allow"}) as its last
    permission, so it wins; an identical earlier entry is moved, never duplicated."""
    entry = {"capability": rule.get("capability"), "pattern": rule.get("pattern"),
             "action": rule.get("action", "allow")}
    problem = validate_config_rules([entry])
    if problem:
        raise ValueError(problem.replace("permissions[0]", "grant"))
    existing = config.get("permissions", [])
    if not isinstance(existing, list):
        raise PermissionConfigError(validate_config_rules(config))
    kept = [e for e in existing if not (isinstance(e, dict) and e == entry)]
    return {**config, "permissions": [*kept, entry]}


# ---------------------------------------------------------------- evaluation

def _judge(descriptor: str, requests: list[_Request], rules: list[Rule], *,
           floor: str | None = None, at_least: str = "allow") -> Decision:
    """Evaluate every request; the first strictest one names the decision."""
    if floor:
        return Decision("deny", "process.execute", descriptor, None, True, None,
                        reason=f"hardline floor: {floor}")
    if not requests:
        return Decision(at_least, "process.execute", descriptor, None, False, None)
    verdicts = []
    for request in requests:
        rule = _last_match(rules, request.capability, request.subject)
        verdicts.append((rule.action if rule else "ask", rule, request))
    action, rule, request = max(verdicts, key=lambda v: _STRICTNESS[v[0]])
    if _STRICTNESS[at_least] > _STRICTNESS[action]:
        action, rule = at_least, None
    asking = {(r.capability, _grant_pattern(r, rule)) for a, rule, r in verdicts if a == "ask"}
    suggestion = None
    if action == "ask" and len(asking) == 1:
        capability, pattern = asking.pop()
        suggestion = {"capability": capability, "pattern": pattern} if pattern else None
    reason = rule_text(rule) if rule else f"no rule allows {request.capability} {request.subject}"
    return Decision(action, request.capability, descriptor, rule, False, suggestion, reason)


def _grant_pattern(request: _Request, rule: Rule | None) -> str | None:
    """A specific ask rule ("find *-delete*") is there to catch this form: a wildcard grant
    would undo it for every later case, so the grant is for this exact subject."""
    if request.suggestion is None or rule is None or rule.pattern == "*":
        return request.suggestion
    return _escape(request.subject)


def _last_match(rules: list[Rule], capability: str, subject: str) -> Rule | None:
    for rule in reversed(rules):
        if fnmatch.fnmatchcase(capability, rule.capability) and _matches(rule.pattern, capability, subject):
            return rule
    return None


def _matches(pattern: str, capability: str, subject: str) -> bool:
    if capability == "filesystem.outsideProject" and pattern.startswith("~"):
        pattern = os.path.expanduser(pattern)
    if fnmatch.fnmatchcase(subject, pattern):
        return True
    return (capability in _COMMAND_CAPABILITIES and pattern.endswith(" *")
            and fnmatch.fnmatchcase(subject, pattern[:-2]))


# ---------------------------------------------------------------- paths

def _locate(path_text: str, base: str, root: str) -> tuple[bool, str]:
    """(inside the project?, subject): project-relative path inside, absolute path outside.
    realpath resolves `..` and symlinks, so a link pointing out of the project is outside."""
    if path_text.startswith("~"):
        path_text = os.path.expanduser(path_text)
    try:
        resolved = os.path.realpath(os.path.join(base, path_text))
    except (ValueError, OSError):   # embedded NUL and the like: treat as unknown, outside
        return False, path_text
    if resolved == root:
        return True, "."
    if resolved.startswith(root.rstrip(os.sep) + os.sep):
        return True, Path(resolved).relative_to(root).as_posix()
    return False, resolved


def _path_request(path_text: str, base: str, root: str, capability: str) -> tuple[str, _Request]:
    inside, subject = _locate(path_text, base, root)
    if not inside:
        return subject, _Request("filesystem.outsideProject", subject, _escape(subject))
    if capability == "file.write.project":
        directory = posixpath.dirname(subject)
        return subject, _Request(capability, subject,
                                 _escape(directory) + "/*" if directory else _escape(subject))
    return subject, _Request(capability, subject, _escape(subject))


def _glob_base(pattern: str) -> str:
    """The directory a glob starts from: its components before the first wildcard."""
    static = []
    for component in pattern.split("/"):
        if any(ch in component for ch in "*?[{"):
            break
        static.append(component)
    return "/".join(static) or ("/" if pattern.startswith("/") else ".")


def _escape(text: str) -> str:
    """fnmatch-quote text so a suggested pattern matches itself literally."""
    return re.sub(r"([*?[])", r"[\1]", text)


def _text(value) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


# ---------------------------------------------------------------- bash: judging a line

def _decide_bash(command: str, workdir: str, root: str, rules: list[Rule]) -> Decision:
    home = posixpath.normpath(os.path.expanduser("~"))
    descriptor = command.strip()
    requests = []
    cwd = root
    if workdir:
        inside, cwd = _locate(workdir, root, root)
        cwd = os.path.join(root, cwd) if inside else cwd
        if not inside:
            requests.append(_Request("filesystem.outsideProject", cwd, None))
    try:
        line = _ShellLine(command, cwd, home)
    except (_ParseError, RecursionError):
        # Bash would run the lines before a syntax error, so the floor still reads each line;
        # what cannot be parsed is never allowed without asking.
        naive = [_Part(tuple(w), tuple(_core(w)), (), cwd)
                 for w in (re.sub(r"[\"'\\]", "", ln).split() for ln in command.splitlines())]
        floor = _fork_bomb(command) or next(filter(None, (_floor_reason(p, home) for p in naive)), None)
        return _judge(descriptor, [_Request("process.execute", descriptor, None)], rules,
                      floor=floor, at_least="ask")
    for part in line.parts:
        suggestion = None if line.compound else _suggest(part.words)
        requests.append(_Request(_classify(part.core), " ".join(part.words), suggestion))
        requests += _argument_requests(part, root, line.compound)
    return _judge(descriptor, requests, rules, floor=line.floor)


def _classify(core: tuple[str, ...]) -> str:
    """The one command capability a simple command needs."""
    if not core:
        return "process.execute"
    name, args = core[0], core[1:]
    if name == "git":
        return _git_capability(args)
    if name.startswith("python") and args[:2] == ("-m", "pip"):
        name, args = "pip", args[2:]
    subcommand = next((a for a in args if not a.startswith("-")), "")
    if (name in _NETWORK_COMMANDS or subcommand in _NETWORK_SUBCOMMANDS.get(name, ())
            or (name == "rsync" and any(":" in a for a in args if not a.startswith("-")))):
        return "network.access"
    return "process.execute"


def _git_capability(args: tuple[str, ...]) -> str:
    k = 0
    while k < len(args) and args[k].startswith("-"):
        k += 2 if args[k] in _GIT_GLOBAL_WITH_VALUE else 1
    if k >= len(args):
        return "process.execute"
    sub, rest = args[k], args[k + 1:]
    if sub in _GIT_NETWORK:
        return "network.access"
    if sub in _GIT_MODIFY or _git_subcommand_modifies(sub, rest):
        return "git.modify"
    return "process.execute"


def _git_subcommand_modifies(sub: str, rest: tuple[str, ...]) -> bool:
    """branch, tag, stash, config ... list by default and modify with arguments."""
    first = rest[0] if rest else ""
    flags = set(rest)
    positional = [a for a in rest if not a.startswith("-")]
    listing = {"-l", "--list", "--contains", "--no-contains", "--merged", "--no-merged", "--points-at"}
    if sub == "branch":
        return bool(flags & {"-d", "-D", "--delete", "-m", "-M", "--move", "-c", "-C", "--copy", "-f",
                             "--force", "-u", "--set-upstream-to", "--unset-upstream",
                             "--edit-description"}) or bool(positional and not flags & listing)
    if sub == "tag":
        return bool(flags & {"-d", "--delete", "-a", "-s", "-f", "-m"}) or bool(positional and not flags & listing)
    if sub == "config":
        reading = {"--get", "--get-all", "--get-regexp", "-l", "--list"}
        return not flags & reading and (len(positional) > 1 or any(
            a.startswith(("--unset", "--add", "--replace", "--remove", "--rename", "-e", "--edit")) for a in rest))
    if sub == "remote":
        return first in {"add", "remove", "rm", "rename", "set-url", "set-head", "set-branches",
                         "prune", "update"}
    return ((sub == "stash" and first not in ("list", "show"))
            or (sub == "reflog" and first in ("expire", "delete"))
            or (sub in ("worktree", "submodule", "notes")
                and first not in ("", "list", "status", "summary", "show")))


def _argument_requests(part: _Part, root: str, compound: bool) -> list[_Request]:
    """Path-like arguments are reads (secrets ask, outside asks); output redirections are writes."""
    requests = []
    for op, target in part.redirects:
        writes = op in _WRITE_REDIRECTS and not target.isdigit() and target != "-"
        if (writes or op == "<") and target not in _SAFE_DEVICES:
            requests += _word_requests(target, part.cwd, root, "file.write.project" if writes else "file.read")
    for word in _path_arguments(part.core):
        requests += _word_requests(word, part.cwd, root, "file.read", keep_suggestion=not compound)
    return requests


def _word_requests(word: str, cwd: str, root: str, capability: str, keep_suggestion=False) -> list[_Request]:
    """A shell word naming files: globs are expanded (`cat .e*` reads .env); a word holding
    a value we cannot know ($F, $(...)) might be anywhere, so it counts as outside."""
    if "$(" in word or "`" in word or _PARAMETER.search(word):
        return [_Request("filesystem.outsideProject", word, None)]
    paths = [word]
    if any(ch in word for ch in "*?["):
        paths = sorted(glob.glob(os.path.join(cwd, os.path.expanduser(word))))[:_MAX_GLOB] or paths
    requests = [_path_request(path, cwd, root, capability)[1] for path in paths]
    return [r if keep_suggestion and len(paths) == 1 else r._replace(suggestion=None) for r in requests]


def _path_arguments(core: tuple[str, ...]) -> list[str]:
    if not core or core[0] in ("echo", "printf"):
        return []
    name, args = core[0], core[1:]
    words = []
    for arg in args:
        if arg.startswith("-"):
            value = arg.partition("=")[2]   # --output=/etc/x
            if value.startswith(("/", "~", "..")):
                words.append(value)
        elif "=" in arg and arg.partition("=")[2].startswith(("/", "~", "..")):
            words.append(arg.partition("=")[2])   # dd of=/dev/x, make PREFIX=/usr
        else:
            words.append(arg)
    if name in _PATTERN_FIRST and words and not any(a in ("-e", "-f", "--regexp", "--file") for a in args):
        words = words[1:]
    return [w for w in words if w and w not in _SAFE_DEVICES]


def _suggest(words: tuple[str, ...]) -> str | None:
    """The arity-table pattern for an "always" grant, matched against " ".join(words)."""
    if not words:
        return None
    exact = _escape(" ".join(words))
    program = posixpath.basename(words[0])
    if (_ASSIGNMENT.match(words[0]) or program in _WRAPPERS or words[0].startswith("/")
            or program in _EXACT_ONLY or program.startswith("mkfs")):
        return exact      # an assignment, a wrapper or an absolute path first; a destructive program
    arity, key_length = 1, 1
    for n in range(min(len(words), 3), 0, -1):
        key = " ".join(words[:n])
        if key in ARITY:
            arity, key_length = ARITY[key], n
            break
    if len(words) < arity or any(w.startswith("-") for w in words[key_length:arity]):
        return exact      # "make" alone, "git -C dir push", "python -c code"
    if program == "git" and set(words) & {"--force", "-f", "--hard", "-D", "--force-with-lease"}:
        return exact      # a force flag: granting the whole subcommand would be too much
    return " ".join(_escape(w) for w in words[:arity]) + " *"


# ---------------------------------------------------------------- bash: the hardline floor

def _fork_bomb(command: str) -> str | None:
    unquoted = re.sub(r"'[^']*'|\"(?:\\.|[^\"\\])*\"", "''", command)
    return "fork bomb" if any(p.search(unquoted) for p in _FORK_BOMBS) else None


def _floor_reason(part: _Part, home: str) -> str | None:
    """Why this simple command is refused outright, or None. Reads the de-obfuscated core."""
    for op, target in part.redirects:
        if op in _WRITE_REDIRECTS and _is_device(target):
            return f"write to device {target}"
    if not part.core:
        return None
    name, args = part.core[0], part.core[1:]
    options = [a for a in args[:args.index("--")] if a.startswith("-")] if "--" in args else \
        [a for a in args if a.startswith("-")]
    targets = [a for a in args if a not in options and a != "--"]
    recursive = any(o == "--recursive" or (not o.startswith("--") and set(o[1:]) & {"r", "R"})
                    for o in options)
    doomed = next((t for t in targets if _catastrophic(t, home, part.cwd)), None)
    if name == "rm" and recursive and doomed:
        return f"recursive delete of {doomed}"
    if name in ("chmod", "chown", "chgrp") and recursive and doomed:
        return f"recursive {name} of {doomed}"
    if name.startswith("mkfs") or name in ("mke2fs", "wipefs"):
        return f"formatting a filesystem ({name})"
    if name == "dd" and any(a.startswith("of=") and _is_device(a[3:]) for a in args):
        return "dd onto a device"
    if name in ("cp", "tee", "shred") and any(_is_device(t) for t in targets):
        return f"{name} onto a device"
    if name == "find" and "-delete" in args:
        roots = []
        for a in args:
            if a.startswith(("-", "(", "!")):
                break
            roots.append(a)
        doomed = next((r for r in roots if _catastrophic(r, home, part.cwd)), None)
        if doomed:
            return f"find -delete from {doomed}"
    return None


def _catastrophic(target: str, home: str, cwd: str) -> bool:
    if target in ("*", "./*"):
        return True
    if target.endswith("/*"):
        target = target[:-2] or "/"
    path = _absolute(target) or posixpath.normpath(posixpath.join(cwd, target))
    return path in _PROTECTED_DIRS or path == home


def _is_device(target: str) -> bool:
    path = _absolute(target)
    return (path is not None and path.startswith("/dev/") and path not in _SAFE_DEVICES
            and not path.startswith(("/dev/fd/", "/dev/pts/", "/dev/shm/")))


def _absolute(target: str) -> str | None:
    # "//" and "/./" and "/home/.." all mean "/"; normpath keeps a leading "//", so strip it
    return posixpath.normpath("/" + target.lstrip("/")) if target.startswith("/") else None


def _core(words) -> list[str]:
    """Strip assignments and wrappers (sudo, env, nice, xargs ...) down to the program
    that really runs, named by its basename (/usr/bin/rm -> rm)."""
    words = list(words)
    while words:
        if _ASSIGNMENT.match(words[0]):
            words = words[1:]
            continue
        name = posixpath.basename(words[0]) or words[0]
        if name not in _WRAPPERS:
            return [name, *words[1:]]
        words = _unwrap(name, words[1:])
    return words


def _unwrap(name: str, args: list[str]) -> list[str]:
    k = 0
    while k < len(args):
        arg = args[k]
        if arg == "--":
            k += 1
            break
        if name == "env" and _ASSIGNMENT.match(arg):
            k += 1
            continue
        if not arg.startswith("-") or arg == "-":
            break
        if name == "command" and arg in ("-v", "-V"):
            return []       # only prints where the program is
        if name == "env" and arg in ("-S", "--split-string") and k + 1 < len(args):
            return args[k + 1].split() + args[k + 2:]
        k += 2 if arg in _WRAPPERS[name] else 1
    if name == "timeout" and k < len(args):
        k += 1              # the duration
    return args[k:]


# ---------------------------------------------------------------- bash: words

class _ShellLine:
    """Every simple command one bash line runs, in order, including the ones nested in
    $( ), backticks, bash -c, eval and find -exec. Raises _ParseError on what it can't follow."""

    def __init__(self, command: str, cwd: str, home: str):
        self.home = home
        self.parts: list[_Part] = []
        self.compound = False      # operators, redirections or nesting: no "always" suggestion
        self.floor: str | None = None
        self._parse(command, cwd, 0)

    def _parse(self, command: str, cwd: str, depth: int) -> None:
        if depth > _MAX_NESTING:
            raise _ParseError("nested too deeply")
        self.floor = self.floor or _fork_bomb(command)
        tokens = _lex(command)
        segments = _segments(tokens)
        if len(segments) > 1 or any(kind == "op" and value != "\n" for kind, value in tokens):
            self.compound = True
        env: dict[str, str] = {}    # variables assigned earlier in this line
        for words, redirects in segments:
            for pieces in [*words, *(target for _, target in redirects)]:
                for kind, value in pieces:
                    if kind in ("sub", "dqsub"):
                        self.compound = True
                        self._parse(value, cwd, depth + 1)
            expanded = [w for pieces in words for w in self._expand(pieces, env)]
            while expanded and expanded[0] in _KEYWORDS:
                expanded.pop(0)
            while expanded and expanded[-1] == "}":
                expanded.pop()
            if expanded and expanded[0] in _SKIPPED_STATEMENTS:
                continue
            targets = tuple((op, " ".join(self._expand(t, env))) for op, t in redirects)
            if not expanded and not targets:
                continue
            self._remember_assignments(expanded, env)
            cwd = self._add(tuple(expanded), targets, cwd, depth)

    def _add(self, words: tuple[str, ...], redirects, cwd: str, depth: int) -> str:
        """Record one simple command and what it runs in turn; return the cwd after it."""
        core = tuple(_core(words))
        part = _Part(words, core, redirects, cwd)
        self.parts.append(part)
        self.floor = self.floor or _floor_reason(part, self.home)
        if core and core[0] in _SHELLS:
            flag = next((i for i, w in enumerate(core[1:], 1)
                         if w.startswith("-") and not w.startswith("--") and "c" in w), None)
            scripts = [core[flag + 1]] if flag is not None and flag + 1 < len(core) else \
                [target for op, target in redirects if op in ("<<", "<<-", "<<<")]
            for script in scripts:
                self.compound = True
                self._parse(script, cwd, depth + 1)
        elif core and core[0] == "eval":
            self.compound = True
            self._parse(" ".join(core[1:]), cwd, depth + 1)
        elif core and core[0] == "find":
            for k, word in enumerate(core):
                if word in ("-exec", "-execdir", "-ok", "-okdir"):
                    end = next((j for j in range(k + 1, len(core)) if core[j] in (";", "+")), len(core))
                    inner = tuple(w for w in core[k + 1:end] if w != "{}")
                    if inner:
                        self._add(inner, (), cwd, depth + 1)
        if core[:1] == ("cd",):
            target = core[1] if len(core) > 1 else self.home
            if not target.startswith("-") and "$" not in target:
                cwd = posixpath.normpath(posixpath.join(cwd, target))
        return cwd

    def _remember_assignments(self, words: list[str], env: dict) -> None:
        if words and words[0] in ("export", "declare", "local", "readonly", "typeset"):
            words = words[1:]
        if words and all(_ASSIGNMENT.match(w) for w in words):
            for word in words:
                name, _, value = word.partition("=")
                env[name.rstrip("+")] = env.get(name.rstrip("+"), "") + value if name.endswith("+") else value

    def _expand(self, pieces: list, env: dict, split: bool = True) -> list[str]:
        """Quote removal and the expansions an attacker could hide a word behind: braces,
        ~, $HOME, $IFS, variables set earlier in the line, $(echo ...)."""
        if len(pieces) == 1 and pieces[0][0] == "raw" and _BRACES.search(pieces[0][1]):
            return [w for word in _brace_expand(pieces[0][1]) for w in self._expand([("raw", word)], env)]
        if pieces and pieces[0][0] == "raw" and _ASSIGNMENT.match(pieces[0][1]):
            split = False      # A="x y" and A=$B are not word-split
        chunks, quoted = [], False
        for index, (kind, text) in enumerate(pieces):
            if kind == "raw":
                if index == 0:   # ~ at the start of a word or of an assignment's value
                    text = re.sub(r"^([A-Za-z_]\w*\+?=)?~(?=/|$)", lambda m: (m[1] or "") + self.home, text)
                chunks.append(self._substitute(text, env, split))
            elif kind == "dq":
                quoted = True
                chunks.append(self._substitute(text, env, False))
            elif kind == "lit":
                quoted = True
                chunks.append(text)
            else:      # a command substitution: known only when it is a plain echo/printf
                output = self._static_output(text, env)
                quoted = quoted or kind == "dqsub"
                if output is None:
                    chunks.append(f"$({text})")
                else:
                    chunks.append(re.sub(r"\s+", "\0", output.strip()) if kind == "sub" and split else output)
        fields = [f for f in "".join(chunks).split("\0") if f]
        return fields or ([""] if quoted else [])

    def _substitute(self, text: str, env: dict, split: bool) -> str:
        """Parameter expansion; "\\0" marks where an unquoted value splits into words."""
        def value(match):
            name = match.group(1) or match.group(2)
            if name == "IFS":
                return "\0" if split else " "
            if name in env:
                found = env[name]
            elif name == "HOME":
                found = self.home
            elif name in "123456789@*":
                found = ""     # positional parameters are empty in `bash -c`
            else:
                return match.group(0)
            return re.sub(r"\s+", "\0", found) if split else found
        return _PARAMETER.sub(value, text)

    def _static_output(self, inner: str, env: dict) -> str | None:
        try:
            segments = _segments(_lex(inner))
        except _ParseError:
            return None
        if len(segments) != 1 or segments[0][1]:
            return None
        words = [w for pieces in segments[0][0] for w in self._expand(pieces, env)]
        if words[:1] == ["echo"]:
            args = words[1:]
            while args and args[0] in ("-n", "-e", "-E"):
                args = args[1:]
            return " ".join(args)
        if words[:1] == ["printf"] and len(words) == 2 and "%" not in words[1]:
            return words[1].replace("\\n", "\n")
        return None


def _brace_expand(word: str) -> list[str]:
    """{rm,-rf,/} -> rm -rf /; depth-first and capped, so {a,b}{a,b}... cannot explode."""
    done, todo = [], [word]
    while todo and len(done) < _MAX_GLOB:
        word = todo.pop(0)
        match = _BRACES.search(word)
        if not match:
            done.append(word)
            continue
        todo[:0] = [word[:match.start()] + alt + word[match.end():] for alt in match.group(1).split(",")]
    return done


# ---------------------------------------------------------------- bash: tokens

def _segments(tokens: list) -> list[tuple[list, list]]:
    """Split tokens at separators into (words, redirections) per simple command."""
    segments, words, redirects = [], [], []
    k = 0
    while k < len(tokens):
        kind, value = tokens[k]
        if kind == "op" and value in _SEPARATORS:
            if words or redirects:
                segments.append((words, redirects))
            words, redirects = [], []
        elif kind == "op":
            if k + 1 >= len(tokens) or tokens[k + 1][0] != "word":
                raise _ParseError(f"redirection {value} has no target")
            redirects.append((value, tokens[k + 1][1]))
            k += 1
        else:
            words.append(value)
        k += 1
    if words or redirects:
        segments.append((words, redirects))
    return segments


def _lex(text: str) -> list:
    """Tokens ("op", operator) and ("word", pieces); a piece is (kind, text) with kind raw
    (unquoted), dq (double-quoted), lit (single-quoted or escaped), sub/dqsub (the source
    of a command substitution). Heredoc bodies are data and are skipped."""
    tokens, pieces, raw = [], [], []
    heredocs, expect_delimiter = [], None
    i, n = 0, len(text)

    def end_word():
        nonlocal expect_delimiter
        if raw:
            pieces.append(("raw", "".join(raw)))
            raw.clear()
        if pieces:
            tokens.append(("word", list(pieces)))
            if expect_delimiter:
                quoted = any(kind != "raw" for kind, _ in pieces)
                heredocs.append(("".join(t for _, t in pieces), expect_delimiter == "<<-", quoted, tokens[-1][1]))
                expect_delimiter = None
            pieces.clear()

    def piece(kind, value):
        if raw:
            pieces.append(("raw", "".join(raw)))
            raw.clear()
        pieces.append((kind, value))

    while i < n:
        c = text[i]
        if c == "\\":
            if text.startswith("\n", i + 1):
                i += 2          # line continuation
                continue
            piece("lit", text[i + 1:i + 2])
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise _ParseError("unterminated single quote")
            piece("lit", text[i + 1:end])
            i = end + 1
        elif text.startswith("$'", i):
            end = i + 2
            while end < n and text[end] != "'":
                end += 2 if text[end] == "\\" else 1
            if end >= n:
                raise _ParseError("unterminated $'...'")
            piece("lit", _ansi_c(text[i + 2:end]))
            i = end + 1
        elif c == '"':
            i = _lex_double(text, i + 1, piece)
        elif text.startswith("$((", i):
            end = _balanced(text, i + 1)
            piece("lit", text[i:end])
            for inner in _nested_subs(text[i + 3:end - 2]):
                piece("sub", inner)
            i = end
        elif text.startswith("$(", i) or (c in "<>" and text.startswith("(", i + 1) and not pieces and not raw):
            end = _balanced(text, i + 1)      # $( ) and process substitution <( ) >( )
            piece("sub", text[i + 2:end - 1])
            i = end
        elif c == "`":
            end = _backtick_end(text, i + 1)
            piece("sub", re.sub(r"\\([`$\\])", r"\1", text[i + 1:end]))
            i = end + 1
        elif c == "#" and not pieces and not raw:
            end = text.find("\n", i)
            i = n if end < 0 else end      # a comment
        elif c in " \t":
            end_word()
            i += 1
        else:
            op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
            if op is None:
                raw.append(c)
                i += 1
                continue
            if c in "<>" and not pieces and "".join(raw).isdigit():
                raw.clear()                 # 2> and 0<: the descriptor number does not matter here
            end_word()
            tokens.append(("op", op))
            i += len(op)
            if op in ("<<", "<<-"):
                expect_delimiter = op
            elif op == "\n" and heredocs:
                i = _read_heredocs(text, i, heredocs)
                heredocs.clear()
    end_word()
    return tokens


def _lex_double(text: str, i: int, piece) -> int:
    """Lex a double-quoted string starting after its quote; return the index after it."""
    buf = []

    def flush():
        if buf:
            piece("dq", "".join(buf))
            buf.clear()
    piece("dq", "")       # so "" is still a (empty) word
    while i < len(text):
        c = text[i]
        if c == '"':
            flush()
            return i + 1
        if c == "\\" and text[i + 1:i + 2] in ('$', '`', '"', '\\', '\n'):
            flush()
            if text[i + 1] != "\n":
                piece("lit", text[i + 1])
            i += 2
        elif text.startswith("$((", i):
            end = _balanced(text, i + 1)
            buf.append(text[i:end])
            flush()
            for inner in _nested_subs(text[i + 3:end - 2]):
                piece("dqsub", inner)
            i = end
        elif text.startswith("$(", i):
            end = _balanced(text, i + 1)
            flush()
            piece("dqsub", text[i + 2:end - 1])
            i = end
        elif c == "`":
            end = _backtick_end(text, i + 1)
            flush()
            piece("dqsub", re.sub(r"\\([`$\\\"])", r"\1", text[i + 1:end]))
            i = end + 1
        else:
            buf.append(c)
            i += 1
    raise _ParseError("unterminated double quote")


def _balanced(text: str, i: int) -> int:
    """text[i] is "("; return the index just after its matching ")" (quote-aware)."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise _ParseError("unterminated single quote")
            i = end + 1
            continue
        if c == '"':
            i = _lex_double(text, i + 1, lambda kind, value: None)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _ParseError("unbalanced parenthesis")


def _backtick_end(text: str, i: int) -> int:
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == "`":
            return i
        else:
            i += 1
    raise _ParseError("unterminated backtick")


def _read_heredocs(text: str, i: int, heredocs: list) -> int:
    """Consume the bodies that follow a line; each becomes its `<<` word's only content."""
    for delimiter, strip_tabs, quoted, target in heredocs:
        lines = []
        while i < len(text):
            end = text.find("\n", i)
            line, i = (text[i:], len(text)) if end < 0 else (text[i:end], end + 1)
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                break
            lines.append(line)
        body = "\n".join(lines)
        target[:] = [("lit", body)] + ([] if quoted else [("sub", s) for s in _nested_subs(body)])
    return i


def _nested_subs(text: str) -> list[str]:
    """The $( ) and backtick commands inside text where quotes do not protect them
    (heredoc bodies, arithmetic)."""
    found, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text.startswith("$(", i):
            end = _balanced(text, i + 1)
            found.append(text[i + 2:end - 1])
            i = end
        elif text[i] == "`":
            end = _backtick_end(text, i + 1)
            found.append(text[i + 1:end])
            i = end + 1
        else:
            i += 1
    return found


def _ansi_c(body: str) -> str:
    """Decode bash's $'...' escapes ($'\\x72\\x6d' is "rm")."""
    simple = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "f": "\f",
              "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}

    def decode(match):
        code = match.group(1)
        if code[0] in "xu":
            return chr(int(code[1:], 16))
        if code[0] in "01234567":
            return chr(int(code, 8))
        return simple.get(code, "\\" + code)
    return re.sub(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|[0-7]{1,3}|.)", decode, body)
