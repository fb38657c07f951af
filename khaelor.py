"""khaelor.py: the command line and composition root of KHAELOR, a terminal coding agent.

Owns: argv, config files and their precedence, session lifecycle (new, --continue, --resume),
the headless runner (-p) and its result object, `khaelor sessions`, `khaelor permissions`, the
slash-command table and the custom command files (Claude Code's `commands/*.md` prompt templates),
exit codes, and the one catch-all that turns an unexpected error into one line plus the log path.
Must not: hold agent logic (kernel.py), build requests (context.py) or run tools (tools.py).
It is the only module that imports ui, and only when the interactive UI starts.

    khaelor                      interactive, in the current directory
    khaelor -p "fix the test"    headless one-shot (see --help)
"""
import argparse
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import NamedTuple

import events
from events import KhaelorError

VERSION = "0.1.0"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
CONFIG_KEYS = {"model": str, "aux_model": str, "permissions": (list, dict), "prices": dict, "max_turns": int}


class UsageError(KhaelorError):
    """Bad flags, bad config, missing key, unknown session: exit 2 with one actionable line."""


# ---------------------------------------------------------------- config

def find_project_root(cwd: Path) -> Path:
    """The nearest ancestor holding .git, else the working directory itself."""
    for directory in (cwd, *cwd.parents):
        if (directory / ".git").exists():
            return directory
    return cwd


def read_config(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror})") from None
    try:
        config = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); fix or remove the file") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: must hold a JSON object like {{\"model\": \"...\"}}")
    for key, value in config.items():
        expected = CONFIG_KEYS.get(key)
        if expected is None:
            raise UsageError(f"{path}: unknown key {key!r}; known keys: {', '.join(CONFIG_KEYS)}")
        if not isinstance(value, expected) or isinstance(value, bool):
            names = " or ".join(t.__name__ for t in expected) if isinstance(expected, tuple) else expected.__name__
            raise UsageError(f"{path}: {key!r} must be a {names}")
    import permissions
    if isinstance(config.get("permissions"), dict):
        return config       # Claude Code's {"allow": [...], ...}: read in its syntax, never fatal
    problem = permissions.validate_config_rules(config.get("permissions", []))
    if problem:
        raise UsageError(f"{path}: {problem}")
    return config


def load_settings(args, home: Path, project_root: Path) -> dict:
    """Precedence: flags → project config → user config → env → defaults."""
    from model import DEFAULT_AUX_MODEL, DEFAULT_MODEL
    user_path, project_path = home / "config.json", project_root / ".khaelor" / "config.json"
    user, project = read_config(user_path), read_config(project_path)
    merged = {"model": DEFAULT_MODEL, "aux_model": DEFAULT_AUX_MODEL, "prices": {}, "max_turns": None}
    merged.update({k: v for k, v in user.items() if k != "permissions"})
    merged.update({k: v for k, v in project.items() if k != "permissions"})
    for key in ("model", "aux_model", "max_turns"):
        if getattr(args, key, None) is not None:
            merged[key] = getattr(args, key)
    merged["model_flag"] = getattr(args, "model", None)
    merged["extra_layers"] = flag_layers(args, project_root)
    merged["layers"] = permission_layers(home, project_root, merged["extra_layers"])
    return merged


# ---------------------------------------------------------------- trust: where permission rules come from

def permission_layers(home: Path, project_root: Path, extra: tuple = ()) -> list:
    """Rule layers in evaluation order (later wins): the user's own files (Claude Code's
    ~/.claude/settings.json, then KHAELOR's), the user's saved "always" answers for this project,
    then the project's own files, which may always tighten but grant only once the user trusted them
    (`khaelor trust`); any change to one withdraws its trust. `extra`: this run's flags."""
    import permissions
    layers = [claude_settings_layer(Path.home() / ".claude" / "settings.json", project_root, "user", True)]
    for path in user_config_paths(home):
        layers.append(config_layer(path, project_root, "user", True))
    grants = grants_path(home, project_root)
    layers.append(permissions.Layer(str(grants), read_config(grants)))
    project = project_root / ".khaelor" / "config.json"
    layers.append(config_layer(project, project_root, "project", is_trusted(home, project)))
    for path in claude_project_files(project_root):
        layers.append(claude_settings_layer(path, project_root, "project", is_trusted(home, path)))
    return [*layers, *extra]


def claude_project_files(project_root: Path) -> list[Path]:
    return [project_root / ".claude" / "settings.json", project_root / ".claude" / "settings.local.json"]


def config_layer(path: Path, project_root: Path, kind: str, trusted: bool):
    """A KHAELOR config file's rules; a Claude-style permissions block pasted into it
    ({"allow": [...], "deny": [...]}) is read in Claude Code's syntax."""
    import permissions
    config = read_config(path)
    text = path.read_text(encoding="utf-8", errors="replace") if config else ""
    if isinstance(config.get("permissions"), dict):
        layer = permissions.Layer(str(path), {}, kind, trusted, claude=True, text=text)
        return permissions.claude_rules(layer, config["permissions"], os.path.realpath(project_root))
    return permissions.Layer(str(path), config, kind, trusted, text=text)


def claude_settings_layer(path: Path, project_root: Path, kind: str, trusted: bool):
    import permissions
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return permissions.claude_layer(str(path), text, project_root, kind, trusted)


def user_config_paths(home: Path) -> list[Path]:
    """~/.khaelor/config.json and $KHAELOR_HOME/config.json (one file when they are the same)."""
    paths = [Path.home() / ".khaelor" / "config.json", home / "config.json"]
    if os.path.realpath(paths[0]) == os.path.realpath(paths[1]):
        return paths[1:]
    return paths


def grants_path(home: Path, project_root: Path) -> Path:
    """Where "always" answers for this project are kept: the user's state, never the repository."""
    return home / "grants" / f"{events.sessions_dir(home, project_root).name}.json"


