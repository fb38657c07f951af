"""permissions.py: what a tool call may do, decided before it runs.

Owns: the capabilities a tool call needs (file.read, file.write.project, filesystem.outsideProject,
process.execute, git.modify, network.access), rules {capability, pattern, action} evaluated
last-match-wins, the hardline floor beneath the rules, shell-word parsing of bash commands, "always"
suggestions (the arity table) and the config-dict edit that persists a grant.
Must not: import our other modules, write files or run anything. It only reads the world:
os.path.realpath resolves symlinks, glob expands wildcards, expanduser reads $HOME.

What a rule's pattern is matched against (fnmatch, case-sensitive; `*` also crosses `/`):
  file.read, file.write.project  the project-relative POSIX path after resolving `..` and symlinks: "src/app.py"
  filesystem.outsideProject      the absolute resolved path: "/etc/hosts" (a "~" starting a pattern is expanded)
  process.execute, git.modify,   one simple command's words after quote removal, joined by single spaces:
  network.access                 "git commit -m fix bug". A pattern ending in " *" also matches the bare
                                 command ("ls *" matches "ls").
A bash line is split into the simple commands it runs (&&, ||, ;, |, &, newlines, $( ), backticks,
subshells, heredocs, bash -c, eval, find -exec); each needs one of process.execute / git.modify /
network.access, plus file.read or filesystem.outsideProject for each argument that may name a file,
and file.write.project for each output redirection. Every request is judged; the strictest answer
wins (deny > ask > allow).

"Always" suggestions: a bash command gets its arity-table prefix plus " *" ("git push *");
destructive programs (rm, dd, curl, sudo ...), options before the subcommand, and asks made by a
specific rule ("find *-delete*") get the exact command; a line with operators or redirections gets
none. A project write suggests the file's directory subtree ("src/api/*", or the file itself at the
root); a secret read or anything outside the project suggests the exact path.
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
ACTIONS = ("allow", "ask", "deny")                                 # in order of strictness
_STRICTNESS = {action: n for n, action in enumerate(ACTIONS)}
_COMMAND_CAPABILITIES = ("process.execute", "git.modify", "network.access")
_RULE_KEYS = ("capability", "pattern", "action")

# Project files whose reading asks, then the harmless templates that share their names.
SECRET_PATTERNS = ("*.env", "*.env.*", "*.pem", "*.key", "*.p12", "*.pfx", "*id_rsa*",
                   "*id_dsa*", "*id_ecdsa*", "*id_ed25519*", "*.netrc", "*.pypirc")
SECRET_TEMPLATES = ("*.env.example", "*.env.sample", "*.env.template")

# Commands that only read. Their other forms are caught elsewhere: modifying git forms are
# git.modify (so "git branch *" only ever sees listings) and READ_ONLY_EXCEPTIONS ask again.
READ_ONLY_COMMANDS = (*"""ls cat head tail wc pwd echo printf cd which type whoami date stat du df tree grep egrep fgrep
    rg find sort cut tr diff cmp basename dirname realpath readlink true false test [ [[ nl jq uname id md5sum sha256sum
    shasum""".split(), *("git " + sub for sub in """status diff log show branch tag describe rev-parse ls-files ls-tree
    blame shortlog remote stash merge-base show-ref reflog worktree cat-file config submodule""".split()))
READ_ONLY_EXCEPTIONS = ("find *-exec*", "find *-ok*", "find *-delete*", "find *-fprint*",
                        "find *-fls*", "sort *-o*", "sort *--compress*", "tree *-o*",
                        "rg *--pre*", "git *--output*", "date *-s*")

# How many leading words name "the command" ("git push origin main" -> "git push *").
# The longest matching key wins; unknown programs have arity 1.
ARITY = {**dict.fromkeys("""git npm npx yarn pnpm bun bunx deno node python python3 pip pip3 pipx uv poetry ruby bundle
    rails rake cargo rustup go make just ruff docker docker-compose kubectl helm terraform brew apt apt-get mvn gradle
    ./gradlew dotnet swift pre-commit systemctl""".split(), 2),
         **dict.fromkeys(("gh", "git remote", "git stash", "git submodule", "git worktree", "npm run", "npm exec",
                          "yarn run", "pnpm run", "bun run", "deno task", "python -m", "python3 -m", "python manage.py",
                          "python3 manage.py", "uv run", "uv pip", "poetry run", "bundle exec", "go mod",
                          "docker compose"), 3)}
# Programs whose "always" is the exact command: a wildcard over their arguments would grant
# far more than the user just saw (rm *, curl *, sudo *).
_EXACT_ONLY = frozenset("""rm rmdir dd chmod chown chgrp mv cp ln tee kill pkill killall shred truncate sudo doas su
    eval exec source . env xargs bash sh zsh dash fish ssh scp sftp rsync curl wget nc ncat telnet sed awk perl
    find""".split())

_GIT_NETWORK = frozenset(("fetch", "clone", "ls-remote"))
_GIT_MODIFY = frozenset("""add am apply checkout cherry-pick clean commit gc init merge mv pull push rebase reset
    restore revert rm switch update-ref update-index filter-branch replace bisect sparse-checkout prune lfs""".split())
# Subcommands that read in these forms (their first argument; "" = none) and modify in any
# other, or whenever a _GIT_MODIFYING_FLAGS flag appears.
_GIT_READ_FORMS = {name: set(forms.split(",")) for name, forms in {
    "branch": ",-a,-r,-v,-vv,-l,--list,--all,--remotes,--merged,--no-merged,--contains,--show-current",
    "tag": ",-l,--list,-n,--contains,--points-at", "config": "--get,--get-all,--get-regexp,-l,--list",
    "stash": "list,show", "remote": ",-v,show,get-url", "reflog": ",show", "worktree": "list",
    "submodule": ",status,summary", "notes": ",list,show"}.items()}
_GIT_MODIFYING_FLAGS = frozenset("""-d -D --delete -m -M --move -c -C --copy -f --force -u --set-upstream-to --unset
    --unset-all --add --replace-all -e --edit""".split())
_GIT_GLOBAL_WITH_VALUE = frozenset(("-C", "-c", "--git-dir", "--work-tree", "--namespace"))
_NETWORK_COMMANDS = frozenset("curl wget ssh scp sftp nc ncat netcat telnet ftp http https aria2c gh".split())
# Package managers: the subcommands that download or publish ("" = the bare command).
_NETWORK_SUBCOMMANDS = {name: set(subs.split(",")) for name, subs in {
    "pip": "install,download", "pip3": "install,download", "pipx": "install,run,upgrade",
    "uv": "add,sync,pip,tool,lock", "npm": "install,i,ci,add,update,publish", "pnpm": "install,i,add,update,dlx",
    "yarn": ",install,add,upgrade,dlx", "bun": "install,i,add,update,x", "cargo": "install,add,fetch,update,publish",
    "go": "get,install", "gem": "install,update", "brew": "install,update,upgrade,tap", "apt": "install,update,upgrade",
    "apt-get": "install,update,upgrade", "docker": "pull,push,login", "poetry": "add,install,update",
    "bundle": "install,update", "composer": "install,require,update"}.items()}

# Programs that run the rest of their words as a command -> their options taking a value.
_WRAPPERS = {name: set(options.split()) for name, options in {
    "sudo": "-u -g -C -D -h -p -r -t -T -U --user --group", "doas": "-u -C", "env": "-u -C --unset --chdir",
    "command": "", "builtin": "", "exec": "-a", "nohup": "", "time": "", "setsid": "", "nice": "-n --adjustment",
    "ionice": "-c -n", "stdbuf": "-i -o -e", "timeout": "-s -k --signal --kill-after", "busybox": "",
    "unbuffer": "", "watch": "-n -d", "xargs": "-I -n -P -L -d -s -E -a"}.items()}
_SHELLS = frozenset(("sh", "bash", "zsh", "dash", "ksh", "ash", "su"))
_KEYWORDS = frozenset("if then else elif fi do done while until ! { } esac".split())
_SKIPPED_STATEMENTS = frozenset(("for", "select", "case", "function"))
_PATTERN_FIRST = frozenset(("grep", "egrep", "fgrep", "rg", "sed", "awk", "jq"))   # arg 1 is no file

# The floor's targets: deleting or chmod-ing these recursively is never what anyone wanted.
_PROTECTED_DIRS = frozenset("""/ /bin /boot /dev /etc /home /lib /lib32 /lib64 /opt /proc /root /sbin /srv /sys /usr
    /var /Users /System /Library /Applications /private""".split())
_SAFE_DEVICES = frozenset("""/dev/null /dev/zero /dev/stdout /dev/stderr /dev/stdin /dev/tty /dev/random /dev/urandom
    /dev/full""".split())

_OPERATORS = (*"&& || ;; |& &>> &> >> >| >& <<< <<- << <& <> > < | & ; ( )".split(), "\n")   # longest first
_SEPARATORS = frozenset((*"&& || ;; |& | & ; ( )".split(), "\n"))
_WRITE_REDIRECTS = frozenset("> >> >| &> &>> <> >&".split())
_MAX_GLOB = 100          # paths one glob or brace argument expands to, at most
_MAX_NESTING = 8         # $( bash -c "eval ..." ) deeper than this is refused as unparsable
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
_PARAMETER = re.compile(r"\$(?:\{([A-Za-z_]\w*|[0-9@*])\}|([A-Za-z_]\w*|[0-9@*]))")
_BRACES = re.compile(r"\{([^{}]*,[^{}]*)\}")
# A fork bomb defines a function and pipes it into itself in the background. Two linear
# scans (names are matched possessively, ++): names defined as functions, NAME | NAME & uses.
_NAME = r"(?<![^\s;&|(){}])(?P<n>[^\s(){}|&;<>]++)"
_FUNCTION_DEFINITION = re.compile(rf"{_NAME}\s*\(\s*\)|\bfunction\s+(?P<f>[^\s(){{}}|&;<>]++)")
_SELF_PIPE = re.compile(rf"{_NAME}\s*\|(?!\|)\s*(?P=n)\s*&")


class PermissionConfigError(ValueError):
    """A config file's "permissions" list is malformed; the message names the file and entry."""


class _ParseError(ValueError):
    """A bash line this parser cannot follow: it is then never allowed without asking."""


# ---------------------------------------------------------------- data types

@dataclass(frozen=True)
class Rule:
    capability: str   # a capability name, or an fnmatch pattern over them ("*", "file.*")
    pattern: str      # fnmatch pattern over the request's subject (see the module docstring)
    action: str       # "allow" | "ask" | "deny"
    source: str = "default"   # "default" or the config file the rule came from


@dataclass(frozen=True)
class Decision:
    action: str               # "allow" | "ask" | "deny"
    capability: str           # the capability that decided (the first strictest request)
    descriptor: str           # what the user is asked about: the command or the path
    rule: Rule | None         # the deciding rule; None for the floor or when nothing matched
    floor: bool               # True when the hardline floor refused (no rule can override)
    suggestion: dict | None   # {"capability", "pattern"} an "always" would persist, or None
    reason: str = ""          # one line for the model and the user: the rule or the floor item


class _Request(NamedTuple):
    capability: str
    subject: str              # what rule patterns are matched against
    suggestion: str | None    # the pattern an "always" grant would save, or None


class _Part(NamedTuple):      # one simple command of a bash line
    words: tuple[str, ...]    # after quote removal and expansion; joined, what rules match
    core: tuple[str, ...]     # without assignments and wrappers (sudo, env ...); program basename
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
    otherwise one message naming the bad entry and showing what a good one looks like."""
    if isinstance(obj, dict):
        obj = obj.get("permissions", [])
    elif not isinstance(obj, list):
        return None if obj is None else 'the config must be a JSON object, e.g. {"permissions": []}'
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
    """Defaults, then each (source, config) layer in order: pass the user's before the
    project's, so project rules come later and win. Raises PermissionConfigError."""
    rules = default_rules()
    for source, config in layers:
        problem = validate_config_rules(config)
        if problem:
            raise PermissionConfigError(f"{source}: {problem}")
        rules += [Rule(e["capability"], e["pattern"], e["action"], source)
                  for e in (config or {}).get("permissions", [])]
    return rules


def decide(tool_name: str, tool_input: dict, project_root: Path, rules: list[Rule]) -> Decision:
    """The floor first, then every capability the call needs; the strictest answer wins."""
    root = os.path.realpath(project_root)
    arg = lambda key: "" if tool_input.get(key) is None else str(tool_input.get(key))  # noqa: E731 (any JSON type)
    if tool_name == "process" and arg("action") != "start":
        # list/read/write/stop only touch processes that were judged when they started
        return Decision("allow", "process.execute", f"process {arg('action')}", None, False, None)
    if tool_name in ("bash", "process"):
        return _decide_bash(arg("command"), arg("workdir"), root, rules)
    if tool_name in ("read", "write", "edit", "grep", "glob"):
        capability = "file.write.project" if tool_name in ("write", "edit") else "file.read"
        where = arg("file_path") if tool_name in ("read", "write", "edit") else arg("path") or "."
        if tool_name == "glob":
            where = _glob_base(posixpath.join(where, arg("pattern")))
        request = _path_request(where, root, root, capability)
        return _judge(request.subject, [request], rules)
    return Decision("deny", "unknown", tool_name, None, False, None, f"unknown tool {tool_name!r}")


def check(kind: str, value: str, project_root: Path, rules: list[Rule]) -> dict:
    """What would happen, without doing anything: `khaelor permissions check --json`."""
    calls = {"bash": ("bash", {"command": value}), "read": ("read", {"file_path": value}),
             "write": ("write", {"file_path": value, "content": ""})}
    if kind not in calls:
        raise ValueError(f"check kind must be bash, read or write, not {kind!r}")
    decision = decide(*calls[kind], project_root, rules)
    rule = rule_text(decision.rule) if decision.rule else (decision.reason if decision.floor else None)
    return {"decision": decision.action, "capability": decision.capability, "rule": rule, "floor": decision.floor,
            "suggestion": decision.suggestion["pattern"] if decision.suggestion else None}


def describe_rules(rules: list[Rule]) -> list[str]:
    """One line per rule in evaluation order (the last matching line wins), with its source."""
    width = max((len(r.capability) for r in rules), default=0)
    return [f"{n:>3}  {r.action:<5}  {r.capability:<{width}}  {r.pattern:<24}  {r.source}"
            for n, r in enumerate(rules, 1)]


def rule_text(rule: Rule) -> str:
    return f'{rule.action} {rule.capability} "{rule.pattern}" ({rule.source})'


def add_grant(config: dict, rule: dict) -> dict:
    """A copy of config whose last permission is rule ({capability, pattern, action="allow"}),
    so it wins; an identical earlier entry is moved there, never duplicated."""
    entry = {"capability": rule.get("capability"), "pattern": rule.get("pattern"),
             "action": rule.get("action", "allow")}
    problem = validate_config_rules([entry]) or validate_config_rules(config)
    if problem:
        raise PermissionConfigError(problem.replace("permissions[0]", "grant", 1))
    kept = [e for e in config.get("permissions", []) if e != entry]
    return {**config, "permissions": [*kept, entry]}


# ---------------------------------------------------------------- evaluation

def _judge(descriptor: str, requests: list[_Request], rules: list[Rule], *,
           floor: str | None = None, at_least: str = "allow") -> Decision:
    # The agent must not be able to grant itself permissions, not even under --yes.
    floor = floor or next(("khaelor's permission config (.khaelor/config.json) is changed only by the user"
                           for r in requests if r.capability != "file.read"
                           and ("/" + r.subject).endswith("/.khaelor/config.json")), None)
    if floor:
        return Decision("deny", "process.execute", descriptor, None, True, None, f"hardline floor: {floor}")
    if not requests:
        return Decision(at_least, "process.execute", descriptor, None, False, None)
    verdicts = []
    for request in requests:
        rule = _last_match(rules, request.capability, request.subject)
        verdicts.append((rule.action if rule else "ask", rule, request))
    action, rule, request = max(verdicts, key=lambda v: _STRICTNESS[v[0]])
    if _STRICTNESS[at_least] > _STRICTNESS[action]:
        action, rule = at_least, None
    # One "always" can only cover one asking request. A specific ask rule ("find *-delete*") exists
    # to catch its form; a wildcard grant would undo it for every later case, so it grants this exact subject.
    asking = {(r.capability, r.suggestion if r.suggestion is None or matched is None or matched.pattern == "*"
               else _escape(r.subject)) for a, matched, r in verdicts if a == "ask"}
    suggestion = None
    if action == "ask" and len(asking) == 1:
        capability, pattern = asking.pop()
        suggestion = {"capability": capability, "pattern": pattern} if pattern else None
    reason = rule_text(rule) if rule else f"no rule allows {request.capability} {request.subject}"
    return Decision(action, request.capability, descriptor, rule, False, suggestion, reason)


def _last_match(rules: list[Rule], capability: str, subject: str) -> Rule | None:
    def matches(pattern: str) -> bool:
        if capability == "filesystem.outsideProject" and pattern.startswith("~"):
            pattern = os.path.expanduser(pattern)
        bare = capability in _COMMAND_CAPABILITIES and pattern.endswith(" *")    # "ls *" also matches "ls"
        return fnmatch.fnmatchcase(subject, pattern) or (bare and fnmatch.fnmatchcase(subject, pattern[:-2]))
    return next((rule for rule in reversed(rules)
                 if fnmatch.fnmatchcase(capability, rule.capability) and matches(rule.pattern)), None)


# ---------------------------------------------------------------- paths

def _path_request(path_text: str, base: str, root: str, capability: str) -> _Request:
    """The request to touch path_text (relative to base). realpath resolves `..` and
    symlinks, so a link inside the project that points out of it is outside."""
    try:
        resolved = os.path.realpath(os.path.join(base, os.path.expanduser(path_text)))
    except (ValueError, OSError):      # an embedded NUL and the like: nowhere we can vouch for
        return _Request("filesystem.outsideProject", path_text, None)
    if resolved != root and not resolved.startswith(root.rstrip(os.sep) + os.sep):
        return _Request("filesystem.outsideProject", resolved, _escape(resolved))
    subject = Path(resolved).relative_to(root).as_posix()
    directory = posixpath.dirname(subject)
    if capability == "file.write.project" and directory:
        return _Request(capability, subject, _escape(directory) + "/*")
    return _Request(capability, subject, _escape(subject))


def _glob_base(pattern: str) -> str:
    """The directory a glob starts from: its components before the first wildcard."""
    parts = pattern.split("/")
    static = next((n for n, part in enumerate(parts) if any(ch in part for ch in "*?[{")), len(parts))
    return "/".join(parts[:static]) or ("/" if pattern.startswith("/") else ".")


def _escape(text: str) -> str:
    """fnmatch-quote text so a suggested pattern matches itself literally."""
    return re.sub(r"([*?[])", r"[\1]", text)


# ---------------------------------------------------------------- bash: judging a line

def _decide_bash(command: str, workdir: str, root: str, rules: list[Rule]) -> Decision:
    home = posixpath.normpath(os.path.expanduser("~"))
    requests, cwd = [], root
    if workdir:
        request = _path_request(workdir, root, root, "file.read")
        outside = request.capability == "filesystem.outsideProject"
        cwd = request.subject if outside else os.path.join(root, request.subject)
        requests.append(request._replace(suggestion=None))
    try:
        line = _ShellLine(command, cwd, home)
    except (_ParseError, RecursionError):
        # Bash runs the lines before a syntax error, so the floor still reads every line;
        # what cannot be parsed is never allowed without asking.
        naive = [re.sub(r"[\"'\\]", "", ln).split() for ln in command.splitlines()]
        floor = _fork_bomb(command) or next(filter(None, (
            _floor_reason(_Part(tuple(w), tuple(_core(w)), (), cwd), home) for w in naive)), None)
        return _judge(command.strip(), [_Request("process.execute", command.strip(), None)], rules,
                      floor=floor, at_least="ask")
    for part in line.parts:
        suggestion = None if line.compound else _suggest(part.words)
        requests.append(_Request(_classify(part.core), " ".join(part.words), suggestion))
        for op, target in part.redirects:
            writes = op in _WRITE_REDIRECTS and not target.isdigit() and target != "-"
            if (writes or op == "<") and target not in _SAFE_DEVICES:
                capability = "file.write.project" if writes else "file.read"
                requests += _word_requests(target, part.cwd, root, capability)
        for word in _path_arguments(part.core):
            requests += _word_requests(word, part.cwd, root, "file.read", suggest=not line.compound)
    return _judge(command.strip(), requests, rules, floor=line.floor)


def _classify(core: tuple[str, ...]) -> str:
    """The one command capability a simple command needs."""
    name, args = (core[0], core[1:]) if core else ("", ())
    if name == "git":
        k = 0
        while k < len(args) and args[k].startswith("-"):      # git -C dir -c k=v --no-pager ...
            k += 2 if args[k] in _GIT_GLOBAL_WITH_VALUE else 1
        sub, rest = (args[k], args[k + 1:]) if k < len(args) else ("", ())
        names_something = sub in ("branch", "tag") and any(a[:1] != "-" for a in rest) \
            and not {"-l", "--list"} & set(rest)      # git branch -v NAME creates NAME
        modifies = sub in _GIT_MODIFY or names_something or (sub in _GIT_READ_FORMS and (
            (rest[0] if rest else "") not in _GIT_READ_FORMS[sub] or set(rest) & _GIT_MODIFYING_FLAGS))
        return "network.access" if sub in _GIT_NETWORK else "git.modify" if modifies else "process.execute"
    if name.startswith("python") and args[:2] == ("-m", "pip"):
        name, args = "pip", args[2:]
    subcommand = next((a for a in args if not a.startswith("-")), "")
    if (name in _NETWORK_COMMANDS or subcommand in _NETWORK_SUBCOMMANDS.get(name, ())
            or (name == "rsync" and any(":" in a for a in args if not a.startswith("-")))):
        return "network.access"
    return "process.execute"


def _path_arguments(core: tuple[str, ...]) -> list[str]:
    """Arguments that may name files: positionals, and the values of name=value words."""
    if not core or core[0] in ("echo", "printf"):
        return []
    positional = [a for a in core[1:] if not a.startswith("-")]
    if core[0] in _PATTERN_FIRST and not set(core) & {"-e", "-f", "--regexp", "--file"}:
        positional = positional[1:]
    values = [a.partition("=")[2] for a in core[1:] if "=" in a]   # --output=/x, of=/dev/x
    return [w for w in positional + values if w and w not in _SAFE_DEVICES]


def _word_requests(word: str, cwd: str, root: str, capability: str, suggest=False) -> list[_Request]:
    """A shell word naming files. Globs are expanded (`cat .e*` reads .env); a value we
    cannot know ($F, $(...)) might be anywhere, so it counts as outside the project."""
    if "$(" in word or "`" in word or _PARAMETER.search(word):
        return [_Request("filesystem.outsideProject", word, None)]
    paths = [word]
    if any(ch in word for ch in "*?["):
        paths = sorted(glob.glob(os.path.join(cwd, os.path.expanduser(word))))[:_MAX_GLOB] or paths
    requests = [_path_request(path, cwd, root, capability) for path in paths]
    return [r if suggest and len(paths) == 1 else r._replace(suggestion=None) for r in requests]


def _suggest(words: tuple[str, ...]) -> str | None:
    """The arity-table pattern for an "always" grant, matched against " ".join(words)."""
    if not words:
        return None
    exact = _escape(" ".join(words))
    program = posixpath.basename(words[0])
    if (_ASSIGNMENT.match(words[0]) or program in _WRAPPERS or words[0].startswith("/")
            or program in _EXACT_ONLY or program.startswith("mkfs")):
        return exact      # an assignment, a wrapper or a path first; a destructive program
    key_length = next((n for n in range(min(len(words), 3), 0, -1) if " ".join(words[:n]) in ARITY), 1)
    arity = ARITY.get(" ".join(words[:key_length]), 1)
    if len(words) < arity or any(w.startswith("-") for w in words[key_length:arity]):
        return exact      # "make" alone, "git -C dir push", "python -c code"
    if program == "git" and set(words) & {"--force", "-f", "--hard", "-D", "--force-with-lease"}:
        return exact      # granting the whole subcommand would grant its forced form
    return " ".join(_escape(w) for w in words[:arity]) + " *"


# ---------------------------------------------------------------- bash: the hardline floor

def _fork_bomb(command: str) -> str | None:
    unquoted = re.sub(r"'[^']*'|\"(?:\\.|[^\"\\])*\"", "''", command)
    defined = {m["n"] or m["f"] for m in _FUNCTION_DEFINITION.finditer(unquoted)}
    bombs = [m["n"] for m in _SELF_PIPE.finditer(unquoted) if m["n"] in defined]
    return f"fork bomb ({bombs[0]})" if bombs else None


def _floor_reason(part: _Part, home: str) -> str | None:
    """Why this simple command is refused outright, or None. Reads the de-obfuscated core."""
    for op, target in part.redirects:
        if op in _WRITE_REDIRECTS and _is_device(target):
            return f"write to device {target}"
    name, args = (part.core[0], part.core[1:]) if part.core else ("", ())
    end = args.index("--") if "--" in args else len(args)
    options = [a for a in args[:end] if a.startswith("-")]
    targets = [a for a in args if a not in options and a != "--"]
    letters = {"r", "R"} if name == "rm" else {"R"}      # chmod -r removes read permission
    recursive = any(o == "--recursive" or (o[1:2] != "-" and set(o[1:]) & letters) for o in options)
    doomed = next((t for t in targets if _catastrophic(t, home, part.cwd)), None)
    if name in ("rm", "chmod", "chown", "chgrp") and recursive and doomed:
        return f"recursive {'delete' if name == 'rm' else name} of {doomed}"
    if name.startswith("mkfs") or name in ("mke2fs", "wipefs"):
        return f"formatting a filesystem ({name})"
    if name == "dd" and any(a.startswith("of=") and _is_device(a[3:]) for a in args):
        return "dd onto a device"
    if name in ("cp", "tee", "shred") and any(_is_device(t) for t in targets):
        return f"{name} onto a device"
    if name == "find" and "-delete" in args:
        roots = args[:next((i for i, a in enumerate(args) if a[:1] in ("-", "(", "!")), len(args))]
        doomed = next((r for r in roots if _catastrophic(r, home, part.cwd)), None)
        return f"find -delete from {doomed}" if doomed else None
    return None


def _catastrophic(target: str, home: str, cwd: str) -> bool:
    # A variable we could not resolve may well be unset, and bash expands an unset variable
    # to nothing: `rm -rf "$BUILD_DIR/"` is `rm -rf /` when BUILD_DIR is unset.
    target = _PARAMETER.sub("", target)
    if target in ("*", "./*"):
        return True
    if target.endswith("/*"):
        target = target[:-2] or "/"
    path = _absolute(target) or posixpath.normpath(posixpath.join(cwd, target))
    return path in _PROTECTED_DIRS or path == home


def _is_device(target: str) -> bool:
    path = _absolute(target) or ""
    return (path.startswith("/dev/") and path not in _SAFE_DEVICES
            and not path.startswith(("/dev/fd/", "/dev/pts/", "/dev/shm/")))


def _absolute(target: str) -> str | None:
    # "//", "/./" and "/home/.." all mean "/"; normpath keeps a leading "//", so strip it first
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
    while k < len(args) and (args[k].startswith("-") or (name == "env" and _ASSIGNMENT.match(args[k]))):
        arg = args[k]
        if arg in ("--", "-"):
            k += arg == "--"
            break
        if name == "command" and arg in ("-v", "-V"):
            return []       # only prints where the program is
        if name == "env" and arg in ("-S", "--split-string") and k + 1 < len(args):
            return args[k + 1].split() + args[k + 2:]
        k += 2 if arg in _WRAPPERS[name] else 1
    return args[k + (name == "timeout"):]      # timeout's duration precedes the command


# ---------------------------------------------------------------- bash: simple commands

class _ShellLine:
    """Every simple command one bash line runs, in order, including those nested in $( ),
    backticks, heredocs fed to a shell, bash -c, eval and find -exec."""

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
        self.compound |= len(segments) > 1 or any(k == "op" and v != "\n" for k, v in tokens)
        env: dict[str, str] = {}    # variables assigned earlier in this line
        for words, redirects in segments:
            for pieces in [*words, *(target for _, target in redirects)]:
                for kind, value in pieces:
                    if kind in ("sub", "dqsub"):     # a command substitution runs too
                        self.compound = True
                        self._parse(value, cwd, depth + 1)
            expanded = [w for pieces in words for w in self._expand(pieces, env)]
            while expanded and expanded[0] in _KEYWORDS:
                expanded.pop(0)
            while expanded and expanded[-1] == "}":
                expanded.pop()
            targets = tuple((op, " ".join(self._expand(t, env))) for op, t in redirects)
            skipped = bool(expanded) and expanded[0] in _SKIPPED_STATEMENTS
            if (expanded or targets) and not skipped:
                self._remember_assignments(expanded, env)
                cwd = self._add(tuple(expanded), targets, cwd, depth)

    def _add(self, words: tuple[str, ...], redirects, cwd: str, depth: int) -> str:
        """Record one simple command and what it runs in turn; return the cwd after it."""
        core = tuple(_core(words))
        part = _Part(words, core, redirects, cwd)
        self.parts.append(part)
        self.floor = self.floor or _floor_reason(part, self.home)
        name = core[0] if core else ""
        scripts = []
        if name in _SHELLS:      # bash -c SCRIPT, or a script fed by <<EOF / <<<
            flag = next((i for i, w in enumerate(core) if w[:1] == "-" and w[1:2] != "-" and "c" in w), 0)
            scripts = [core[flag + 1]] if 0 < flag < len(core) - 1 else \
                [target for op, target in redirects if op in ("<<", "<<-", "<<<")]
        elif name == "eval":
            scripts = [" ".join(core[1:])]
        for script in scripts:
            self.compound = True
            self._parse(script, cwd, depth + 1)
        for k, word in enumerate(core if name == "find" else ()):
            if word in ("-exec", "-execdir", "-ok", "-okdir"):   # {} stands for what find found
                end = next((j for j in range(k + 1, len(core)) if core[j] in (";", "+")), len(core))
                start = core[1] if len(core) > 1 and core[1][:1] not in ("-", "(", "!") else "."
                if core[k + 1:end]:
                    self._add(tuple(start if w == "{}" else w for w in core[k + 1:end]), (), cwd, depth + 1)
        if name == "cd":
            target = core[1] if len(core) > 1 else self.home
            if target[:1] != "-" and "$" not in target:
                cwd = posixpath.normpath(posixpath.join(cwd, target))
        return cwd

    def _remember_assignments(self, words: list[str], env: dict) -> None:
        if words[:1] in (["export"], ["declare"], ["local"], ["readonly"], ["typeset"]):
            words = words[1:]
        if words and all(_ASSIGNMENT.match(w) for w in words):
            for word in words:
                name, _, value = word.partition("=")
                env[name.rstrip("+")] = (env.get(name[:-1], "") if name.endswith("+") else "") + value

    def _expand(self, pieces: list, env: dict) -> list[str]:
        """Quote removal and the expansions a word can hide behind: braces, ~, $HOME, $IFS,
        variables assigned earlier in the line, $(echo ...). Returns the resulting words."""
        if len(pieces) == 1 and pieces[0][0] == "raw" and _BRACES.search(pieces[0][1]):
            return [w for word in _brace_expand(pieces[0][1]) for w in self._expand([("raw", word)], env)]
        # A="x y" and A=$B are not word-split
        split = not (pieces and pieces[0][0] == "raw" and _ASSIGNMENT.match(pieces[0][1]))
        chunks, quoted = [], False
        for index, (kind, text) in enumerate(pieces):
            if kind == "raw":
                if index == 0:   # ~ starting a word or an assignment's value
                    text = re.sub(r"^([A-Za-z_]\w*\+?=)?~(?=/|$)", lambda m: (m[1] or "") + self.home, text)
                chunks.append(self._substitute(text, env, split))
            elif kind in ("dq", "lit"):
                quoted = True
                chunks.append(self._substitute(text, env, False) if kind == "dq" else text)
            else:      # a command substitution: its output is known only for plain echo/printf
                output = self._static_output(text, env)
                quoted |= kind == "dqsub"
                if output is None:
                    chunks.append(f"$({text})")
                else:
                    chunks.append(re.sub(r"\s+", "\0", output.strip()) if kind == "sub" and split else output)
        fields = [f for f in "".join(chunks).split("\0") if f]
        return fields or ([""] if quoted else [])

    def _substitute(self, text: str, env: dict, split: bool) -> str:
        """Parameter expansion; "\\0" marks where an unquoted value splits into words."""
        def value(match):
            name = match[1] or match[2]
            if name == "IFS":
                return "\0" if split else " "
            if name in env or name == "HOME":
                found = env.get(name, self.home)
            elif name in "123456789@*":
                found = ""     # positional parameters are empty in `bash -c`
            else:
                return match[0]
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
            start = next((k for k, w in enumerate(words) if k and w not in ("-n", "-e", "-E")), len(words))
            return " ".join(words[start:])
        if words[:1] == ["printf"] and len(words) == 2 and "%" not in words[1]:
            return words[1].replace("\\n", "\n")
        return None


def _brace_expand(word: str) -> list[str]:
    """{rm,-rf,/} -> rm -rf /; depth-first and capped, so {a,b}{a,b}... cannot explode."""
    done, todo = [], [word]
    while todo and len(done) < _MAX_GLOB:
        word = todo.pop(0)
        match = _BRACES.search(word)
        if match:
            todo[:0] = [word[:match.start()] + alt + word[match.end():] for alt in match[1].split(",")]
        else:
            done.append(word)
    return done


# ---------------------------------------------------------------- bash: tokens

def _segments(tokens: list) -> list[tuple[list, list]]:
    """Split tokens at separators into (words, [(redirection, target)]) per simple command."""
    segments, words, redirects = [], [], []
    stream = iter(tokens)
    for kind, value in stream:
        if kind == "word":
            words.append(value)
        elif value in _SEPARATORS:
            segments.append((words, redirects))
            words, redirects = [], []
        else:
            target = next(stream, ("op", None))
            if target[0] != "word":
                raise _ParseError(f"redirection {value} has no target")
            redirects.append((value, target[1]))
    segments.append((words, redirects))
    return [s for s in segments if s[0] or s[1]]


def _lex(text: str) -> list:
    """Tokens ("op", operator) and ("word", pieces); a piece is (kind, text), kind one of
    raw (unquoted), dq (double-quoted), lit (single-quoted or escaped), sub and dqsub (the
    source of a command substitution). A heredoc body becomes its `<<` word's content."""
    tokens, pieces, raw, heredocs = [], [], [], []
    delimiter_op = None         # set after << until its delimiter word is read
    i, n = 0, len(text)

    def piece(kind, value):
        if raw:
            pieces.append(("raw", "".join(raw)))
            raw.clear()
        if kind:
            pieces.append((kind, value))

    def end_word():
        nonlocal delimiter_op
        piece(None, None)
        if pieces:
            tokens.append(("word", list(pieces)))
            if delimiter_op:
                quoted = any(kind != "raw" for kind, _ in pieces)
                heredocs.append(("".join(t for _, t in pieces), delimiter_op == "<<-", quoted, tokens[-1][1]))
                delimiter_op = None
            pieces.clear()

    while i < n:
        c = text[i]
        if c == "\\":
            if text[i + 1:i + 2] != "\n":          # backslash-newline continues the line
                piece("lit", text[i + 1:i + 2])
            i += 2
        elif c == "'" or text.startswith("$'", i):
            start = i + 1 + (c == "$")
            end = start
            while end < n and text[end] != "'":
                end += 2 if c == "$" and text[end] == "\\" else 1
            if end >= n:
                raise _ParseError("unterminated quote")
            piece("lit", text[start:end] if c == "'" else _ansi_c(text[start:end]))
            i = end + 1
        elif c == '"':
            i = _lex_double(text, i + 1, piece)
        elif c == "`" or text.startswith("$(", i) or (c in "<>" and text[i + 1:i + 2] == "(" and not (pieces or raw)):
            i, literal, commands = _substitution(text, i)
            piece("lit" if literal else None, literal)
            for command in commands:
                piece("sub", command)
        elif c == "#" and not pieces and not raw:
            i = text.find("\n", i) if "\n" in text[i:] else n      # a comment
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
                raw.clear()          # the descriptor number in 2> and 0< does not matter here
            end_word()
            tokens.append(("op", op))
            i += len(op)
            if op in ("<<", "<<-"):
                delimiter_op = op
            elif op == "\n" and heredocs:
                i = _read_heredocs(text, i, heredocs)
                heredocs.clear()
    end_word()
    return tokens


def _lex_double(text: str, i: int, piece) -> int:
    """Lex a double-quoted string from just after its quote; return the index after it."""
    buf = []

    def flush(kind=None, value=None):
        piece("dq", "".join(buf))     # always a piece, so "" is still an (empty) word
        buf.clear()
        if kind:
            piece(kind, value)
    while i < len(text):
        c = text[i]
        if c == '"':
            flush()
            return i + 1
        if c == "\\" and text[i + 1:i + 2] in ("$", "`", '"', "\\", "\n"):
            flush("lit", text[i + 1].strip("\n"))
            i += 2
        elif c == "`" or text.startswith("$(", i):
            i, literal, commands = _substitution(text, i)
            buf.append(literal or "")
            for command in commands:
                flush("dqsub", command)
        else:
            buf.append(c)
            i += 1
    raise _ParseError("unterminated double quote")


def _substitution(text: str, i: int) -> tuple[int, str | None, list[str]]:
    """At "$(", "<(", ">(" or "`": (index after it, its literal text when it is arithmetic, the
    commands it runs). Arithmetic is data, except the substitutions inside it."""
    if text[i] == "`":
        end = i + 1
        while end < len(text) and text[end] != "`":
            end += 2 if text[end] == "\\" else 1
        if end >= len(text):
            raise _ParseError("unterminated backtick")
        return end + 1, None, [re.sub(r"\\([`$\\\"])", r"\1", text[i + 1:end])]
    end = _balanced(text, i + 1)
    if text.startswith("$((", i):
        return end, text[i:end], _nested_subs(text[i + 3:end - 2])
    return end, None, [text[i + 2:end - 1]]


def _balanced(text: str, i: int) -> int:
    """text[i] is "("; return the index just after its matching ")", skipping quotes."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 1
        elif c == "'":
            i = text.find("'", i + 1)
            if i < 0:
                raise _ParseError("unterminated single quote")
        elif c == '"':
            i = _lex_double(text, i + 1, lambda kind, value: None) - 1
        elif c in "()":
            depth += 1 if c == "(" else -1
            if depth == 0:
                return i + 1
        i += 1
    raise _ParseError("unbalanced parenthesis")


def _read_heredocs(text: str, i: int, heredocs: list) -> int:
    """Consume the bodies after a line; each becomes its `<<` word's only content, and an
    unquoted body's substitutions run."""
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
    """The $( ) and backtick commands in text that quotes do not protect (heredoc bodies,
    arithmetic)."""
    found, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == "`" or text.startswith("$(", i):
            i, _, commands = _substitution(text, i)
            found += commands
        else:
            i += 1
    return found


def _ansi_c(body: str) -> str:
    """Decode bash's $'...' escapes ($'\\x72\\x6d' is "rm")."""
    def decode(match):
        code = match[1]
        if code[0] in "xu":
            return chr(int(code[1:], 16))
        if code[0] in "01234567":
            return chr(int(code, 8))
        return {"n": "\n", "t": "\t", "r": "\r", "e": "\x1b"}.get(code, code)
    return re.sub(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|[0-7]{1,3}|.)", decode, body)