def trust_records(home: Path) -> dict:
    try:
        records = json.loads((home / "trust.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def trust_key(path: Path) -> str | None:
    """What a trust record is kept under: the file's own place in this project. A permission file
    reached through a symlink (the file or a folder on its way) can never be trusted: it could be
    another project's trusted file, or change without this project changing."""
    place = Path(os.path.realpath(path.parent.parent)) / path.parent.name / path.name
    if os.path.realpath(path) != str(place):
        return None
    return str(place)


def is_trusted(home: Path, path: Path) -> bool:
    """Trusted: the user ran `khaelor trust` on exactly these bytes, in this place."""
    import permissions
    key = trust_key(path)
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return key is not None and trust_records(home).get(key) == permissions.content_hash(data)


def trust_notice(layers: list) -> str | None:
    """One line when a repository's file grants something that is ignored until trusted."""
    import permissions
    ignored = permissions.untrusted_grants(layers)
    if not ignored:
        return None
    sources = sorted({rule.source for rule in ignored})
    return (f"{', '.join(sources)} would grant {len(ignored)} permission(s); they are ignored until you review "
            "and trust them with `khaelor trust`")


def start_notices(settings: dict) -> list[str]:
    """Said once when a session starts: grants waiting for trust, and a missing OS sandbox."""
    import sandbox
    notices = [trust_notice(settings["layers"]), sandbox.notice()]
    for layer in settings.get("extra_layers", ()):       # a flag's rule that maps onto nothing
        notices += [f"{layer.source} {rule!r} is ignored: {why}" for _, rule, why in layer.ignored]
    return [n for n in notices if n]


def cmd_trust(argv: list, home: Path, project_root: Path) -> int:
    import permissions
    parser = argparse.ArgumentParser(prog="khaelor trust", description="Review the permissions this project's "
                                     "own files (.khaelor/config.json, .claude/settings*.json) grant, and trust "
                                     "exactly these versions of them.")
    parser.add_argument("--revoke", action="store_true", help="withdraw the trust")
    args = parser.parse_args(argv)
    files = [project_root / ".khaelor" / "config.json", *claude_project_files(project_root)]
    files = [path for path in files if path.is_file()]
    records = trust_records(home)
    if not files:
        raise UsageError(f"nothing to trust: {project_root} has no .khaelor/config.json or .claude/settings*.json")
    for path in files:
        key = trust_key(path)
        if key is None:
            print(f"{path}: a symlink; a permission file reached through a link is never trusted")
            continue
        if args.revoke:
            records.pop(key, None)
            print(f"{path}: no longer trusted; its rules can only tighten")
            continue
        data = path.read_bytes()
        if path.parent.name == ".claude":
            layer = claude_settings_layer(path, project_root, "project", False)
        else:
            layer = config_layer(path, project_root, "project", False)
        grants = permissions.untrusted_grants([layer])
        print(f"{path} (sha256 {permissions.content_hash(data)[:16]}…)")
        if grants:
            print("  trusting it grants:")
        else:
            print("  it grants nothing (its ask and deny rules apply whether trusted or not)")
        for rule in grants:
            print(f"    allow {rule.capability} {rule.pattern!r}  ({rule.source})")
        records[key] = permissions.content_hash(data)
    write_json_atomic(home / "trust.json", records)
    if not args.revoke:
        print("trusted; any change to a file withdraws its trust until you run `khaelor trust` again")
    return EXIT_OK


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------- sessions

def open_session(args, home: Path, project_root: Path):
    """A new session, the newest one (--continue) or one named by an id prefix (--resume)."""
    directory = events.sessions_dir(home, project_root)
    files = events.list_session_files(directory)
    if args.resume:
        matches = [f for f in files if f.stem.startswith(args.resume)]
        if not matches:
            raise UsageError(f"no session {args.resume!r} in this project; `khaelor sessions` lists them")
        if len(matches) > 1:
            raise UsageError(f"{args.resume!r} matches {len(matches)} sessions; give more of the id")
        return events.SessionStore.open(matches[0])
    if args.continue_:
        # The newest session that holds a conversation: one opened and quit without a word is not it.
        # One that cannot be summarised (unreadable, from a newer khaelor) is opened, to say why.
        newest = next((path for path in reversed(files)
                       if (summary_of(path) or {"n_messages": 1}).get("n_messages")), None)
        if newest is None:
            raise UsageError("no earlier session in this project to continue; run without -c to start one")
        return events.SessionStore.open(newest)
    return events.SessionStore.create(directory)


def session_summary(store) -> dict:
    """What a listing shows; cached in the session's .meta.json."""
    from model import price_of
    state = store.state
    totals = state.usage
    costs = [price_of(m, u) for m, u in totals.items()]
    return {"id": store.session_id, "title": state.title,
            "created": state.created_ts, "updated": state.updated_ts,
            "tokens": sum(sum(u.values()) for u in totals.values()),
            "cost": None if None in costs else sum(costs), "model": state.model,
            "branch": state.branch, "n_messages": len(state.user_texts), "usage": totals}


def session_cost(summary: dict, prices: dict) -> float | None:
    """A session's cost by this run's price table: config `prices` override the defaults, so the
    cost a cache recorded with the default table is not the one to show."""
    from model import price_of
    costs = [price_of(model, usage, prices) for model, usage in summary["usage"].items()]
    return None if None in costs else sum(costs)


def config_prices(home: Path, project_root: Path) -> dict:
    """The `prices` of the user's and the project's config.json (the project's win)."""
    user = read_config(home / "config.json").get("prices") or {}
    project = read_config(project_root / ".khaelor" / "config.json").get("prices") or {}
    return {**user, **project}


def summary_of(path: Path) -> dict | None:
    """A session's summary from its .meta.json cache; a missing or stale cache (or one written before
    summaries counted messages) is rebuilt from the log, read-only: another khaelor may be writing it.
    None: the log vanished, is unreadable or is from a newer khaelor."""
    meta = events.read_meta(path)
    if meta is None or "usage" not in meta:
        try:
            stat = os.stat(path)
            meta = session_summary(events.SessionStore.open(path, read_only=True))
        except (OSError, KhaelorError):
            return None
        events.write_meta(path, meta, stat)
    return meta


def list_sessions(home: Path, project_root: Path) -> list[dict]:
    """Summaries of this project's sessions that hold a conversation, newest first. Sessions with no
    user message (opened and quit, by older versions too) are left out."""
    summaries = []
    for path in reversed(events.list_session_files(events.sessions_dir(home, project_root))):
        meta = summary_of(path)
        if meta is not None and meta["n_messages"]:
            summaries.append(meta)
    return summaries


def close_session(store) -> None:
    """Close the log and refresh its .meta.json, so listings need not read the log again."""
    store.close()
    if store.events:
        events.write_meta(store.path, session_summary(store))


def age(ts_ms: int) -> str:
    import time
    seconds = max(0.0, time.time() - ts_ms / 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return "just now"


# Escape sequences (CSI, OSC, DCS/PM/APC/SOS strings, two-byte ESC forms), other C0/C1 controls,
# and the bidirectional overrides that make text read differently from what it is.
CONTROL_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                              r"|\x1b[@-Z\\-_ -/]*[0-~]?|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

TERMINATED_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
                                 r"|\x1b[ -/]*(?![\[\]PX^_])[0-~]")


def for_terminal(text: str, stream) -> str:
    """Model text and titles reach a terminal without the bytes that would drive it: a model or a
    hostile file must not set the window title, write the clipboard (OSC 52) or move the cursor."""
    if not stream.isatty():
        return text
    return CONTROL_SEQUENCE.sub("", text)


def cmd_sessions(home: Path, project_root: Path) -> int:
    sessions = list_sessions(home, project_root)
    if not sessions:
        print("no sessions in this project yet")
        return EXIT_OK
    prices = config_prices(home, project_root)
    print(f"{'id':<30} {'updated':>9} {'tokens':>9} {'cost':>8}  title")
    for s in sessions:
        dollars = session_cost(s, prices)
        cost = "?" if dollars is None else f"${dollars:.4f}"
        branch = f"  [{s['branch']}]" if s.get("branch") else ""
        title = for_terminal(s["title"] or "(untitled)", sys.stdout)
        print(f"{s['id']:<30} {age(s['updated']) if s['updated'] else '-':>9} {s['tokens']:>9} {cost:>8}  "
              f"{title}{branch}")
    return EXIT_OK


def cmd_permissions(argv: list, home: Path, project_root: Path) -> int:
    import permissions
    parser = argparse.ArgumentParser(prog="khaelor permissions", description="Show or test the permission policy.")
    sub = parser.add_subparsers(dest="action")
    check = sub.add_parser("check", help="what would happen to a call, without running it")
    check.add_argument("--json", action="store_true")
    target = check.add_mutually_exclusive_group(required=True)
    target.add_argument("--bash", metavar="COMMAND")
    target.add_argument("--read", metavar="PATH")
    target.add_argument("--write", metavar="PATH")
    args = parser.parse_args(argv)
    import sandbox
    layers = permission_layers(home, project_root)
    rules = permissions.load_rules(layers)
    sandboxed = sandbox.probe()[0] > 0
    if args.action != "check":
        print(f"sandbox: {sandbox.status()}")
        for layer in layers:
            trust = ""
            if layer.kind == "project":
                trust = "  (trusted)" if layer.trusted else "  (untrusted: tightens only)"
            print(f"layer: {layer.kind:<7} {layer.source}{trust}")
        print("\n".join(permissions.describe_rules(rules)))
        for rule in permissions.untrusted_grants(layers):
            print(f"ignored  allow  {rule.capability}  {rule.pattern}  {rule.source} (untrusted: run `khaelor trust`)")
        for layer in layers:
            for where, rule, why in layer.ignored:
                print(f"ignored  {rule}  {where} ({why})")
        return EXIT_OK
    kind = "write"
    if args.bash is not None:
        kind = "bash"
    elif args.read is not None:
        kind = "read"
    result = permissions.check(kind, args.bash or args.read or args.write, project_root, rules, sandboxed=sandboxed)
    if args.json:
        print(json.dumps(result))
        return EXIT_OK
    print(f"{result['decision']}  ({result['capability']}; decided by: {result['layer']}; {result['reason']})")
    if result["not_read_only"]:
        print(f"not provably read-only: {result['not_read_only']}")
    if result["destructive"]:
        print(f"destroys work: {result['destructive']}")
    if result["suggestion"]:
        print(f"always-allow would save: {result['suggestion']}")
    return EXIT_OK


# ---------------------------------------------------------------- custom slash commands (Claude Code's command files)

MAX_COMMAND_FILES = 500         # per directory: a huge tree must not slow start-up
COMMAND_FIELDS = ("description", "argument-hint", "model", "allowed-tools")   # front matter read; the rest is ignored
COMMAND_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(?::[A-Za-z0-9][\w.-]*)*$")
PLACEHOLDER = re.compile(r"\$(ARGUMENTS|[1-9])(?!\d)")


class CustomCommand(NamedTuple):
    name: str               # "/fixissue"; a subdirectory gives "/frontend:component"
    path: Path              # the Markdown file
    source: str             # where it came from, as /help shows it: "project .claude/commands"
    template: str           # the body after the front matter: $ARGUMENTS and $1…$9 are filled in
    description: str        # front matter, else the body's first line
    argument_hint: str      # front matter: "[issue-number]"
    model: str              # front matter: the model for this command's turn; "" for the session's
    allowed_tools: str      # front matter: shown, never granted (a command file is a prompt only)


def command_dirs(home: Path, project_root: Path) -> list[tuple[Path, str, bool]]:
    """(directory, source label, in the repository) in precedence order: a later one wins a name,
    so the project's commands override the user's, as in Claude Code."""
    return [(Path.home() / ".claude" / "commands", "user ~/.claude/commands", False),
            (home / "commands", "user $KHAELOR_HOME/commands", False),
            (project_root / ".claude" / "commands", "project .claude/commands", True),
            (project_root / ".khaelor" / "commands", "project .khaelor/commands", True)]


def load_commands(home: Path, project_root: Path) -> dict[str, CustomCommand]:
    """Every command file by name. Built-in commands keep their names; a repository's command file
    that resolves outside the project (a symlink) is not read, as with instruction files."""
    root = project_root.resolve()
    commands = {}
    for directory, source, in_repository in command_dirs(home, project_root):
        for path in command_files(directory):
            resolved = path.resolve()
            if in_repository and not (resolved == root or root in resolved.parents):
                continue
            name = "/" + ":".join(path.relative_to(directory).with_suffix("").parts)
            if name in COMMANDS or not COMMAND_NAME.match(name[1:]):
                continue
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            commands[name] = parse_command(name, path, source, text)
    return commands


def command_files(directory: Path) -> list[Path]:
    found = []
    for folder, subfolders, names in os.walk(directory):     # symlinked folders are not followed
        subfolders.sort()
        found += [Path(folder) / name for name in sorted(names) if name.endswith(".md")]
        if len(found) >= MAX_COMMAND_FILES:
            break
    return found[:MAX_COMMAND_FILES]


def parse_command(name: str, path: Path, source: str, text: str) -> CustomCommand:
    fields, body = front_matter(text)
    first_line = next((line.strip().lstrip("#").strip() for line in body.splitlines() if line.strip()), "")
    return CustomCommand(name, path, source, body, fields.get("description") or first_line[:80],
                         fields.get("argument-hint", ""), fields.get("model", ""), fields.get("allowed-tools", ""))


def front_matter(text: str) -> tuple[dict, str]:
    """The `---` block at the top of a command file, as the tiny YAML subset command files use:
    one `key: value` per line, the value plain or quoted. A list such as `[issue-number]` stays
    text (it is shown, not interpreted). No closing `---`: it is all body."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n")
    lines = text.split("\n")
    if lines[0].rstrip() != "---":
        return {}, text
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "...")), None)
    if end is None:
        return {}, text
    fields = {}
    for line in lines[1:end]:
        key, colon, value = line.partition(":")
        if colon and not line[:1].isspace() and key.strip() in COMMAND_FIELDS:
            fields[key.strip()] = yaml_scalar(value.strip())
    return fields, "\n".join(lines[end + 1:]).lstrip("\n")


def yaml_scalar(value: str) -> str:
    """'it''s' → it's, "a \\"b\\"" → a "b", plain # comment → plain (a comment may follow quotes too)."""
    single = re.match(r"'((?:[^']|'')*)'\s*(?:#.*)?$", value)
    if single:
        return single[1].replace("''", "'")
    double = re.match(r'"((?:[^"\\]|\\.)*)"\s*(?:#.*)?$', value)
    if double:
        try:
            return json.loads(f'"{double[1]}"')
        except ValueError:
            return double[1]
    return re.sub(r"\s+#.*$", "", value)


def expand_command(command: CustomCommand, arguments: str) -> str:
    """The prompt a command sends. $ARGUMENTS is everything after the name, $1…$9 its words (quotes
    group words, as in a shell); one pass, so an argument holding "$1" stays as typed. A template
    with no placeholder gets the arguments after it, so they are never lost."""
    import shlex
    try:
        words = shlex.split(arguments)
    except ValueError:          # an unbalanced quote: plain words
        words = arguments.split()

    def fill(match):
        if match.group(1) == "ARGUMENTS":
            return arguments
        index = int(match.group(1)) - 1
        return words[index] if index < len(words) else ""
    body = command.template.strip()
    if arguments and not PLACEHOLDER.search(body):
        return f"{body}\n\nARGUMENTS: {arguments}"
    return PLACEHOLDER.sub(fill, body).strip()


def match_command(text: str, commands: dict) -> tuple[CustomCommand | None, str]:
    """("/fixissue 123", commands) → (the command, "123"); (None, "") for anything else."""
    words = text.strip().split(None, 1)     # the arguments may start on the next line
    command = commands.get(words[0]) if words else None
    if command is None:
        return None, ""
    return command, words[1].strip() if len(words) == 2 else ""


def expand_headless(prompt: str, settings: dict, home: Path, project_root: Path) -> str:
    """`khaelor -p "/fixissue 123"`: the template, filled in, is what is sent. Its `model` applies to
    the run unless --model was given."""
    if not prompt.lstrip().startswith("/"):
        return prompt
    command, arguments = match_command(prompt, load_commands(home, project_root))
    if command is None:
        return prompt
    if command.model and settings.get("model_flag") is None:
        settings["model"] = command.model
    return expand_command(command, arguments)


def describe_command(command: CustomCommand) -> str:
    """One line for /help and the / menu: hint, description, and where it came from."""
    text = " ".join(part for part in (command.argument_hint, command.description) if part)
    return f"{text} ({command.source})".strip()


# ---------------------------------------------------------------- headless

def help_epilog() -> str:
    """Subcommands, the interactive keys and the instruction files (imported only for --help)."""
    import context
    import ui
    keys = "\n".join(f"  {key:<30} {what}" for key, what in ui.KEY_HELP)
    return ("subcommands:\n  khaelor sessions               list this project's sessions\n"
            "  khaelor permissions [check]    show or test the permission policy\n\n"
            f"interactive keys:\n{keys}\n\ninstruction files: ~/.claude/CLAUDE.md, the first of "
            f"{', '.join(context.INSTRUCTION_FILES)} in KHAELOR_HOME (~/.khaelor), the nearest one from the "
            "working directory up to the project root, then the nearest CLAUDE.local.md; @path imports are followed.\n"
            "custom commands: *.md in .khaelor/commands, .claude/commands, KHAELOR_HOME/commands and "
            "~/.claude/commands (khaelor -p \"/name args\" runs one headless).")


def parse_args(argv: list):
    wants_help = any(arg in ("-h", "--help") for arg in argv)
    parser = argparse.ArgumentParser(prog="khaelor", description="A terminal coding agent for Claude models.",
                                     epilog=help_epilog() if wants_help else None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", "--print", dest="prompt", metavar="PROMPT",
                        help="run one task headless and exit ('-' reads the prompt from stdin)")
    parser.add_argument("--output-format", choices=("text", "json", "stream-json"), default="text")
    parser.add_argument("--yes", action="store_true", help="approve every ask (the hardline floor still refuses)")
    parser.add_argument("-c", "--continue", dest="continue_", action="store_true", help="continue the newest session")
    parser.add_argument("-r", "--resume", metavar="ID", help="resume a session by id (a unique prefix is enough)")
    parser.add_argument("--model", metavar="ID")
    parser.add_argument("--aux-model", dest="aux_model", metavar="ID")
    parser.add_argument("--max-turns", dest="max_turns", type=int, metavar="N")
    # Claude Code's flags for scripts, spelled as it spells them (camelCase and kebab-case both work)
    parser.add_argument("--append-system-prompt", dest="append_system_prompt", metavar="TEXT", default="",
                        help="add TEXT to the system prompt, as its own tier, for this run")
    parser.add_argument("--allowedTools", "--allowed-tools", dest="allowed_tools", nargs="+", action="extend",
                        default=[], metavar="RULE", help="allow these Claude Code rules for this run, e.g. "
                        "\"Bash(git log:*)\" Read (space- or comma-separated; the hardline floor still refuses)")
    parser.add_argument("--disallowedTools", "--disallowed-tools", dest="disallowed_tools", nargs="+",
                        action="extend", default=[], metavar="RULE",
                        help="deny these Claude Code rules for this run, even under --yes")
    import permissions      # every run reads its rules anyway
    parser.add_argument("--permission-mode", dest="permission_mode", choices=permissions.MODES, default="default",
                        help="plan: only tools that read run; acceptEdits: project files are written without asking")
    parser.add_argument("--version", action="version", version=f"khaelor {VERSION}")
    return parser.parse_args(argv)


def split_tool_rules(values: list[str]) -> list[str]:
    """`"Bash(git log:*)" "Read,Edit"` → ["Bash(git log:*)", "Read", "Edit"]: Claude Code's lists are
    separated by spaces or commas, except inside a rule's parentheses."""
    rules = []
    for value in values:
        depth, current = 0, ""
        for ch in value:
            if ch == "(":
                depth += 1
            elif ch == ")" and depth > 0:
                depth -= 1
            if depth == 0 and (ch == "," or ch.isspace()):
                rules += [current] if current else []
                current = ""
            else:
                current += ch
        rules += [current] if current else []
    return rules


def flag_layers(args, project_root: Path) -> tuple:
    """--allowedTools and --disallowedTools as Claude Code rule layers, for this run only. They are the
    user's own (typed by the user), so they grant; as with Claude Code's files a deny outranks every
    allow, and the hardline floor is beneath them all."""
    import permissions
    layers = []
    for flag, action, values in (("--allowedTools", "allow", getattr(args, "allowed_tools", [])),
                                 ("--disallowedTools", "deny", getattr(args, "disallowed_tools", []))):
        rules = split_tool_rules(values or [])
        if rules:
            layer = permissions.Layer(flag, {}, "user", True, claude=True)
            layers.append(permissions.claude_rules(layer, {action: rules}, os.path.realpath(project_root)))
    return tuple(layers)


def build_kernel(args, settings, store, bus, home, project_root, ask, client=None):
    """Wire the subsystems for one session (the modules are imported here, off the cold path).
    The toolbox is the session's own (what the model read, its edits, its processes), taken up
    from the log on resume; an interactive run keeps one client across /new and /resume."""
    import context
    import kernel
    import permissions
    import tools

    def grant(rule: dict) -> None:
        path = grants_path(home, project_root)
        write_json_atomic(path, permissions.add_grant(read_config(path), rule))
        kernel_.rules = permissions.load_rules(permission_layers(home, project_root, settings["extra_layers"]))

    toolbox = tools.Toolbox(tools.Workspace(project_root), home, bus.emit)
    toolbox.resume(store.state)
    mode = getattr(args, "permission_mode", "default")
    ctx = context.Context(project_root=project_root, cwd=Path.cwd(), home=home, model=current_model(store, settings),
                          aux_model=settings["aux_model"], tool_schemas=toolbox.schemas, workspace=toolbox.workspace,
                          user_home=Path.home(), is_secret=permissions.is_secret_name, plan_mode=mode == "plan",
                          append_system=getattr(args, "append_system_prompt", ""))
    client = client or new_client(lambda text: bus.emit("Status", text=text))
    kernel_ = kernel.Kernel(bus=bus, model=client, toolbox=toolbox, ctx=ctx,
                            rules=permissions.load_rules(settings["layers"]), project_root=project_root,
                            ask=ask, grant=grant, yes=args.yes, max_turns=settings["max_turns"], permission_mode=mode)
    return kernel_


def new_client(on_status):
    import model
    return model.ModelClient(api_key=os.environ.get("ANTHROPIC_API_KEY") or None,
                             auth_token=os.environ.get("ANTHROPIC_AUTH_TOKEN") or None, on_status=on_status,
                             read_timeout=env_seconds("KHAELOR_READ_TIMEOUT", model.READ_TIMEOUT_S))


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment (KHAELOR_READ_TIMEOUT=30), else `default`."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise UsageError(f"{name}={value!r} is not a positive number of seconds")
    return seconds


def current_model(store, settings) -> str:
    """--model wins; otherwise the newest /model choice recorded in the session, else the config."""
    chosen = store.state.chosen_model
    if chosen and settings.get("model_flag") is None:
        return chosen
    return settings["model"]


async def run_headless(args, settings, store, home, project_root) -> int:
    bus = events.Bus(store)
    if args.output_format == "stream-json":
        bus.subscribe(lambda e: e["type"] in events.DURABLE and print(json.dumps(e, ensure_ascii=False), flush=True))
    bus.subscribe(lambda e: e["type"] == "Status" and print(f"khaelor: {e['text']}", file=sys.stderr))
    args.streamed = args.output_format == "text" and sys.stdout.isatty()
    if args.streamed:
        bus.subscribe(StreamedAnswer())
    for notice in start_notices(settings):
        print(f"khaelor: {notice}", file=sys.stderr)

    async def ask(request: dict):
        if request["capability"] == events.LOOP_CAPABILITY:
            return "deny", ""       # a doom loop stops the run; TaskFailed says why
        # Silence is not consent: with nobody to answer, an ask is a denial.
        print(f"khaelor: denied {request['descriptor']!r} ({request['capability']}); nobody to ask in -p mode. "
              "Pass --yes (it does not cover what destroys work in the repository), or allow it with "
              "`khaelor permissions`", file=sys.stderr)
        return "deny", ""

    kernel_ = build_kernel(args, settings, store, bus, home, project_root, ask)
    resumed = bool(store.events)
    if not resumed:
        bus.emit("SessionCreated", cwd=str(Path.cwd()), project_root=str(project_root), model=settings["model"],
                 aux_model=settings["aux_model"], version=VERSION)
    kernel_.repair()
    try:
        await kernel_.record_baseline("resume" if resumed else "session start")
        kernel_.submit(args.prompt)
        step = await kernel_.run()
    finally:
        await kernel_.toolbox.close()
        await kernel_.model.close()
        close_session(store)
    return report(args, store, step, settings["prices"])


class StreamedAnswer:
    """-p with the answer going to a terminal: the text appears as it is written, as it does in the
    interactive UI (a pipe or file gets only the final answer, once, at the end). An escape sequence
    split across two deltas is held back until it ends, so it is stripped whole."""

    def __init__(self):
        self.pending = ""       # the start of a control sequence the next delta may finish

    def __call__(self, event: dict) -> None:
        if event["type"] == "TextDelta":
            sys.stdout.write(self.clean(event["text"]))
            sys.stdout.flush()
        elif event["type"] == "ModelTextBlockCompleted" and event["text"]:
            sys.stdout.write(for_terminal(self.pending, sys.stdout) + "\n\n")
            self.pending = ""
        elif event["type"] == "ModelRequestFailed" and event.get("retrying"):
            self.pending = ""
            sys.stdout.write("\n[the reply broke off; it is being written again]\n\n")

    def clean(self, text: str) -> str:
        text, self.pending = self.pending + text, ""
        start = text.rfind("\x1b")
        if start >= 0 and not TERMINATED_SEQUENCE.match(text, start) and len(text) - start < 4096:
            text, self.pending = text[:start], text[start:]
        return for_terminal(text, sys.stdout)


RESULT_SUBTYPES = {"done": "success", "max-turns": "error_max_turns"}   # any other end: error_during_execution


def result_object(args, store, step: str, prices: dict) -> dict:
    """What `--output-format json` prints, and `stream-json` ends with: Claude Code's result fields
    (type, subtype, result, session_id, is_error, num_turns, duration_ms, total_cost_usd, usage in
    its key names) alongside KHAELOR's own (error, cost_usd, usage_by_model in KHAELOR's key names).
    A cost is null when a model has no known price: never guessed."""
    import time
    state = store.state
    failed = step != "done"
    cost = session_cost(session_summary(store), prices)
    totals = {key: sum(usage[key] for usage in state.usage.values()) for key in events.USAGE_KEYS}
    usage = {"input_tokens": totals["input_tokens"], "cache_creation_input_tokens": totals["cache_write_tokens"],
             "cache_read_input_tokens": totals["cache_read_tokens"], "output_tokens": totals["output_tokens"]}
    started = getattr(args, "started", None) or time.monotonic()
    return {"type": "result", "subtype": RESULT_SUBTYPES.get(step, "error_during_execution"),
            "is_error": failed, "result": state.answer or "", "session_id": store.session_id,
            "num_turns": state.responses_in_turn, "duration_ms": round((time.monotonic() - started) * 1000),
            "total_cost_usd": cost, "usage": usage,
            "error": state.failure_reason if failed else None, "cost_usd": cost, "usage_by_model": state.usage}


def report(args, store, step: str, prices: dict) -> int:
    state = store.state
    failed = step != "done"
    reason = state.failure_reason if failed else None
    if args.output_format in ("json", "stream-json"):
        print(json.dumps(result_object(args, store, step, prices), ensure_ascii=False), flush=True)
    elif args.output_format == "text" and state.answer and not getattr(args, "streamed", False):
        print(for_terminal(state.answer, sys.stdout))
    if failed:
        print(f"khaelor: {reason}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


def read_prompt(args) -> str:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise UsageError("the prompt is empty; pass -p \"what to do\" or pipe it with -p -")
    return prompt


def require_api_key() -> None:
    if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
        raise UsageError("ANTHROPIC_API_KEY is not set; export it (console.anthropic.com → API keys) and run again")


# ---------------------------------------------------------------- interactive

# The user's own `!` commands run as the user would run them: the sandbox holds what the model runs.
USER_SHELL = {"write": True, "network": True, "paths": [], "secrets": True, "hide": [], "unconfined": True}


class Session:
    """The interactive controller the UI drives (ui.Controller): one kernel at a time, a turn as a
    task, permission questions as futures the panel resolves, and the slash-command table."""

    def __init__(self, args, settings, home: Path, project_root: Path):
        self.args, self.settings, self.home, self.project_root = args, settings, home, project_root
        self.subscribers, self.turn, self.answers = [], None, {}
        self.client = new_client(lambda text: self.bus.emit("Status", text=text))
        self.command_names = sorted(COMMANDS)
        self.command_descriptions = {name: f"{usage} {text}".strip() for name, (_, usage, text) in COMMANDS.items()}
        self.custom = load_commands(home, project_root)     # command files, read once at start as Claude Code does
        self.command_names = sorted([*COMMANDS, *self.custom])
        self.command_descriptions.update({name: describe_command(c) for name, c in self.custom.items()})
        self._files, self.closed, self.baseline = None, False, None
        self.shell = None        # the task of a running `!` command
        self._files_at = 0.0     # time.monotonic() when _files was listed
        self._listing = None     # the listing running in a thread, if one is
        self._mention_prefix = "\0"    # the query of the last @ completion
        self._status_key, self._status = None, {}

    def attach(self, store) -> None:
        """Make `store` the current session (start, /new, /resume); UI subscribers carry over. A
        session that died with tool calls waiting (say, a permission question nobody answered)
        goes on at once, so the question is asked again."""
        import asyncio
        resumed = bool(store.events)
        self.store, self.bus = store, events.Bus(store)
        self.bus.subscribe(lambda event: [fn(event) for fn in list(self.subscribers)])
        self.kernel = build_kernel(self.args, self.settings, store, self.bus, self.home, self.project_root,
                                   self.ask, client=self.client)
        self.kernel.repair()
        loop = asyncio.get_running_loop()
        self.baseline = loop.create_task(self.kernel.record_baseline("resume")) if resumed else None
        state = store.state
        if state.turn_open and state.pending_tools:
            self.start_turn()

    async def detach(self) -> None:
        """Leave the current session (/new, /resume, quit): end its turn, then close its log."""
        import asyncio
        self.interrupt()
        if self.turn is not None:
            await asyncio.gather(self.turn, return_exceptions=True)
        if self.baseline is not None:
            self.baseline.cancel()
        await self.toolbox.close()      # its processes end with it, ProcessExited in its own log
        close_session(self.store)

    @property
    def toolbox(self):
        """The current session's tools and their state."""
        return self.kernel.toolbox

    # -- ui.Controller
    @property
    def busy(self) -> bool:
        """A turn or a `!` command runs: the UI shows a spinner, and Esc stops it."""
        return self.working or (self.shell is not None and not self.shell.done())

    @property
    def working(self) -> bool:
        """A turn runs: the kernel alone knows (it answers submit with steering then)."""
        return self.kernel.busy

    def subscribe(self, fn):
        self.subscribers.append(fn)
        return lambda: self.subscribers.remove(fn)

    def begin(self) -> None:
        """A new session's log is created by its first message, so opening and quitting leaves none."""
        import asyncio
        if self.store.events:
            return
        self.bus.emit("SessionCreated", cwd=str(Path.cwd()), project_root=str(self.project_root),
                      model=self.settings["model"], aux_model=self.settings["aux_model"], version=VERSION)
        if self.kernel.ctx.model != self.settings["model"]:     # a /model before the first message
            self.bus.emit("ModelChanged", model=self.kernel.ctx.model)
        self.baseline = asyncio.get_running_loop().create_task(self.kernel.record_baseline("session start"))

    def submit(self, text: str):
        command, arguments = match_command(text, self.custom)
        if command is not None:     # a command file: its template, filled in, is the message
            text = expand_command(command, arguments)
        self.begin()
        self.kernel.submit(text)
        if not self.working:
            self.start_turn()
            if command is not None and command.model:
                self.model_for_turn(command.model)

    def model_for_turn(self, name: str) -> None:
        """A command file's `model:` holds for the turn it starts; then the session's model is back."""
        ctx, previous = self.kernel.ctx, self.kernel.ctx.model
        ctx.model = name
        self.turn.add_done_callback(lambda _: setattr(ctx, "model", previous))

    def start_turn(self) -> None:
        """The turn as a task; Kernel.run supervises it (any error becomes TaskFailed)."""
        self.turn = self.kernel.start()
        self.turn.add_done_callback(self.turn_ended)

    def turn_ended(self, turn) -> None:
        """Only a log that can no longer be written gets past the kernel: say so in one line."""
        if not turn.cancelled() and turn.exception() is not None:
            self.bus.emit("Status", text=f"error: {turn.exception()}")

    def interrupt(self) -> None:
        if self.working:
            self.turn.cancel()
        if self.shell is not None:
            self.shell.cancel()

    async def ask(self, request: dict):
        import asyncio
        future = asyncio.get_running_loop().create_future()
        self.answers[request["tool_use_id"]] = future
        try:
            return await future
        finally:
            self.answers.pop(request["tool_use_id"], None)

    def answer_permission(self, tool_use_id: str, choice: str, feedback: str) -> None:
        future = self.answers.get(tool_use_id)
        if future is not None and not future.done():
            future.set_result((choice, feedback))

    async def run_shell(self, command: str):
        """`!cmd`: the user's own command, run now (no question: the user typed it) and shown as it runs;
        Esc stops it. It and its output join the conversation (UserShellRan), so the next request
        carries them as user-side context."""
        import asyncio
        if self.working or self.shell is not None:
            return "khaelor is working; `!` commands run between turns (Esc interrupts the turn)"
        self.begin()
        self.shell = asyncio.current_task()
        streamed = []       # what it printed, kept if it is stopped

        def collect(event: dict) -> None:
            if event["type"] == "ToolOutput" and event.get("tool_use_id") == events.USER_SHELL_ID:
                streamed.append(event["text"])
        unsubscribe = self.bus.subscribe(collect)
        try:
            result = await self.toolbox.run("bash", {"command": command}, events.USER_SHELL_ID, confine=USER_SHELL)
        except asyncio.CancelledError:
            self.bus.emit("UserShellRan", command=command, output="".join(streamed)[-STOPPED_OUTPUT_CHARS:],
                          exit_code=None, stopped=True)
            raise
        finally:
            self.shell = None
            unsubscribe()
        meta = result.meta
        self.bus.emit("UserShellRan", command=command, output=result.text, exit_code=meta.get("exit_code"),
                      duration_ms=meta.get("duration_ms"), stopped=False)

    async def run_command(self, line: str):
        name, _, rest = line.strip().partition(" ")
        entry = COMMANDS.get(name)
        if entry is None and name in self.custom:
            self.submit(line)
            return ""
        if entry is None:
            return f"unknown command {name}; /help lists them"
        return await entry[0](self, rest.strip())

    def mention_candidates(self, prefix: str) -> list:
        """Files and their folders (`src/`) for @ completion, as last listed. Listing runs in a
        thread, never on the event loop (git in a big repository takes a while): it starts at
        the first mention, and again when a new mention starts and the list is older than
        MENTION_REFRESH_S, since files come and go while khaelor works. When a listing lands,
        FilesListed makes the UI ask again. The same list while a mention is typed, so
        narrowing stays cheap."""
        import time
        # Not the same mention typed on:
        new_mention = not prefix.startswith(self._mention_prefix)
        self._mention_prefix = prefix
        stale = time.monotonic() - self._files_at > MENTION_REFRESH_S
        if self._files is None or (new_mention and stale):
            self.start_listing()
        return self._files or []

    def start_listing(self) -> None:
        import asyncio
        import time
        if self._listing is not None:
            return
        self._files_at = time.monotonic()
        loop = asyncio.get_running_loop()
        self._listing = loop.run_in_executor(None, self.list_mentionable)
        self._listing.add_done_callback(self.files_listed)

    def files_listed(self, listing) -> None:
        self._listing = None
        if listing.cancelled() or listing.exception() is not None:
            return
        self._files = listing.result()
        self.bus.emit("FilesListed", count=len(self._files))

    def list_mentionable(self) -> list:
        code, out = self.toolbox.workspace.capture(["git", "ls-files", "--cached", "--others", "--exclude-standard"])
        files = out.splitlines() if code == 0 else walk_files(self.project_root, MAX_MENTION_FILES)
        files, folders = files[:MAX_MENTION_FILES], set()
        for path in files:              # each file's folders, up to the first one already seen
            cut = path.rfind("/")
            while cut > 0 and path[:cut + 1] not in folders:
                folders.add(path[:cut + 1])
                cut = path.rfind("/", 0, cut)
        return files + sorted(folders)

    def status(self) -> dict:
        """Read on every frame: recomputed only when the log has grown."""
        key = (self.store.path, len(self.store.events), self.kernel.ctx.model)
        if self._status_key != key:
            self._status_key, self._status = key, self.fold_status()
        return {**self._status, "processes": len(self.toolbox.running_processes())}

    def fold_status(self) -> dict:
        import context
        from model import price_of
        state = self.store.state
        totals = state.usage
        summed = {k: sum(u[k] for u in totals.values()) for k in events.USAGE_KEYS}
        costs = [price_of(m, u, self.settings["prices"]) for m, u in totals.items()]
        last = state.last_usage
        prompt = summed["input_tokens"] + summed["cache_read_tokens"] + summed["cache_write_tokens"]
        window = context.window_of(self.kernel.ctx.model)
        return {"model": self.kernel.ctx.model, "tokens": sum(summed.values()),
                "cost": None if None in costs else sum(costs),
                "context_pct": None if last is None else 100 * (sum(last.values())) / window,
                "cache_share": summed["cache_read_tokens"] / prompt if prompt else None,
                "branch": state.branch}

    async def quit(self) -> None:
        """Idempotent: the UI calls it when the user leaves, and interactive_main again on any exit."""
        if self.closed:
            return
        self.closed = True
        await self.detach()
        await self.client.close()

    # -- slash commands (one table drives dispatch, /help and completion)
    async def cmd_help(self, _):
        import context
        import ui
        commands = [f"- `{name}{(' ' + usage) if usage else ''}` {text}" for name, (_, usage, text) in sorted(COMMANDS.items())]
        keys = [f"- `{key}` {what}" for key, what in ui.KEY_HELP]
        read = self.kernel.ctx.instructions
        files = "\n".join(f"- `{item.path}`" + (f" (imported by `{item.imported_by}`)" if item.imported_by else "")
                          for item in read) or f"- none found ({', '.join(context.INSTRUCTION_FILES)} are looked for)"
        return "**Commands**\n\n" + "\n".join(commands) + "\n\n**Keys**\n\n" + "\n".join(keys) \
            + "\n\n" + self.custom_help() + "\n\n**Instruction files read**\n\n" + files

    def custom_help(self) -> str:
        """/help's section on command files: each with its description and source."""
        if not self.custom:
            return ("**Custom commands**\n\nnone: a Markdown file in .khaelor/commands/, .claude/commands/, "
                    "$KHAELOR_HOME/commands/ or ~/.claude/commands/ becomes a /name command")
        lines = ["**Custom commands** (prompt templates: a command file grants no permission, so "
                 "`allowed-tools` in its front matter is shown but ignored)", ""]
        for name, command in sorted(self.custom.items()):
            hint = f" {command.argument_hint}" if command.argument_hint else ""
            line = f"- `{name}{hint}` {command.description} · {command.source}"
            if command.model:
                line += f" · model {command.model}"
            if command.allowed_tools:
                line += f" · allowed-tools ignored: {command.allowed_tools}"
            lines.append(line)
        return "\n".join(lines)

    async def cmd_new(self, _):
        await self.detach()
        self.attach(events.SessionStore.create(events.sessions_dir(self.home, self.project_root)))
        return f"new session {self.store.session_id}"

    async def cmd_sessions(self, _):
        import asyncio
        # Off the loop: a first listing may rebuild many caches from their logs.
        rows = (await asyncio.to_thread(list_sessions, self.home, self.project_root))[:20]
        if not rows:
            return "no sessions"
        lines = []
        for row in rows:
            here = " (this one)" if row["id"] == self.store.session_id else ""
            dollars = session_cost(row, self.settings["prices"])
            cost = "cost ?" if dollars is None else f"${dollars:.4f}"
            lines.append(f"- `{row['id']}`{here} {row['title'] or '(untitled)'} · {age(row['updated'])}"
                         f" · {row['tokens']} tokens · {cost}")
        return "\n".join(lines) + "\n\n`/resume ID` continues one (a unique prefix of the id is enough)."

    async def cmd_resume(self, prefix):
        if not prefix:
            return await self.cmd_sessions("")
        args = argparse.Namespace(resume=prefix, continue_=False)
        try:
            store = open_session(args, self.home, self.project_root)
        except events.SessionBusyError as e:
            if e.pid == os.getpid():
                return f"`{e.session_id}` is the session you are in"
            return str(e)
        await self.detach()
        self.attach(store)
        return f"resumed `{store.session_id}`: {store.state.title or '(untitled)'}" \
            + recap(store.state.turns)

    async def cmd_rename(self, title):
        if not title:
            return "usage: /rename TITLE"
        self.begin()
        self.bus.emit("SessionRenamed", title=title)
        return f"renamed to {title!r}"

    async def cmd_cost(self, _):
        from model import price_of
        lines = []
        for name, usage in self.store.state.usage.items():
            cost = price_of(name, usage, self.settings["prices"])
            lines.append(f"- {name}: input {usage['input_tokens']}, output {usage['output_tokens']}, cache read "
                         f"{usage['cache_read_tokens']}, cache write {usage['cache_write_tokens']} · "
                         + ("cost unknown (no price for this model)" if cost is None else f"${cost:.4f}"))
        return "\n".join(lines) or "no model calls yet"

    async def cmd_context(self, _):
        rows = self.kernel.ctx.inspect(self.store.state)
        lines = []
        for row in rows:
            line = f"- {row['section']}: ~{row['tokens']} tokens"
            if row.get("cached_tokens"):
                line += f", {row['cached_tokens']} cached"
            lines.append(line)
        return "\n".join(lines) + "\n\n" + self.instructions_report()

    def instructions_report(self) -> str:
        """/context's account of the instruction files: what was read, and each import that was not."""
        ctx = self.kernel.ctx
        lines = ["**Instruction files**", ""]
        for item in ctx.instructions:
            via = f" (imported by `{item.imported_by}`)" if item.imported_by else ""
            lines.append(f"- `{item.path}`{via}: ~{events.estimate_tokens(item.text)} tokens")
        if not ctx.instructions:
            lines.append("- none")
        lines += [f"- {note}" for note in ctx.instruction_notes]
        return "\n".join(lines)

    async def cmd_compact(self, focus):
        if self.busy:       # a cut mid-turn could fall between a tool call and its result
            return "khaelor is working; /compact once the turn ends (or press Esc first)"
        cut_before = self.store.state.cut_seq
        try:
            await self.kernel.keep_in_budget("compact", focus)
        finally:
            self.bus.emit("Status", text="")      # the "compacting…" status ends with the command
        if self.store.state.cut_seq != cut_before:
            return "compacted: the earlier turns are now a summary"
        return "nothing to compact yet: the conversation is too short to summarise"

    async def cmd_model(self, name):
        from model import PRICES
        known = sorted({*PRICES, *self.settings["prices"]})
        if not name:
            return f"model: {self.kernel.ctx.model}\n\nknown: " + ", ".join(f"`{m}`" for m in known)
        if not any(name == m or name.startswith(m + "-") for m in known):   # dated ids: claude-x-20250929
            return f"unknown model `{name}`; known models: " + ", ".join(f"`{m}`" for m in known) \
                + " (a model with a price in config.json `prices` is known too)"
        self.kernel.ctx.model = name
        if self.store.events:       # a session not begun yet records the choice in begin()
            self.bus.emit("ModelChanged", model=name)
        return f"model set to {name}"

    async def cmd_diff(self, _):
        import asyncio

        import context
        # git status, read-only, off the loop
        now = await asyncio.to_thread(context.git_baseline, self.toolbox.workspace)
        return diff_report(self.store.state, [d["path"] for d in now.get("dirty") or []])

    async def cmd_undo(self, _):
        """khaelor's newest edit not undone yet goes back, byte for byte (the toolbox's history)."""
        if self.working:
            return "khaelor is working; wait for the turn to end (or press Esc) before /undo"
        edited = self.store.state.undo_stack
        if not edited:
            return "nothing to undo"
        return self.toolbox.undo(edited[-1], events.UNDO_ID).text

    async def cmd_processes(self, rest):
        action, _, target = rest.partition(" ")
        if action == "stop" and target:
            return (await self.toolbox.run("process", {"action": "stop", "id": target}, "user-processes")).text
        running = self.toolbox.running_processes()
        return "\n".join(f"- `{p['process_id']}` pid {p['pid']} · {p['command']} · {int(p['runtime_s'])}s"
                         for p in running) or "no running processes"

    async def cmd_quit(self, _):
        import ui
        return ui.QUIT


DIFF_SECTIONS = (
    ("preexisting", "Already changed when the session started (yours, left as they were)"),
    ("outside", "Changed during the session outside khaelor's edit tools (by you or by commands)"),
)


def diff_report(state, dirty_now: list | None = None, max_chars: int = 60_000) -> str:
    """/diff as markdown: khaelor's edits of this session file by file (from the log, so it
    survives resume), then the changes that were not khaelor's."""
    import context
    who = context.attribute_changes(state, dirty_now)
    edits = state.edits
    lines = ["khaelor has not changed any file in this session."]
    if edits:
        lines = [f"**khaelor changed {plural(len(edits), 'file')} in this session**"]
    for path, changes in edits.items():
        lines.append(edit_summary(path, changes, path in who["dirty_before_edit"]))
    if edits:
        body = "".join(c.get("diff", "") for changes in edits.values() for c in changes)
        if len(body) > max_chars:
            body = body[:max_chars] + f"\n[… {len(body) - max_chars} more characters of diff …]\n"
        lines += ["", "```diff", body.rstrip("\n"), "```"]
    for key, title in DIFF_SECTIONS:
        paths = who[key]
        if not paths:
            continue
        names = ", ".join(f"`{p}`" for p in paths[:30])
        if len(paths) > 30:
            names += f" and {len(paths) - 30} more"
        lines += ["", f"**{title}:** {names}"]
    return "\n".join(lines)


def edit_summary(path: str, changes: list, was_dirty: bool) -> str:
    """`- `app.py` +3 −1 in 2 edits` for one file of /diff."""
    added = sum(c.get("added", 0) for c in changes)
    removed = sum(c.get("removed", 0) for c in changes)
    created = " (created)" if changes[0].get("created") else ""
    line = f"- `{path}`{created} +{added} −{removed} in {plural(len(changes), 'edit')}"
    if was_dirty:
        line += " · it had uncommitted changes before khaelor's first edit: only khaelor's edits are shown"
    return line


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def recap(turns: list, n_turns: int = 3) -> str:
    """The last few exchanges of a resumed session (`State.turns`), as markdown quotes (the UI
    shows the full conversation only for sessions opened at start-up)."""
    lines = []
    for asked, answered in turns[-n_turns:]:
        lines.append("\n> **you:** " + " ".join(asked.split())[:300])
        if answered:
            lines.append("> **khaelor:** " + " ".join(answered.split())[:500])
    return "\n" + "\n".join(lines) if lines else ""


STOPPED_OUTPUT_CHARS = 20_000  # of a `!` command stopped with Esc, the output kept (its end)
MENTION_REFRESH_S = 1.0      # a new @ mention lists the files again when the list is older than this
MAX_MENTION_FILES = 50_000   # files offered for @ completion, at most
SKIPPED_FOLDERS = frozenset({"node_modules", "__pycache__", "venv"})   # and every dot-folder


def walk_files(root: Path, limit: int) -> list:
    """Project files outside git (relative paths, sorted by folder), skipping dot-folders and junk."""
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") and d not in SKIPPED_FOLDERS)
        base = os.path.relpath(folder, root)
        found += [name if base == "." else f"{base}/{name}" for name in sorted(names)]
        if len(found) >= limit:
            break
    return found[:limit]


COMMANDS = {   # name: (handler, usage, what it does)
    "/help": (Session.cmd_help, "", "list the commands"),
    "/new": (Session.cmd_new, "", "start a new session"),
    "/clear": (Session.cmd_new, "", "start a new session (the old log is kept)"),
    "/sessions": (Session.cmd_sessions, "", "this project's sessions"),
    "/resume": (Session.cmd_resume, "[id]", "resume a session by id prefix"),
    "/rename": (Session.cmd_rename, "TITLE", "rename this session"),
    "/cost": (Session.cmd_cost, "", "tokens by kind and cost, from the API's usage"),
    "/context": (Session.cmd_context, "", "what the context holds, per section"),
    "/compact": (Session.cmd_compact, "[focus]", "summarise the conversation to free context"),
    "/model": (Session.cmd_model, "[id]", "show or change the model"),
    "/diff": (Session.cmd_diff, "", "changes khaelor made in this session"),
    "/undo": (Session.cmd_undo, "", "restore the file khaelor changed last"),
    "/processes": (Session.cmd_processes, "[stop ID]", "running background processes"),
    "/quit": (Session.cmd_quit, "", "leave khaelor"),
}


def run_interactive(args, home: Path, project_root: Path) -> int:
    if not sys.stdin.isatty() or not sys.stdout.isatty():
        raise UsageError("the interactive UI needs a terminal; use -p PROMPT for scripts and pipes")
    require_api_key()
    settings = load_settings(args, home, project_root)
    store = open_session(args, home, project_root) if (args.resume or args.continue_) else \
        events.SessionStore.create(events.sessions_dir(home, project_root))
    import asyncio
    return asyncio.run(interactive_main(args, settings, store, home, project_root))


async def interactive_main(args, settings, store, home: Path, project_root: Path) -> int:
    import asyncio

    import model
    import ui
    session = Session(args, settings, home, project_root)
    session.attach(store)
    earlier = list(store.events)      # after attach: what repair() recorded (a reply cut off by a crash) shows too
    notices = [f"warning: {warning}" for warning in store.warnings] + start_notices(settings)
    # The SDK import (~2 s) starts just after the first paint, so typing never waits for it.
    asyncio.get_running_loop().call_later(0.05, model.preload)
    # Stray writes to stderr (library warnings) would tear the live region: they go to a file.
    saved_stderr = os.dup(2)
    with open(home / "stderr.log", "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        history = events.private_file(home / "history")     # what the user typed: 0600, like the logs
        return await ui.run_app(session, history_path=history, replay=earlier, notices=notices)
    finally:
        await session.quit()
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)


# ---------------------------------------------------------------- entry point

def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--version"]:     # the cheapest path there is: no argparse, no signals
        print(f"khaelor {VERSION}")
        return EXIT_OK
    _exit_on_sigterm()
    home, project_root = events.khaelor_home(), find_project_root(Path.cwd())
    try:
        if argv[:1] == ["sessions"]:
            argparse.ArgumentParser(prog="khaelor sessions", description="List this project's sessions, "
                                    "newest first (`khaelor -r ID` resumes one; a unique prefix is enough).",
                                    ).parse_args(argv[1:])
            return cmd_sessions(home, project_root)
        if argv[:1] == ["permissions"]:
            return cmd_permissions(argv[1:], home, project_root)
        if argv[:1] == ["trust"]:
            return cmd_trust(argv[1:], home, project_root)
        args = parse_args(argv)
        if args.prompt is not None:
            import time

            import model
            args.started = time.monotonic()     # duration_ms of the result counts from here
            require_api_key()     # these two are quick; an exit during the import must wait for it
            settings = load_settings(args, home, project_root)
            model.preload()   # the SDK import (~2 s) overlaps with the rest of start-up
            args.prompt = expand_headless(read_prompt(args), settings, home, project_root)
            store = open_session(args, home, project_root)
            for warning in store.warnings:
                print(f"khaelor: warning: {warning}", file=sys.stderr)
            import asyncio
            return asyncio.run(run_headless(args, settings, store, home, project_root))
        return run_interactive(args, home, project_root)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:     # `khaelor sessions | head -1`: the reader has gone; end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # nothing left to flush at exit
        return EXIT_OK
    except UsageError as e:
        print(f"khaelor: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KhaelorError as e:
        print(f"khaelor: {e}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:  # the one catch-all: one line for the user, the traceback in a file
        return report_crash(e, home)


def report_crash(error: Exception, home: Path) -> int:
    import traceback
    path = home / "crash.log"
    try:
        home.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(traceback.format_exception(error)) + "\n")
    except OSError:
        path = None
    print(f"khaelor: internal error: {type(error).__name__}: {error}"
          + (f" (details in {path})" if path else ""), file=sys.stderr)
    return EXIT_FAILED


def _exit_on_sigterm() -> None:
    """SIGTERM and SIGHUP (the terminal closed) unwind like Ctrl-C, so `finally` blocks stop processes
    and sync the log. The interactive UI installs its own handlers while it runs."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


if __name__ == "__main__":
    sys.exit(main())
