"""khaelor.py: the command line and composition root of KHAELOR, a terminal coding agent.

Owns: argv, config files and their precedence, session lifecycle (new, --continue, --resume),
the headless runner (-p) and its result object, `khaelor sessions`, `khaelor permissions`,
`khaelor trust` and `khaelor sandbox`, `khaelor rewind` and /rewind (the work tree back to before
a step, from its checkpoints), the slash-command table and the custom command files (Claude Code's
`commands/*.md` prompt templates), exit codes, and the one catch-all that turns an unexpected
error into one line plus the log path. It reads the permission files and trust.json and writes
grants and trust records; what a file grants is permissions.py's to decide (the trust model).
Must not: hold agent logic (kernel.py), build requests (context.py) or run tools (tools.py).
It is the only module that imports ui: when the interactive UI starts, and for --help's keys.

    khaelor                      interactive, in the current directory
    khaelor -p "fix the test"    headless one-shot (see --help)
"""
import argparse
import contextvars
import errno
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple

import events
from events import KhaelorError

VERSION = "0.1.0"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
# 128 + SIGINT, as a shell reports a command Ctrl-C ended
EXIT_INTERRUPTED = 130
# 128 + SIGPIPE: the reader of the output has gone (`khaelor -p … | head -1`)
EXIT_PIPE = 141
# 128 + SIGHUP: the terminal was closed, so no farewell line is written to it
EXIT_HANGUP = 129
# how long `-p PROMPT` waits for the first byte of a pipe on stdin before it goes on without it
STDIN_WAIT_S = 3.0
# config.json's keys and the type each value must have
CONFIG_KEYS = {
    "model": (str,),
    "aux_model": (str,),
    "permissions": (list, dict),
    "prices": (dict,),
    "max_turns": (int,),
    "pass_env": (list,),
    "context": (dict,),
    "thinking": (str,),
    "effort": (str,),
    "show_thinking": (bool,),
    "max_output_tokens": (int,),
}
# how a config error names what a key takes
JSON_NAMES = {str: "a string", int: "a whole number", bool: "true or false", list: "a list",
              dict: "an object"}
# the keys of config.json's "context" object
CONTEXT_KEYS = {"prune_at": int}
# settings that count something and make no sense below 1
POSITIVE_KEYS = {"max_output_tokens": "tokens", "max_turns": "model responses"}


class UsageError(KhaelorError):
    """Bad flags, bad config, missing key, unknown session: exit 2 with one actionable line."""


# ---------------------------------------------------------------- config

def find_project_root(cwd: Path) -> Path:
    """The nearest ancestor holding .git, else the working directory itself."""
    for directory in (cwd, *cwd.parents):
        if (directory / ".git").exists():
            return directory
    return cwd


# A config, permission or command file larger than this is refused (a sparse file could claim a
# terabyte).
MAX_CONFIG_BYTES = 10_000_000


def read_bytes(path: Path) -> bytes:
    """A config or permission file's bytes, read once; b"" when there is none. One a repository
    or a step made a FIFO (or a device, or a sparse giant) is an error, not a wait without end."""
    try:
        data = events.read_regular(path, MAX_CONFIG_BYTES + 1)[0]
    except FileNotFoundError:
        return b""
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UsageError(f"{path}: larger than {MAX_CONFIG_BYTES:,} bytes")
    return data


def read_config(path: Path) -> dict:
    return parse_config(path, read_bytes(path).decode("utf-8", "replace"))


def parse_config(path: Path, text: str) -> dict:
    if not text:
        return {}
    try:
        config = json.loads(text)
    except ValueError as e:
        problem = f"not valid JSON ({e.msg}); fix or remove the file"
        raise UsageError(f"{path}:{e.lineno}: {problem}") from None
    if not isinstance(config, dict):
        example = '{"model": "..."}'
        raise UsageError(f"{path}: must hold a JSON object like {example}")
    for key, value in config.items():
        expected = CONFIG_KEYS.get(key)
        if expected is None:
            known = ", ".join(CONFIG_KEYS)
            raise UsageError(f"{path}: unknown key {key!r}; known keys: {known}")
        # a bool is an int to isinstance: only a bool key takes one
        wrong_bool = isinstance(value, bool) and bool not in expected
        if not isinstance(value, expected) or wrong_bool:
            names = " or ".join(JSON_NAMES[t] for t in expected)
            found = json.dumps(value)
            found = found if len(found) <= 40 else found[:40] + "…"
            raise UsageError(f"{path}: {key!r} must be {names}, not {found}")
        choices = setting_choices().get(key)
        if choices and value not in choices:
            raise UsageError(f"{path}: {key!r} must be one of {', '.join(choices)}")
        if key in POSITIVE_KEYS and value < 1:
            raise UsageError(f"{path}: {key!r} must be a positive number of {POSITIVE_KEYS[key]}")
    for key, value in (config.get("context") or {}).items():
        if key not in CONTEXT_KEYS:
            raise UsageError(f"{path}: unknown key 'context.{key}';"
                             f" known: {', '.join(CONTEXT_KEYS)}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UsageError(f"{path}: 'context.{key}' must be a whole number of tokens (0: off)")
    if not all(isinstance(name, str) for name in config.get("pass_env", [])):
        raise UsageError(f"{path}: 'pass_env' must list names or patterns of environment"
                         ' variables, as strings: ["GITHUB_*"]')
    for model_id, row in (config.get("prices") or {}).items():
        # [input, output, cache write, cache read] (events.PRICED_KEYS), finite, none below 0
        four = isinstance(row, list) and len(row) == len(events.PRICED_KEYS)
        if not four or not all(type(amount) in (int, float) and 0 <= amount < float("inf")
                               for amount in row):
            raise UsageError(f"{path}: 'prices.{model_id}' must be 4 amounts in dollars per"
                             " million tokens: [input, output, cache write, cache read]")
    import permissions
    if isinstance(config.get("permissions"), dict):
        # Claude Code's {"allow": [...], ...}: read in its syntax, never fatal
        return config
    problem = permissions.validate_config_rules(config.get("permissions", []))
    if problem:
        raise UsageError(f"{path}: {problem}")
    return config


def setting_choices() -> dict:
    """The values `thinking` and `effort` may take: model.py's table owns them."""
    import model
    return {"thinking": model.THINKING_MODES, "effort": model.EFFORTS}


def load_settings(args, home: Path, project_root: Path) -> dict:
    """Precedence: flags → project config → user config ($KHAELOR_HOME's) → defaults."""
    from model import DEFAULT_AUX_MODEL, DEFAULT_MODEL, MODEL_ALIASES
    user = read_config(home / "config.json")
    merged = {"model": DEFAULT_MODEL, "aux_model": DEFAULT_AUX_MODEL,
              "prices": {}, "max_turns": None, "context": {},
              "thinking": "adaptive", "effort": None, "show_thinking": None,
              "max_output_tokens": None}
    project, merged["untrusted_keys"] = project_config(home, project_root)
    # the project's file wins; permission rules are layers of their own
    for config in (user, project):
        for key, value in config.items():
            if key != "permissions":
                merged[key] = value
    # prices merge per model: the project's win for the models they name
    merged["prices"] = {**user.get("prices", {}), **project.get("prices", {})}
    # a config names a model as --model does: "opus" is sent as its id
    for key in ("model", "aux_model"):
        merged[key] = MODEL_ALIASES.get(merged[key], merged[key])
    for key in ("model", "aux_model", "max_turns"):
        if getattr(args, key, None) is not None:
            merged[key] = getattr(args, key)
            if key != "max_turns":
                merged[key] = model_choice(merged[key], merged["prices"])
    # Environment names passed to commands: a grant, so only from the user's own config.
    merged["pass_env"] = user.get("pass_env", [])
    merged["model_flag"] = None
    if getattr(args, "model", None) is not None:
        merged["model_flag"] = merged["model"]
    # --thinking and --effort: recorded in the session, so a resume keeps them
    flags = {key: getattr(args, key, None) for key in ("thinking", "effort")}
    merged["reasoning_flags"] = {k: v for k, v in flags.items() if v is not None}
    # the permission layers are read by build_kernel: the trust model is not on the start path
    merged["extra_layers"] = flag_layers(args, project_root)
    return merged


# ------------------------------------------------ trust: where permission rules come from

def permission_layers(home: Path, project_root: Path,
                      extra: tuple = ()) -> list:
    """Rule layers in evaluation order (later wins): the user's own files (Claude Code's
    ~/.claude/settings.json, then KHAELOR's), the user's saved "always" answers for this project,
    then the project's own files, which may always tighten but grant only once the user trusted them
    (`khaelor trust`); any change to one withdraws its trust. `extra`: this run's flags. The files
    are read here; permissions.py's trust model decides what they grant."""
    import permissions
    claude_user = Path.home() / ".claude" / "settings.json"
    try:
        claude_data = events.read_regular(claude_user, MAX_CONFIG_BYTES)[0]
    except OSError:
        # Claude Code's own file: one khaelor cannot read (a FIFO in its place) stops nothing
        claude_data = b""
    layers = [file_layer(claude_user, claude_data, project_root, "user", True)]
    for path in user_config_paths(home):
        layers.append(file_layer(path, read_bytes(path), project_root, "user", True))
    grants = grants_path(home, project_root)
    layers.append(permissions.Layer(str(grants), read_config(grants)))
    records = trust_records(home)
    for name in permissions.PROJECT_FILES:
        path = project_root / name
        data = read_bytes(path)
        trusted = permissions.is_trusted(records, path, data)
        layers.append(file_layer(path, data, project_root, "project", trusted))
    return [*layers, *extra]


def file_layer(path: Path, data: bytes, project_root: Path, kind: str, trusted: bool):
    """A permission file's layer as `data` (its one read) says: what is hashed for trust is
    what is parsed, so a file swapped in between cannot be trusted unseen. Claude Code's settings
    are read in its syntax; a KHAELOR config is checked as config.json first."""
    import permissions
    text = data.decode("utf-8", "replace")
    if path.parent.name == ".claude":
        return permissions.claude_layer(str(path), text, project_root, kind, trusted)
    config = parse_config(path, text)
    return permissions.config_layer(str(path), config, text, project_root, kind, trusted)


def user_config_paths(home: Path) -> list[Path]:
    """~/.khaelor/config.json and $KHAELOR_HOME/config.json (one file when they are the same)."""
    paths = [Path.home() / ".khaelor" / "config.json", home / "config.json"]
    if os.path.realpath(paths[0]) == os.path.realpath(paths[1]):
        return paths[1:]
    return paths


def grants_path(home: Path, project_root: Path) -> Path:
    """Where "always" answers for this project are kept: the user's state, never the repository."""
    name = events.sessions_dir(home, project_root).name
    return home / "grants" / f"{name}.json"


def trust_records(home: Path) -> dict:
    """$KHAELOR_HOME/trust.json: {a file's place: the hash of the bytes the user trusted}."""
    path = home / "trust.json"
    try:
        records = json.loads(events.read_regular(path, MAX_CONFIG_BYTES)[0])
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def start_notices(settings: dict, layers: list) -> list[str]:
    """Said once when a session starts: grants in `layers` waiting for trust, no OS sandbox."""
    import sandbox
    import permissions
    notices = [permissions.trust_notice(layers), sandbox.notice()]
    if settings.get("untrusted_keys"):
        keys = ", ".join(settings["untrusted_keys"])
        notices.append(f"this project's .khaelor/config.json sets {keys}; ignored until you"
                       " trust it with `khaelor trust`")
    # a rule that maps onto nothing, as `khaelor permissions` lists it; in a file, one for a tool
    # khaelor lacks ("khaelor has no web tool") is no mistake: a Claude Code user's file has many
    for layer in layers:
        for where, rule, why in layer.ignored:
            if layer.source.startswith("/") and why.startswith("khaelor "):
                continue
            notices.append(f"{where} {rule!r} is ignored: {why}" if rule else f"{where}: {why}")
    return [notice for notice in notices if notice]


def cmd_trust(argv: list, home: Path, project_root: Path) -> int:
    parser = argparse.ArgumentParser(prog="khaelor trust", description="Review the permissions"
                                     " this project's own files (.khaelor/config.json,"
                                     " .claude/settings*.json) grant, and trust exactly these"
                                     " versions of them.")
    parser.add_argument("--revoke", action="store_true", help="withdraw the trust")
    parser.add_argument("-y", "--yes", action="store_true",
                        help="trust what is shown without asking")
    args = parser.parse_args(argv)
    import permissions
    files = [project_root / name for name in permissions.PROJECT_FILES]
    files = [path for path in files if path.is_file()]
    if not files:
        raise UsageError(f"nothing to trust: {project_root} has no"
                         " .khaelor/config.json or .claude/settings*.json")
    records = trust_records(home)
    reviewed = {}
    for path in files:
        key = permissions.trust_key(path)
        if key is None:
            say(f"{path}: a symlink; a permission file reached through a link is never trusted")
        elif args.revoke:
            records.pop(key, None)
            say(f"{path}: no longer trusted; its rules can only tighten")
        else:
            reviewed[key] = show_grants(path, read_bytes(path), project_root)
    if reviewed and not args.yes:
        if not sys.stdin.isatty():
            # silence is not consent, here as at a permission question
            raise UsageError("nothing trusted: there is no terminal to ask on;"
                             " run `khaelor trust` in a terminal, or"
                             " `khaelor trust --yes` to trust what is listed above")
        if not confirm("Trust these?"):
            print("nothing trusted")
            return EXIT_FAILED
    write_json_atomic(home / "trust.json", {**records, **reviewed})
    if reviewed:
        print("trusted; any change to a file withdraws its trust"
              " until you run `khaelor trust` again")
    return EXIT_OK


def show_grants(path: Path, data: bytes, project_root: Path) -> str:
    """What trusting these bytes (the file's one read) grants, shown; returns their hash, so the
    trust recorded is for exactly what the user saw."""
    import permissions
    digest = permissions.content_hash(data)
    layer = file_layer(path, data, project_root, "project", False)
    grants = permissions.untrusted_grants([layer])
    say(f"{path} (sha256 {digest[:16]}…)")
    if grants:
        print("  trusting it grants:")
    else:
        print("  it grants nothing (its ask and deny rules apply whether trusted or not)")
    for rule in grants:
        say(f"    allow {rule.capability} '{rule.pattern}'  ({rule.source})")
    config = {}
    if path.name == "config.json":
        config = parse_config(path, data.decode("utf-8", "replace"))
    if config.get("prices"):
        say(f"  its prices for {', '.join(sorted(config['prices']))} apply (what /cost shows)")
    for key in SPENDING_KEYS:
        if key != "prices" and key in config:
            say(f"  its {key} applies: {json.dumps(config[key])}")
    return digest


def confirm(question: str) -> bool:
    """`y` typed at the terminal; anything else, or the input's end, is no."""
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def say(line: str) -> None:
    """A line that holds a repository's rules or paths: every character shown as itself, none
    acted on by the terminal, on one line (events.visible_controls)."""
    print(events.visible_controls(line, one_line=True))


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------- sessions

def open_session(args, home: Path, project_root: Path,
                 none_yet: str = "no earlier session in this project to continue;"
                                 " run without -c to start one", lister="`khaelor sessions`"):
    """A new session, the newest one (--continue: `none_yet` says there is none) or one named by
    an id prefix (--resume; `lister` is what lists them, /sessions in the app)."""
    directory = events.sessions_dir(home, project_root)
    files = events.list_session_files(directory)
    if args.resume is not None and not args.resume.strip():
        # "" is a prefix of every id: it would pick one at random, or start a new session
        raise UsageError("-r needs a session id (or a unique prefix of one);"
                         " `khaelor sessions` lists them")
    if args.resume and args.continue_:
        raise UsageError("-c and -r both name a session to go on with; give one of them")
    if args.resume:
        matches = [f for f in files if f.stem.startswith(args.resume)]
        if not matches:
            raise UsageError(f"no session {args.resume!r} in this project; {lister} lists them")
        if len(matches) > 1:
            raise UsageError(f"{args.resume!r} matches {len(matches)}"
                             " sessions; give more of the id")
        return events.SessionStore.open(matches[0])
    if args.continue_:
        # The newest session that holds a conversation: one opened and quit without a word
        # is not it.
        newest = next((path for path in reversed(files) if holds_conversation(path)), None)
        if newest is None:
            raise UsageError(none_yet)
        return events.SessionStore.open(newest)
    return events.SessionStore.create(directory)


def holds_conversation(path: Path) -> bool:
    """A user message is in it. One that cannot be summarised (unreadable, from a newer
    khaelor) counts too: opening it says why."""
    summary = summary_of(path)
    if not summary:
        return True
    return bool(summary.get("n_messages"))


def session_summary(store) -> dict:
    """What a listing shows; cached in the session's .meta.json."""
    state = store.state
    totals = state.usage
    # thinking_tokens is part of output_tokens: summed_usage counts it once
    tokens = sum(summed_usage(totals).values())
    return {"id": store.session_id,
            "title": state.title,
            "created": state.created_ts,
            "updated": state.updated_ts,
            "tokens": tokens,
            "cost": events.cost(totals),
            "model": state.model,
            "branch": state.branch,
            "n_messages": len(state.user_texts),
            "usage": totals}


# What a repository's config.json may set only once the user trusted it: a cloned repository
# could otherwise make sessions cost more (a pricier model, more effort, longer replies, more
# turns) or look cheaper than they are (its own prices).
SPENDING_KEYS = ("prices", "model", "aux_model", "effort", "thinking", "max_output_tokens",
                 "max_turns")


def project_config(home: Path, project_root: Path) -> tuple[dict, list]:
    """The project's config.json, read once, and the spending keys it sets that do not apply:
    like its grants, they apply only once the user trusted these bytes (`khaelor trust`)."""
    path = project_root / ".khaelor" / "config.json"
    data = read_bytes(path)
    config = parse_config(path, data.decode("utf-8", "replace"))
    if not config:
        # most projects have none: the trust model (permissions.py) is not imported at start-up
        return config, []
    import permissions
    if permissions.is_trusted(trust_records(home), path, data):
        return config, []
    left_out = [key for key in SPENDING_KEYS if key in config]
    kept = {key: value for key, value in config.items() if key not in left_out}
    return kept, left_out


def summary_of(path: Path) -> dict | None:
    """A session's summary from its .meta.json cache; a missing or stale cache (or one written
    before summaries counted messages) is rebuilt from the log, read-only: another khaelor may be
    writing it.
    None: the log vanished, is unreadable or is from a newer khaelor."""
    meta = events.read_meta(path)
    if meta is None or "usage" not in meta:
        try:
            stat = os.stat(path)
            store = events.SessionStore.open(path, read_only=True)
            meta = session_summary(store)
        except (OSError, KhaelorError):
            return None
        events.write_meta(path, meta, stat)
    return meta


def list_sessions(home: Path, project_root: Path) -> list[dict]:
    """Summaries of this project's sessions that hold a conversation, newest first. Sessions with no
    user message (opened and quit, by older versions too) are left out."""
    summaries = []
    directory = events.sessions_dir(home, project_root)
    for path in reversed(events.list_session_files(directory)):
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
    seconds = time.time() - ts_ms / 1000
    return "just now" if seconds < 60 else f"{events.duration(seconds)} ago"


def for_terminal(text: str, stream) -> str:
    """Model text and titles reach a terminal without the bytes that would drive it: a model or a
    hostile file must not set the window title, write the clipboard (OSC 52) or move the cursor."""
    if not stream.isatty():
        return text
    return events.plain_text(text)


def cmd_sessions(argv: list, home: Path, project_root: Path) -> int:
    parser = argparse.ArgumentParser(
        prog="khaelor sessions",
        description="List this project's sessions, newest first"
                    " (`khaelor -r ID` resumes one; a unique prefix is enough).")
    parser.parse_args(argv)
    sessions = list_sessions(home, project_root)
    if not sessions:
        print("no sessions in this project yet")
        return EXIT_OK
    prices = load_settings(argparse.Namespace(), home, project_root)["prices"]
    print(f"{'id':<30} {'updated':>9} {'tokens':>9} {'cost':>8}  title")
    for row in sessions:
        cost = events.dollars(events.cost(row["usage"], prices), "?")
        branch = ""
        if row.get("branch"):
            branch = f"  [{events.visible_controls(row['branch'], one_line=True)}]"
        title = row["title"] or "(untitled)"
        title = for_terminal(title, sys.stdout)
        updated = age(row["updated"]) if row["updated"] else "-"
        print(f"{row['id']:<30} {updated:>9} {row['tokens']:>9}"
              f" {cost:>8}  {title}{branch}")
    return EXIT_OK


def cmd_permissions(argv: list, home: Path, project_root: Path) -> int:
    import permissions
    parser = argparse.ArgumentParser(prog="khaelor permissions",
                                     description="Show or test the permission policy.")
    sub = parser.add_subparsers(dest="action")
    check = sub.add_parser("check", help="what would happen to a call, without running it")
    # before or after `check` alike (a default here would undo the one given before it)
    check.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    target = check.add_mutually_exclusive_group(required=True)
    for kind, metavar in (("bash", "COMMAND"), ("read", "PATH"), ("write", "PATH")):
        # args.call: (kind, what), as permissions.check takes them
        target.add_argument(f"--{kind}", dest="call", metavar=metavar,
                            type=lambda value, kind=kind: (kind, value))
    parser.add_argument("--json", action="store_true", help="the policy as JSON")
    args = parser.parse_args(argv)
    import sandbox
    layers = permission_layers(home, project_root)
    rules = permissions.load_rules(layers)
    if args.action != "check":
        if args.json:
            print(json.dumps(policy_json(layers, rules), ensure_ascii=False))
        else:
            print("\n".join(policy_report(layers, rules)))
        return EXIT_OK
    kind, subject = args.call
    if not subject.strip():     # no call to judge (it answered "allow (…; )")
        raise UsageError(f"permissions check: --{kind} is blank; give the call to check")
    result = permissions.check(kind, subject, project_root, rules,
                               sandboxed=sandbox.enforced())
    if args.json:
        print(json.dumps(result))
        return EXIT_OK
    why = (f"{result['capability']}; decided by: {result['layer']}; {result['reason']}")
    say(f"{result['decision']}  ({why})")
    for key, label in (("not_read_only", "not provably read-only"),
                       ("destructive", "destroys work"),
                       ("suggestion", "always-allow would save")):
        if result[key]:
            say(f"{label}: {result[key]}")
    return EXIT_OK


def boundary_lines() -> list[str]:
    """Each layer of the OS boundary and whether this kernel enforces it."""
    import sandbox
    lines = []
    for name, enforced, holds in sandbox.layers():
        state = "enforced" if enforced else "MISSING "
        lines.append(f"boundary: {name:<15} {state}  {holds}")
    return lines


def cmd_sandbox(argv: list, home: Path, project_root: Path) -> int:
    """`khaelor sandbox [--read-only|--write|--network] [--path P] [--secrets] [--yes] -- CMD…`:
    run any command in the sandbox a permission decision would give it, so the boundary can be
    tested without the model."""
    import shlex

    import permissions
    import sandbox
    import tools
    parser = argparse.ArgumentParser(
        prog="khaelor sandbox",
        description="Run CMD in the sandbox that a permission decision gives:"
                    " read-only (default: a command that runs without asking),"
                    " --write (an approved command), --network (approved with network).")
    shape = parser.add_mutually_exclusive_group()
    for name in ("read-only", "write", "network"):
        shape.add_argument(f"--{name}", dest="shape", action="store_const", const=name)
    parser.add_argument("--path", action="append", default=[], metavar="P",
                        help="an approved path outside the project (repeatable)")
    parser.add_argument("--secrets", action="store_true",
                        help="as if reading the project's secret files was approved")
    parser.add_argument("--yes", action="store_true",
                        help="as --yes approves it: the project's secret files stay closed")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("sandbox: name a command after --")
    shape = args.shape or "read-only"
    paths = tuple(os.path.abspath(path) for path in args.path)
    # the paths your read rules deny or ask about, as in a session (you typed the command:
    # what it names of the guarded files it may change, as an approval of it in a panel)
    rules = permissions.load_rules(permission_layers(home, project_root))
    confine = sandbox.Confine(write=shape != "read-only", network=shape == "network", paths=paths,
                              secrets=args.secrets, hide=sandbox.SECRET_NAMES,
                              attended=not args.yes, unattended=args.yes,
                              **permissions.rule_paths(rules))
    workspace = tools.Workspace(project_root)
    workspace.home = home
    workspace.pass_env = read_config(home / "config.json").get("pass_env", [])
    print(f"khaelor sandbox: {shape}, project {project_root}"
          f"{', outside paths: ' + ', '.join(confine.paths) if confine.paths else ''}",
          file=sys.stderr)
    print("\n".join(boundary_lines()), file=sys.stderr)
    links = tools.gitlinks(workspace)
    guarded = tools.guard_record(project_root, links) if confine.write else None
    try:
        return workspace.run_attached(command, confine)
    except FileNotFoundError:
        raise UsageError(f"khaelor sandbox: no such program: {command[0]}") from None
    finally:
        if guarded is not None:
            links = tuple(dict.fromkeys((*links, *tools.gitlinks(workspace))))
            note = tools.guard_check(project_root, sandbox.spill_folder(home, project_root),
                                     guarded, shlex.join(command), confine, links)
            if note:
                print(f"khaelor sandbox: {note}", file=sys.stderr)


def layer_exists(layer) -> bool:
    """A layer read from a file that is there (a flag's layer has no file)."""
    return not layer.source.startswith("/") or Path(layer.source).exists()


def policy_json(layers: list, rules) -> dict:
    """`khaelor permissions --json`: what the listing shows, for scripts."""
    import dataclasses

    import sandbox
    shown_layers = [{"kind": layer.kind, "source": layer.source, "trusted": layer.trusted,
                     "exists": layer_exists(layer)} for layer in layers]
    ignored = [{"rule": str(rule), "where": where, "why": why}
               for layer in layers for where, rule, why in layer.ignored]
    return {"sandbox": sandbox.status(), "layers": shown_layers,
            "rules": [dataclasses.asdict(rule) for rule in rules], "ignored": ignored}


def markdown_literal(text: str) -> str:
    """`text` as markdown that shows it as written: what would be read as emphasis, code or a
    link (a rule's `secrets/**`, a path's `__x__`), and the escape itself, escaped."""
    return MARKDOWN_MARKERS.sub(r"\\\1", text)


def policy_report(layers: list, rules) -> list[str]:
    """`khaelor permissions` and /permissions: the sandbox, the boundary, the layers, the rules,
    and what is ignored; every character shown as itself (events.visible_controls)."""
    import permissions
    import sandbox
    lines = [f"sandbox: {sandbox.status()}", *boundary_lines()]
    for layer in layers:
        trust = ""
        if layer.kind == "project":
            trust = "  (untrusted: tightens only)"
            if layer.trusted:
                trust = "  (trusted)"
        if not layer_exists(layer):
            trust += "  (no such file)"
        lines.append(f"layer: {layer.kind:<7} {layer.source}{trust}")
    # your own rules first; the number is the evaluation order (the last match wins)
    described = permissions.describe_rules(rules)
    for own in (True, False):
        lines += [line for line, rule in zip(described, rules) if (rule.layer == "user") == own]
    # what is ignored, in the same columns: "-" has no place in the order
    grants = permissions.untrusted_grants(layers)
    width = max(len(rule.capability) for rule in [*rules, *grants])
    for rule in grants:
        lines.append(f"  -  allow  {rule.capability:<{width}}  {rule.pattern:<24}"
                     f"  {rule.source}  (ignored: untrusted; run `khaelor trust`)")
    for layer in layers:
        for where, rule, why in layer.ignored:
            # as wide as the action, capability and pattern columns
            columns = 5 + 2 + width + 2 + 24
            lines.append(f"  -  {rule:<{columns}}  {where}  (ignored: {why})")
    return [events.visible_controls(line, one_line=True) for line in lines]


# ---------------------------------------------------------------- rewind: back to before a step


def step_lines(state) -> list[str]:
    """The session's steps that may have changed the work tree, newest first, with what each
    changed (from the checkpoint after it)."""
    lines = []
    for number, step in reversed(list(enumerate(state.steps, 1))):
        changed = step["changed"]
        if changed is None:
            what = "changes not recorded yet"
        elif not changed:
            what = "changed nothing"
        else:
            what = events.listed(changed, 4)
        if step["undone"]:
            what += " (undone)"
        shown = " ".join(step["what"].split())[:60]
        # a step's command and the names it made are the model's: nothing in them acts on the
        # terminal, and what a rewind will do is all shown
        line = f"{number:>3}. {step['kind']} {shown} · {what}"
        lines.append(events.visible_controls(line, one_line=True))
    return lines


def last_changing_step(state) -> int | None:
    """The newest step not undone yet that changed something (or whose changes are not recorded
    yet); a rewind is not one: /undo again goes further back."""
    for number in range(len(state.steps), 0, -1):
        step = state.steps[number - 1]
        if step["kind"] != "rewind" and not step["undone"] and step["changed"] != []:
            return number
    return None


def why_nothing_to_rewind(state) -> str:
    """Said when last_changing_step finds none: none changed anything, or all are undone."""
    if any(step["kind"] == "rewind" for step in state.steps):
        return "the steps that changed the work tree are rewound already (a rewind is a step too:" \
               " rewinding it brings them back)"
    return "no step of this session changed the work tree"


class Rewind:
    """Going back to before step `number`: `plan` says what it writes and deletes; `start`, `write`
    and `finish` do it between two checkpoints (so a rewind can itself be rewound) as a durable
    Rewound event."""

    def __init__(self, bus, toolbox, number: int):
        self.bus = bus
        self.toolbox = toolbox
        self.number = number
        self.state = bus.store.state

    def plan(self) -> None:
        import tools
        state = self.state
        if not 1 <= self.number <= len(state.steps):
            raise UsageError(f"no step {self.number} (this session has {len(state.steps)})")
        self.target, overlay = events.rewind_target(state, self.number)
        if self.target is None:
            raise UsageError(f"no checkpoint before step {self.number}")
        # a step taken after this plan (a turn while its question is open) makes it stale
        self.planned_steps = len(state.steps)
        checkpoints = self.toolbox.checkpoints
        newest = state.checkpoints[-1]["tree"]
        # the log's word, read before the checkpoint below: the newest one follows the last step
        after_last_step = not state.unrecorded
        try:
            self.now = checkpoints.take(newest)
        except tools.CheckpointError as error:
            raise KhaelorError(f"cannot rewind: {error}") from None
        self.repo = checkpoints.repository()
        self.root = self.repo.root if self.repo else self.toolbox.workspace.cwd
        last = newest if after_last_step else self.now["tree"]
        load = self.load_version
        since = events.written(state, state.steps[self.number - 1]["seq"] - 1, float("inf"))
        written = {os.path.relpath(real, self.root): load(real, version)
                   for real, version in overlay.items()}
        since = {os.path.relpath(real, self.root): (first and load(real, first), load(real, latest))
                 for real, (first, latest) in since.items()}
        self.restores = checkpoints.plan(self.root, self.target, written,
                                         last, self.now["tree"], since)

    def load_version(self, real: str, version: str) -> bytes:
        try:
            return self.toolbox.load_version(version)
        except OSError:
            raise KhaelorError(f"cannot rewind: the version of {os.path.relpath(real, self.root)}"
                               " that write or edit kept is gone (pruned after 30 days)") from None

    def moves_head(self) -> bool:
        before = (self.target["head"], self.target["branch"])
        return before != (self.now["head"], self.now["branch"])

    def describe(self, kept=()) -> str:
        """What the rewind does (`kept`: left as is), as markdown (/rewind settles it so): one item
        per change, names in code spans, so neither a line break nor an `__init__.py` is lost."""
        step = self.state.steps[self.number - 1]
        lines = [f"Rewinding to before step {self.number} ({step['kind']}"
                 f" `{' '.join(step['what'].split())[:60]}`):"]
        for restore in self.restores:
            verb = "delete" if restore.mode == "000000" else "write back"
            mark = "  (you changed it after the agent's last step)" if restore.user_changed else ""
            lines.append(f"- {'keep' if restore.path in kept else verb} `{restore.path}`{mark}")
        if self.moves_head():
            branch = self.target["branch"] or "detached HEAD"
            lines.append(f"- HEAD back to {branch} at {self.target['head'][:12]}")
        if len(lines) == 1:
            lines.append("- nothing differs: the work tree is as it was")
        return "\n".join(events.visible_controls(line, one_line=True) for line in lines)

    def start(self, overwrite: bool) -> None:
        """Files the user changed after the agent's last step are kept unless `overwrite`. The
        checkpoint taken by plan() is the rewind's own: it goes into the log first."""
        self.kept = [r.path for r in self.restores if r.user_changed and not overwrite]
        self.todo = [r for r in self.restores if r.path not in self.kept]
        self.bus.emit("CheckpointRecorded", step=events.REWIND_STEP,
                      reason="before a rewind", **self.now)

    def write(self) -> None:
        """The writes and the checkpoint after them (no events: this may run in a thread)."""
        checkpoints = self.toolbox.checkpoints
        self.problems = checkpoints.apply(self.root, self.todo)
        if self.repo and self.target["git"]:
            try:
                checkpoints.restore_head(self.repo, self.target)
            except KhaelorError as error:
                self.problems.append(str(error))
        self.after = checkpoints.take(self.now["tree"])

    def finish(self) -> str:
        n_undone = len(self.state.steps) - self.number
        # the newest step is the rewind itself, which is not undone
        undone = step_lines(self.state)[1:n_undone + 1][::-1]
        restored = [r.path for r in self.todo]
        note = rewound_note(self.number, undone, restored, self.kept)
        self.bus.emit("Rewound", step=self.number, undone=undone,
                      restored=restored, kept=self.kept, text=note, **typed_line())
        self.bus.emit("CheckpointRecorded", step="", reason="after a rewind", **self.after)
        # what was done to each file (a file it deleted is not "restored")
        deleted = sum(restore.mode == "000000" for restore in self.todo)
        done = {"restored": len(restored) - deleted, "deleted": deleted, "kept": len(self.kept)}
        said = ", ".join(f"{n} {verb}" for verb, n in done.items() if n) or "no file changed"
        files = events.counted(len(restored) + len(self.kept), "file")
        report = f"Rewound to before step {self.number} ({files}): {said}."
        if self.kept:
            kept = events.visible_controls(", ".join(self.kept), one_line=True)
            report += f"\n\nKept as you left them (changed after the agent's last step): {kept}"
        if self.problems:
            report += "\n\nNot restored: " + events.visible_controls("; ".join(self.problems), True)
        return report + ("\n\nWhat a rewind cannot bring back: commits already pushed, files"
                         " outside the project, what commands did to ignored files or to"
                         " untracked files over 20 MB; commits reset away stay in the reflog.")


def rewound_note(number: int, undone: list, restored: list, kept: list) -> str:
    """What the model reads with its next request."""
    lines = [f"[khaelor: the user rewound the work tree to before step {number};"
             " these steps are undone:"]
    lines += [f"- {line.strip()}" for line in undone]
    if restored:
        lines.append(f"Files written back or deleted: {', '.join(restored[:50])}.")
    if kept:
        lines.append(f"Kept as the user changed them: {', '.join(kept[:50])}.")
    lines.append("HEAD, the branch and the index are as they were then. Read a file again"
                 " before you edit it. (This note comes from khaelor, not from the user.)]")
    return "\n".join(lines)


def cmd_rewind(argv: list, home: Path, project_root: Path) -> int:
    parser = argparse.ArgumentParser(
        prog="khaelor rewind",
        description="Put the work tree back as it was before a step of a session"
                    " (default: the newest session's last step that changed something).")
    parser.add_argument("step", nargs="?", type=int, help="the step, as --list numbers it")
    parser.add_argument("--list", action="store_true", help="list the steps, newest first")
    parser.add_argument("-r", "--resume", metavar="SESSION", help="a session id (or prefix)")
    parser.add_argument("--yes", action="store_true",
                        help="do not ask (files you changed since are kept)")
    args = parser.parse_args(argv)
    import tools
    args.continue_ = not args.resume
    try:
        store = open_session(args, home, project_root, "no session in this project yet")
    except UsageError as error:
        # no session at all is nothing to rewind (1) and an empty list (0), as with a session
        if args.resume:
            raise
        if args.list:
            print("no steps that changed the work tree")
            return EXIT_OK
        raise KhaelorError(f"nothing to rewind: {error}") from None
    try:
        bus = events.Bus(store)
        toolbox = tools.Toolbox(tools.Workspace(project_root), home, bus.emit,
                                lambda: bus.store.state)
        return rewind_session(args, bus, toolbox)
    finally:
        close_session(store)


def rewind_session(args, bus, toolbox) -> int:
    state = bus.store.state
    if args.list:
        print("\n".join(step_lines(state)) or "no steps that changed the work tree")
        return EXIT_OK
    # no STEP: the last that changed something (0 is no step: Rewind.plan says so)
    number = last_changing_step(state) if args.step is None else args.step
    # nothing to do is exit 1, as git commit's "nothing to commit": `rewind && …` stops there
    if number is None or not state.steps:
        raise KhaelorError(f"nothing to rewind: {why_nothing_to_rewind(state)}")
    rewind = Rewind(bus, toolbox, number)
    rewind.plan()
    print(rewind.describe())
    if not rewind.restores and not rewind.moves_head():
        return EXIT_FAILED
    overwrite = False
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError("not rewound: run it on a terminal, or with --yes")
        if not confirm("Rewind?"):
            return EXIT_OK
        if any(restore.user_changed for restore in rewind.restores):
            overwrite = confirm("Overwrite the files you changed since?")
    rewind.start(overwrite)
    rewind.write()
    print(rewind.finish())
    return EXIT_OK


# ------------------------------------ custom slash commands (Claude Code's command files)

# per directory: a huge tree must not slow start-up
MAX_COMMAND_FILES = 500
# the front matter read; the rest is ignored
COMMAND_FIELDS = ("description", "argument-hint", "model", "allowed-tools")
COMMAND_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(?::[A-Za-z0-9][\w.-]*)*$")
PLACEHOLDER = re.compile(r"\$(ARGUMENTS|[1-9])(?!\d)")


class CustomCommand(NamedTuple):
    # "/fixissue"; a subdirectory gives "/frontend:component"
    name: str
    # the Markdown file
    path: Path
    # where it came from, as /help shows it: "project .claude/commands"
    source: str
    # the body after the front matter: $ARGUMENTS and $1…$9 are filled in
    template: str
    # front matter, else the body's first line
    description: str
    # front matter: "[issue-number]"
    argument_hint: str
    # front matter: the model for this command's turn; "" for the session's
    model: str
    # front matter: shown, never granted (a command file is a prompt only)
    allowed_tools: str


def command_dirs(home: Path, project_root: Path) -> list[tuple[Path, str, bool]]:
    """(directory, source label, in the repository) in precedence order: a later one wins a name,
    so the project's commands override the user's, as in Claude Code."""
    return [(Path.home() / ".claude/commands", "user ~/.claude/commands", False),
            (home / "commands", "user $KHAELOR_HOME/commands", False),
            (project_root / ".claude/commands", "project .claude/commands", True),
            (project_root / ".khaelor/commands", "project .khaelor/commands", True)]


def load_commands(home: Path, project_root: Path) -> dict[str, CustomCommand]:
    """Every command file by name. Built-in commands keep their names; a repository's command file
    that resolves outside the project (a symlink) is not read, as with instruction files."""
    root = project_root.resolve()
    commands = {}
    for directory, source, in_repository in command_dirs(home, project_root):
        for path in command_files(directory):
            resolved = path.resolve()
            inside = resolved == root or root in resolved.parents
            if in_repository and not inside:
                continue
            parts = path.relative_to(directory).with_suffix("").parts
            name = "/" + ":".join(parts)
            if name in COMMANDS or not COMMAND_NAME.match(name[1:]):
                continue
            try:
                # the path judged (a link swapped in since is not followed); a FIFO is skipped
                data = events.read_regular(resolved, MAX_CONFIG_BYTES, os.O_NOFOLLOW)[0]
                text = data.decode("utf-8", "replace")
            except OSError:
                continue
            commands[name] = parse_command(name, path, source, text)
    return commands


def command_files(directory: Path) -> list[Path]:
    found = []
    # symlinked folders are not followed
    for folder, subfolders, names in os.walk(directory):
        subfolders.sort()
        for name in sorted(names):
            if name.endswith(".md"):
                found.append(Path(folder) / name)
        if len(found) >= MAX_COMMAND_FILES:
            break
    return found[:MAX_COMMAND_FILES]


def parse_command(name: str, path: Path, source: str,
                  text: str) -> CustomCommand:
    fields, body = front_matter(text)
    description = fields.get("description") or first_line(body)[:80]
    return CustomCommand(name, path, source, body, description,
                         argument_hint=fields.get("argument-hint", ""),
                         model=fields.get("model", ""),
                         allowed_tools=fields.get("allowed-tools", ""))


def first_line(text: str) -> str:
    """The first line that is not blank, without a Markdown heading's #."""
    line = next((line for line in text.splitlines() if line.strip()), "")
    return line.strip().lstrip("#").strip()


def front_matter(text: str) -> tuple[dict, str]:
    """The `---` block at the top of a command file, as the tiny YAML subset command files use:
    one `key: value` per line, the value plain or quoted. A list such as `[issue-number]` stays
    text (it is shown, not interpreted). No closing `---`: it is all body."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n")
    lines = text.split("\n")
    if lines[0].rstrip() != "---":
        return {}, text
    closing = (i for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "..."))
    end = next(closing, None)
    if end is None:
        return {}, text
    fields = {}
    for line in lines[1:end]:
        key, colon, value = line.partition(":")
        key = key.strip()
        top_level = colon and not line[:1].isspace()
        if top_level and key in COMMAND_FIELDS:
            fields[key] = yaml_scalar(value.strip())
    return fields, "\n".join(lines[end + 1:]).lstrip("\n")


def yaml_scalar(value: str) -> str:
    """'it''s' → it's, "a \\"b\\"" → a "b", plain # comment → plain (a comment may follow
    quotes too)."""
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
    except ValueError:
        # an unbalanced quote: plain words
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


def match_command(text: str,
                  commands: dict) -> tuple[CustomCommand | None, str]:
    """("/fixissue 123", commands) → (the command, "123"); (None, "") for anything else."""
    # the arguments may start on the next line
    words = text.split(None, 1)
    command = commands.get(words[0]) if words else None
    if command is None:
        return None, ""
    return command, "".join(words[1:]).strip()


def expand_headless(prompt: str, settings: dict, home: Path,
                    project_root: Path) -> str:
    """`khaelor -p "/fixissue 123"`: the template, filled in, is what is sent. Its `model` applies
    to the run unless --model was given."""
    if not prompt.lstrip().startswith("/"):
        return prompt
    command, arguments = match_command(prompt, load_commands(home, project_root))
    if command is None:
        return prompt
    if command.model and settings.get("model_flag") is None:
        settings["model"] = command_model(command, settings["prices"])
    return expand_command(command, arguments)


def command_model(command: CustomCommand, prices: dict) -> str | None:
    """A command file's `model:` as the API names it (`haiku` → its id), None when it names none;
    a model khaelor does not know is a UsageError that names the file, before anything is sent."""
    if not command.model:
        return None
    try:
        return model_choice(command.model, prices)
    except UsageError as error:
        raise UsageError(f"{command.path}: {error}") from None


def describe_command(command: CustomCommand) -> str:
    """One line for /help and the / menu: hint, description, and where it came from."""
    parts = [command.argument_hint, command.description]
    text = " ".join(part for part in parts if part)
    return f"{text} ({command.source})".strip()


# ---------------------------------------------------------------- headless

def help_epilog() -> str:
    """Subcommands, the interactive keys and the instruction files (imported only for --help)."""
    import context
    import ui
    keys = "\n".join(f"  {key:<30} {what}" for key, what in ui.KEY_HELP)
    names = ", ".join(context.INSTRUCTION_FILES)
    commands = ""
    for name, (_, usage, what) in SUBCOMMANDS.items():
        commands += f"  {f'khaelor {name} {usage}'.strip()}\n      {what}\n"
    return (f"subcommands (a first word that names a subcommand is that subcommand, as with"
            f" claude; `khaelor -- sessions` sends the word as a prompt):\n{commands}\n"
            f"interactive keys:\n{keys}\n"
            "\n"
            "instruction files: ~/.claude/CLAUDE.md, the first of"
            f" {names} in KHAELOR_HOME (~/.khaelor), the nearest one"
            " from the working directory up to the project root,"
            " then the nearest CLAUDE.local.md; @path imports are followed.\n"
            "custom commands: *.md in .khaelor/commands, .claude/commands,"
            " KHAELOR_HOME/commands and ~/.claude/commands"
            ' (khaelor -p "/name args" runs one headless).')


def parse_args(argv: list):
    wants_help = any(arg in ("-h", "--help") for arg in argv)
    parser = argparse.ArgumentParser(
        prog="khaelor",
        description="A terminal coding agent for Claude models.",
        epilog=help_epilog() if wants_help else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", "--print", dest="prompt", metavar="PROMPT", nargs="?", const="-",
                        help="run one task headless and exit (no PROMPT or '-': the prompt is"
                             " stdin; text piped in with a PROMPT follows it)")
    parser.add_argument("query", metavar="PROMPT", nargs="?",
                        help="the first message: the interactive UI starts with it sent"
                             " (with -c or -r: that session goes on with it); with -p, the task")
    parser.add_argument("--output-format", default="text", choices=("text", "json", "stream-json"))
    # Claude Code requires it with stream-json, so its scripts pass it; every event prints anyway
    parser.add_argument("--verbose", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--yes", action="store_true",
                        help="approve ordinary asks (never the floor, a secret or what no"
                             " checkpoint undoes)")
    parser.add_argument("-c", "--continue", dest="continue_", action="store_true",
                        help="continue the newest session")
    parser.add_argument("-r", "--resume", metavar="ID",
                        help="resume a session by id (a unique prefix is enough)")
    parser.add_argument("--model", metavar="ID")
    parser.add_argument("--aux-model", dest="aux_model", metavar="ID")
    parser.add_argument("--max-turns", dest="max_turns", type=positive_int, metavar="N")
    choices = setting_choices()
    parser.add_argument("--thinking", choices=choices["thinking"], help="how the model thinks,"
                        " from this run on (adaptive: as the model sees fit)")
    parser.add_argument("--effort", choices=choices["effort"], help="how hard the model works,"
                        " from this run on (default: the model's own)")
    # Claude Code's flags for scripts, spelled as it spells them (camelCase and kebab-case
    # both work); the two rule lists take their rules alike
    parser.add_argument("--append-system-prompt", dest="append_system_prompt", metavar="TEXT",
                        default="", help="add TEXT to the system prompt, as its own tier,"
                        " for this run")
    rules = {"nargs": "+", "action": "extend", "default": [], "metavar": "RULE"}
    parser.add_argument("--allowedTools", "--allowed-tools", dest="allowed_tools", **rules,
                        help='allow these Claude Code rules for this run, e.g. "Bash(git log:*)"'
                             " Read (space- or comma-separated; the hardline floor still refuses)")
    parser.add_argument("--disallowedTools", "--disallowed-tools", dest="disallowed_tools",
                        **rules, help="deny these Claude Code rules for this run, even under --yes")
    parser.add_argument("--permission-mode", dest="permission_mode", choices=events.MODES,
                        default="default", help="plan: only tools that read run; acceptEdits:"
                        " project files are written without asking")
    parser.add_argument("--version", action="version", version=f"khaelor {VERSION}")
    # every value here is text for the model or a name (no path): bytes that are not UTF-8, which
    # Python keeps as surrogates, become U+FFFD rather than a crash when the request is encoded
    args = parser.parse_args([os.fsencode(arg).decode("utf-8", "replace") for arg in argv])
    # `khaelor "query" -p` and `khaelor -p "query"` alike: -p alone took no PROMPT of its own
    if args.query is not None and args.prompt not in (None, "-"):
        parser.error("two prompts: give one, after -p or on its own")
    if args.query is not None and args.prompt == "-":
        args.prompt, args.query = args.query, None
    return args


def positive_int(text: str) -> int:
    """--max-turns N: 0 or less would stop the run before its first request."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return number


def split_tool_rules(values: list[str]) -> list[str]:
    """`"Bash(git log:*)" "Read,Edit"` → ["Bash(git log:*)", "Read", "Edit"]: Claude Code's lists
    are separated by spaces or commas, except inside a rule's parentheses."""
    rules = []
    for value in values:
        depth = 0
        current = ""
        for ch in value:
            if ch == "(":
                depth += 1
            elif ch == ")" and depth > 0:
                depth -= 1
            if depth == 0 and (ch == "," or ch.isspace()):
                if current:
                    rules.append(current)
                current = ""
            else:
                current += ch
        if current:
            rules.append(current)
    return rules


def flag_layers(args, project_root: Path) -> tuple:
    """--allowedTools and --disallowedTools as Claude Code rule layers, for this run only. They are
    the user's own (typed by the user), so they grant; as with Claude Code's files a deny outranks
    every allow, and the hardline floor is beneath them all."""
    layers = []
    for flag, action, dest in (("--allowedTools", "allow", "allowed_tools"),
                               ("--disallowedTools", "deny", "disallowed_tools")):
        rules = split_tool_rules(getattr(args, dest, None) or [])
        if rules:
            import permissions
            empty = permissions.Layer(flag, {}, "user", True, claude=True)
            root = os.path.realpath(project_root)
            layers.append(permissions.claude_rules(empty, {action: rules}, root))
    return tuple(layers)


def build_kernel(args, settings, store, bus, home, project_root, ask,
                 client=None, layers=None):
    """Wire the subsystems for one session (the modules are imported here, off the cold path).
    The toolbox is the session's own (what the model read, its edits, its processes), taken up
    from the log on resume; an interactive run keeps one client across /new and /resume."""
    import context
    import kernel
    import permissions
    import sandbox
    import tools
    if layers is None:
        layers = permission_layers(home, project_root, settings["extra_layers"])

    def grant(rule: dict) -> None:
        path = grants_path(home, project_root)
        write_json_atomic(path, permissions.add_grant(read_config(path), rule))
        fresh = permission_layers(home, project_root, settings["extra_layers"])
        kernel_.rules = permissions.load_rules(fresh)

    toolbox = tools.Toolbox(tools.Workspace(project_root), home, bus.emit,
                            lambda: bus.store.state)
    toolbox.workspace.pass_env = settings["pass_env"]
    # what an instruction file may not import: a secret file, or what the read rules deny or ask
    hidden = permissions.rule_paths(permissions.load_rules(layers))["hide_paths"]
    ctx = context.Context(project_root=project_root, cwd=Path.cwd(), home=home,
                          model=current_model(store, settings), aux_model=settings["aux_model"],
                          tool_schemas=toolbox.schemas, workspace=toolbox.workspace,
                          user_home=Path.home(),
                          is_secret=sandbox.secret_matcher(sandbox.SECRET_NAMES, hidden),
                          mask=toolbox.mask,
                          append_system=getattr(args, "append_system_prompt", ""),
                          prune_at=settings["context"].get("prune_at", context.PRUNE_AT_TOKENS),
                          thinking=settings["thinking"], effort=settings["effort"],
                          show_thinking=shows_thinking(args, settings),
                          # config.json's max_output_tokens is at least 1 when set
                          max_tokens=settings["max_output_tokens"] or context.MAX_OUTPUT_TOKENS)
    if not client:
        client = new_client(lambda text: bus.emit("Status", text=text))
    kernel_ = kernel.Kernel(bus=bus, model=client, toolbox=toolbox, ctx=ctx,
                            rules=permissions.load_rules(layers), project_root=project_root,
                            ask=ask, grant=grant, yes=args.yes, max_turns=settings["max_turns"],
                            permission_mode=getattr(args, "permission_mode", "default"))
    return kernel_


def emit_created(bus, settings, project_root: Path) -> None:
    """SessionCreated, the first event of a log (-p's start, the UI's first message)."""
    bus.emit("SessionCreated", cwd=str(Path.cwd()), project_root=str(project_root),
             model=settings["model"], aux_model=settings["aux_model"], version=VERSION)


def shows_thinking(args, settings) -> bool:
    """show_thinking from config, else on where someone watches: the UI, and stream-json (which
    carries the thinking blocks); off for text and json, which never show it (a faster first
    token)."""
    if settings["show_thinking"] is not None:
        return settings["show_thinking"]
    return args.prompt is None or args.output_format == "stream-json"


def record_reasoning(bus, store, wanted: dict, **typed) -> None:
    """ThinkingChanged for what `wanted` sets differently from the log (flags, or a choice made
    before the log began), so the session keeps it; `typed`: typed_line() (/thinking, /effort)."""
    recorded = store.state.reasoning
    changed = {key: value for key, value in wanted.items() if recorded.get(key) != value}
    if changed:
        bus.emit("ThinkingChanged", **changed, **typed)


def typed_line() -> dict:
    """{"typed": the slash command line running}, for the event that is its confirmation (its ◇
    line), so the UI shows the line above it, live and replayed; {} outside a command."""
    line, _ = TYPED.get()
    return {"typed": line} if line else {}


def reasoning_label(request: dict) -> str:
    """How a request asks the model to think: "effort high", "thinking off", "" (its defaults)."""
    parts = []
    thinking = (request.get("thinking") or {}).get("type")
    if thinking == "disabled":
        parts.append("thinking off")
    if thinking == "enabled":
        budget = request["thinking"]["budget_tokens"]
        parts.append(f"thinking budget {budget}")
    effort = (request.get("output_config") or {}).get("effort")
    if effort:
        parts.append(f"effort {effort}")
    return " · ".join(parts)


def new_client(on_status):
    import model
    api_key = os.environ.get("ANTHROPIC_API_KEY") or None
    auth_token = os.environ.get("ANTHROPIC_AUTH_TOKEN") or None
    read_timeout = env_seconds("KHAELOR_READ_TIMEOUT", model.READ_TIMEOUT_S)
    return model.ModelClient(api_key=api_key, auth_token=auth_token,
                             on_status=on_status, read_timeout=read_timeout)


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment (KHAELOR_READ_TIMEOUT=30), else
    `default`."""
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


class StreamJson:
    """--output-format stream-json: every event the log keeps, one JSON line each, as it happens,
    and among them Claude Code's messages for scripts written for `claude -p` (`system` init,
    then an `assistant` message after each response and a `user` one for each tool's result, the
    content as the conversation holds it). When the reader has gone (`| head -1`) the run stops as
    Ctrl-C stops it (the log says it was interrupted), and nothing more is written."""

    def __init__(self, store):
        import asyncio
        self.run = asyncio.current_task()
        self.reader_gone = False
        self.store = store

    def __call__(self, event: dict) -> None:
        if event["type"] in events.DURABLE:
            self.write(event)
            self.write(self.claude_message(event))

    def claude_message(self, event: dict) -> dict | None:
        messages = self.store.state.messages
        last = messages[-1] if messages else {"role": "", "content": [{}]}
        if event["type"] == "ModelResponseCompleted" and last["role"] == "assistant":
            return self.message("assistant", last["content"])
        block = last["content"][-1]
        answered = last["role"] == "user" and block.get("tool_use_id") == event.get("tool_use_id")
        if event["type"] in events.TOOL_RESULT_EVENTS and answered:
            return self.message("user", [block])
        return None

    def message(self, role: str, content: list) -> dict:
        return {"type": role, "message": {"role": role, "content": content},
                "parent_tool_use_id": None, "session_id": self.store.session_id}

    def write(self, line: dict | None) -> None:
        if line is None or self.reader_gone:
            return
        try:
            print(json.dumps(line, ensure_ascii=False), flush=True)
        except BrokenPipeError:
            self.reader_gone = True
            stdout_to_devnull()
            self.run.cancel()

    def init(self, kernel_, args) -> None:
        """Claude Code's first line: what this run is (a script takes its session_id from it)."""
        tools = [schema["name"] for schema in kernel_.toolbox.schemas]
        self.write({"type": "system", "subtype": "init", "session_id": self.store.session_id,
                    "cwd": os.getcwd(), "model": kernel_.ctx.model, "tools": tools,
                    "permissionMode": getattr(args, "permission_mode", "default"),
                    "mcp_servers": [], "slash_commands": []})


def print_status(event: dict) -> None:
    if event["type"] == "Status":
        print(f"khaelor: {event['text']}", file=sys.stderr)
    elif event["type"] == "UserMessageCreated":
        for mention, why in event.get("skipped") or []:
            print(f"khaelor: @{mention} not attached: {why}", file=sys.stderr)
    elif event["type"] == "PermissionDenied" and event.get("by") == "policy":
        # (a call asked of nobody is said where it is asked)
        print(f"khaelor: refused {events.visible_controls(event['reason'], one_line=True)}",
              file=sys.stderr)
    elif refused_outside(event):
        path = events.visible_controls(event["meta"]["path"], one_line=True)
        print(f"khaelor: refused {event['name']} of {path}: outside the project, which --yes"
              " does not approve", file=sys.stderr)
    elif refused_by_sandbox(event):
        # (the command ran, confined: what it was refused is in the note its result ends with)
        needed = re.search(r"it would need (.*?)\. The same command", event["output"], re.S)
        what = events.visible_controls(needed[1] if needed else "more", one_line=True)
        print(f"khaelor: the sandbox refused a command: it would need {what}", file=sys.stderr)


def refused_outside(event: dict) -> bool:
    """A tool call granted under --yes that then named a path outside the project: refused by
    the toolbox, not the policy, and as much a refusal."""
    return event["type"] == "ToolFailed" and event["meta"].get("error") == "outside"


def refused_by_sandbox(event: dict) -> bool:
    """A command that ran, confined, and was refused an access it needed."""
    return (event["type"] in ("ToolCompleted", "ToolFailed")
            and bool(event["meta"].get("sandbox_refused")))


def run_print(args, home: Path, project_root: Path) -> int:
    """-p: start-up around the SDK import, then one task headless."""
    import asyncio

    import model
    # duration_ms of the result counts from here
    args.started = time.monotonic()
    # these two are quick; an exit during the import must wait for it
    require_api_key()
    settings = load_settings(args, home, project_root)
    # the SDK import (~2 s) overlaps with the rest of start-up
    model.preload()
    prune_in_background(home)
    args.typed = read_prompt(args)
    args.prompt = expand_headless(args.typed, settings, home, project_root)
    store = open_session(args, home, project_root)
    for warning in store.warnings:
        print(f"khaelor: warning: {warning}", file=sys.stderr)
    return asyncio.run(run_headless(args, settings, store, home, project_root))


async def run_headless(args, settings, store, home, project_root) -> int:
    import asyncio
    bus = events.Bus(store)
    stream = StreamJson(store)
    if args.output_format == "stream-json":
        bus.subscribe(stream)
    bus.subscribe(print_status)
    args.streamed = args.output_format == "text" and sys.stdout.isatty()
    if args.streamed:
        bus.subscribe(StreamedAnswer())
    layers = permission_layers(home, project_root, settings["extra_layers"])
    for notice in start_notices(settings, layers):
        print(f"khaelor: {notice}", file=sys.stderr)

    async def ask(request: dict):
        if request["capability"] == events.LOOP_CAPABILITY:
            # a doom loop stops the run; TaskFailed says why
            return "deny", ""
        # Silence is not consent: with nobody to answer, an ask is a denial.
        command = events.visible_controls(request["descriptor"], one_line=True)
        how = "allow it with `khaelor permissions`"
        if flag := allowed_tools_flag(request):
            how = f"allow it with --allowedTools {flag}"
        if request.get("why"):
            # (what destroys work or may run what a deny refuses suggests no rule: nothing allows
            # it but a person; a secret's read does)
            why = events.visible_controls(request["why"], one_line=True)
            allow = f". To run it, {how}" if flag else ""
            print(f"khaelor: denied `{command}`: nobody to ask in -p mode, and {why}{allow}",
                  file=sys.stderr)
            return "nobody", ""
        print(f"khaelor: denied `{command}`: not allowed without asking,"
              f" and nobody to ask in -p mode. To run it, {how},"
              " or pass --yes (it does not cover what destroys work"
              " in the repository)", file=sys.stderr)
        return "nobody", ""

    kernel_ = build_kernel(args, settings, store, bus, home, project_root,
                           ask, layers=layers)
    kernel_.toolbox.asks_nobody = not args.yes
    if args.output_format == "stream-json":
        stream.init(kernel_, args)
    resumed = bool(store.events)
    if not resumed:
        emit_created(bus, settings, project_root)
    record_reasoning(bus, store, settings["reasoning_flags"])
    kernel_.repair()
    cancel_on_sigterm(asyncio.current_task())
    try:
        await kernel_.record_baseline("resume" if resumed else "session start")
        # a command file's line (`-p "/fix 12"`) is what a resumed session shows
        kernel_.submit(args.prompt, typed=args.typed.strip() if args.typed != args.prompt else "")
        step = await kernel_.run()
    except asyncio.CancelledError:
        if stream.reader_gone:
            return EXIT_PIPE
        # Ctrl-C or SIGTERM (the run is cancelled): a script still gets the result object
        step = "interrupted"
    finally:
        await kernel_.toolbox.close()
        await kernel_.model.close()
        close_session(store)
    args.request = kernel_.request
    return report(args, store, step, settings["prices"])


# Claude Code's tool for a file rule, in --allowedTools (commands: Bash).
CLAUDE_FILE_TOOLS = {"file.read": "Read", "file.write.project": "Edit"}


def allowed_tools_flag(request: dict) -> str:
    """The --allowedTools value that would allow this asked call, shell-quoted:
    "Bash(touch:*)", "Edit(calc.py)"; "" for a path outside the project, and for a call no rule
    is suggested for (a pipe into sh: a rule of its descriptor would allow nothing)."""
    import shlex
    capability = request["capability"]
    pattern = (request.get("suggestion") or {}).get("pattern") or ""
    tool = CLAUDE_FILE_TOOLS.get(capability, "Bash")
    hidden = events.has_hidden_characters(pattern) or "\n" in pattern
    if capability == "filesystem.outsideProject" or hidden or not pattern:
        # a flag to paste must show every character it grants
        return ""
    if tool == "Bash" and pattern.endswith(" *"):
        pattern = pattern[:-2] + ":*"
    rule = f"{tool}({pattern})"
    if re.search(r'["$`\\!]', rule):
        return shlex.quote(rule)
    return f'"{rule}"'


class StreamedAnswer:
    """-p with the answer going to a terminal: the text appears as it is written, as it does in the
    interactive UI (a pipe or file gets only the final answer, once, at the end). An escape sequence
    split across two deltas is held back until it ends, so it is stripped whole."""

    def __init__(self):
        # the start of a control sequence the next delta may finish
        self.pending = ""
        # the reply being written has shown text: sent again, it is shown again
        self.shown = False

    def __call__(self, event: dict) -> None:
        if event["type"] == "TextDelta":
            self.shown = True
            sys.stdout.write(self.clean(event["text"]))
            sys.stdout.flush()
        elif event["type"] == "ModelTextBlockCompleted" and event["text"]:
            # one blank line after the block, counting the newlines it ended with
            ending = "\n" * (2 - min(2, len(event["text"]) - len(event["text"].rstrip("\n"))))
            sys.stdout.write(for_terminal(self.pending, sys.stdout) + ending)
            self.pending = ""
        elif event["type"] == "ModelResponseCompleted":
            self.shown = False
        elif event["type"] == "ModelRequestFailed" and event.get("retrying"):
            self.pending = ""
            if self.shown:
                sys.stdout.write("\n[the reply broke off; it is being written again]\n\n")
            self.shown = False

    def clean(self, text: str) -> str:
        text = self.pending + text
        self.pending = ""
        start = max(map(text.rfind, events.ESCAPE_STARTS))
        unfinished = start >= 0 and not re.compile(events.ESCAPE_SEQUENCE).match(text, start)
        # held back for the next delta, unless it is past any real sequence's length
        if unfinished and len(text) - start < 4096:
            self.pending = text[start:]
            text = text[:start]
        return for_terminal(text, sys.stdout)


# any other end: error_during_execution
RESULT_SUBTYPES = {"done": "success", "max-turns": "error_max_turns",
                   "interrupted": "error_interrupted"}
INTERRUPTED = "interrupted by the user (Ctrl-C)"


# the signal (SIGTERM, SIGHUP) ending this run, once one came: it is named and exits 128 + N
SIGNALLED = []


def interrupted_exit() -> int:
    return 128 + SIGNALLED[-1] if SIGNALLED else EXIT_INTERRUPTED


def failure(state, step: str) -> str | None:
    """Why the run did not finish, or None when it did."""
    if step == "interrupted":
        return f"terminated by {SIGNALLED[-1].name}" if SIGNALLED else INTERRUPTED
    if step == "done":
        return None
    return state.failure_reason


def summed_usage(usage_by_model: dict) -> dict:
    """Every model's usage added up, key by key (events.USAGE_KEYS)."""
    return {key: sum(usage[key] for usage in usage_by_model.values())
            for key in events.USAGE_KEYS}


def permission_denials(store) -> list[dict]:
    """The tool calls of this run that were refused (by a rule, the floor, a person, or nobody to
    ask, or a command the sandbox refused an access), as Claude Code lists them in its result."""
    runs = [e["seq"] for e in store.events if e["type"] == "UserMessageCreated"]
    since = runs[-1] if runs else 0
    requested = {}
    denials = []
    for event in store.events:
        if event["type"] == "ToolRequested":
            requested[event["tool_use_id"]] = event
        elif event["seq"] > since and (event["type"] == "PermissionDenied"
                                       or refused_outside(event) or refused_by_sandbox(event)):
            call = requested.get(event["tool_use_id"], {})
            denials.append({"tool_name": call.get("name"), "tool_use_id": event["tool_use_id"],
                            "tool_input": call.get("input")})
    return denials


def result_object(args, store, step: str, prices: dict) -> dict:
    """What `--output-format json` prints, and `stream-json` ends with: Claude Code's result fields
    and KHAELOR's own, as listed below. A cost is null when a model has no known price: never
    guessed."""
    state = store.state
    cost = events.cost(store.state.usage, prices)
    totals = summed_usage(state.usage)
    # in Claude Code's key names
    usage = {"input_tokens": totals["input_tokens"],
             "cache_creation_input_tokens": totals["cache_write_tokens"],
             "cache_read_input_tokens": totals["cache_read_tokens"],
             "output_tokens": totals["output_tokens"]}
    started = getattr(args, "started", None) or time.monotonic()
    elapsed_s = time.monotonic() - started
    # the last request's: the setting as the model took it (null: the model's default)
    request = getattr(args, "request", None) or {}
    thinking = (request.get("thinking") or {}).get("type")
    effort = (request.get("output_config") or {}).get("effort")
    # part of output_tokens (counted once, there), where the API said
    thought = [usage["thinking_tokens"] for usage in state.usage.values()
               if "thinking_tokens" in usage]
    thinking_tokens = sum(thought) if thought else None
    reason = failure(state, step)
    return {
        # Claude Code's
        "type": "result",
        "subtype": RESULT_SUBTYPES.get(step, "error_during_execution"),
        "is_error": step != "done",
        "result": state.answer or "",
        "session_id": store.session_id,
        "num_turns": state.responses_in_turn,
        "duration_ms": round(elapsed_s * 1000),
        "total_cost_usd": cost,
        "usage": usage,
        "permission_denials": permission_denials(store),
        # (Claude Code's error results list why: `jq -r '.errors[]'`)
        "errors": [reason] if reason else [],
        # KHAELOR's own
        "error": reason,
        "cost_usd": cost,
        "usage_by_model": state.usage,
        "thinking": thinking,
        "effort": effort,
        "thinking_tokens": thinking_tokens,
    }


def say_unstarted(args, message: str) -> None:
    """Why the program ends before a run could (no API key, a bad config, model or --resume id, a
    signal): on stderr, and for -p under --output-format json or stream-json as the result object,
    so a script has its answer: is_error, the message as its result, nothing spent."""
    print(f"khaelor: {message}", file=sys.stderr)
    if args is None or args.prompt is None or args.output_format == "text":
        return
    nothing = argparse.Namespace(state=events.replay([]), session_id=None, events=[])
    nothing.state.answer = nothing.state.failure_reason = message
    print(json.dumps(result_object(args, nothing, "unstarted", {}), ensure_ascii=False))


def report(args, store, step: str, prices: dict) -> int:
    state = store.state
    args.reported = True
    reason = failure(state, step)
    streamed = getattr(args, "streamed", False)
    if args.output_format in ("json", "stream-json"):
        print(json.dumps(result_object(args, store, step, prices), ensure_ascii=False), flush=True)
    elif args.output_format == "text" and state.answer and not streamed:
        # one final newline, whatever the answer ended with (as `$(…)` reads it)
        print(for_terminal(state.answer.rstrip("\n"), sys.stdout))
    if step == "done":
        return EXIT_OK
    print(f"khaelor: {reason}", file=sys.stderr)
    if step == "interrupted":
        return interrupted_exit()
    return EXIT_FAILED


def read_prompt(args) -> str:
    """-p's prompt: stdin for `-p` alone or `-p -`; with a PROMPT, the text piped in (as in
    `git diff | khaelor -p "write the commit message"`) follows it, as Claude Code has it."""
    if args.prompt != "-":
        prompt = args.prompt
        piped = piped_input()
        if piped.strip():
            prompt = f"{prompt}\n\n{piped}"
    elif sys.stdin.isatty():
        raise UsageError('-p without a PROMPT reads it from a pipe; pass -p "what to do"')
    else:
        prompt = stdin_text()
    if not prompt.strip():
        raise UsageError('the prompt is empty; pass -p "what to do"'
                         " or pipe it with -p -")
    return prompt


def piped_input() -> str:
    """What a pipe or a file on stdin holds; nothing from a terminal, /dev/null or a socket. A pipe
    silent for STDIN_WAIT_S (a CI runner's, which never closes) is left as it is."""
    import select
    import stat
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return ""
    if stat.S_ISREG(mode):
        return stdin_text()
    if not stat.S_ISFIFO(mode):
        return ""
    ready, _, _ = select.select([0], [], [], STDIN_WAIT_S)
    if not ready:
        print(f"khaelor: nothing came on stdin in {STDIN_WAIT_S:.0f} s; going on without it"
              " (< /dev/null skips the wait)", file=sys.stderr)
        return ""
    return stdin_text()


def stdin_text() -> str:
    """All of stdin, bytes that are not UTF-8 shown as U+FFFD (they cannot go to the API)."""
    return sys.stdin.buffer.read().decode("utf-8", "replace")


def require_api_key() -> None:
    has_key = os.environ.get("ANTHROPIC_API_KEY")
    has_token = os.environ.get("ANTHROPIC_AUTH_TOKEN")
    if not (has_key or has_token):
        raise UsageError("ANTHROPIC_API_KEY is not set; export it"
                         " (console.anthropic.com → API keys) and run again")


# ---------------------------------------------------------------- interactive


def user_shell():
    """The user's own `!` commands run as the user would run them: the sandbox holds what the
    model runs (a sandbox.Confine, built here so that a cold start does not import sandbox)."""
    import sandbox
    return sandbox.Confine(network=True, secrets=True, unconfined=True)


class Session:
    """The interactive controller the UI drives (ui.Controller): one kernel at a time, a turn as a
    task, permission questions as futures the panel resolves, and the slash-command table."""

    def __init__(self, args, settings, home: Path, project_root: Path):
        self.args = args
        self.settings = settings
        self.home = home
        self.project_root = project_root
        # the UI's subscribers: they carry over to the next session
        self.subscribers = []
        # the running turn's task
        self.turn = None
        # tool_use_id -> the future the permission panel resolves
        self.answers = {}
        self.client = new_client(self.show_status)
        # the current session's kernel (attach builds it) and log
        self.kernel = None
        self.store = None
        # command files, read once at start as Claude Code does
        self.custom = load_commands(home, project_root)
        self.command_names = sorted([*COMMANDS, *self.custom])
        self.command_descriptions = {name: f"{usage} {text}".strip()
                                     for name, (_, usage, text) in COMMANDS.items()}
        for name, command in self.custom.items():
            self.command_descriptions[name] = describe_command(command)
        # typing "/effort " offers its levels (the UI's menu is the picker)
        self.command_choices = {f"/{key}": list(values)
                                for key, values in setting_choices().items()}
        import model
        known = known_model_ids(settings["prices"])
        self.command_choices["/model"] = [*model.MODEL_ALIASES, *known]
        self.closed = False
        # what stopped the kernel being built after the first frame (raised once the UI is gone)
        self.start_error = None
        # the task recording the git baseline, if one runs
        self.baseline = None
        # the task of a running `!` command
        self.shell = None
        # CommandAnswered payloads waiting for a log: none is written before the first message
        self.unlogged = []
        # @ completion: the files as last listed, and when (time.monotonic())
        self._files = None
        self._files_at = 0.0
        # the listing running in a thread, if one is
        self._listing = None
        # the query of the last @ completion
        self._mention_prefix = "\0"
        # status(): the last one, and the state it was folded from
        self._status_key, self._status = None, {}
        # the permission mode chosen in this process (--permission-mode, Shift-Tab, a plan
        # approved): the log records it, and each turn runs in the mode it began in
        self.mode = getattr(args, "permission_mode", "default")
        # thinking and effort chosen in this process (flags, /thinking, /effort): a session
        # attached or begun records them, so /new and /resume keep them too
        self.reasoning = dict(settings["reasoning_flags"])

    def attach(self, store, layers: list | None = None) -> None:
        """Make `store` the current session (start, /new, /resume); UI subscribers carry over. A
        session that died with tool calls waiting (say, a permission question nobody answered)
        goes on at once, so the question is asked again. `layers`: read_layers(), if read."""
        resumed = bool(store.events)
        bus = events.Bus(store)
        bus.subscribe(self.publish)
        # built first: if it fails (a permission file that cannot be read), nothing has switched
        if layers is None:
            layers = self.read_layers()
        kernel = build_kernel(self.args, self.settings, store, bus, self.home, self.project_root,
                              self.ask, client=self.client, layers=layers)
        self.layers = layers
        self.store = store
        self.bus = bus
        self.kernel = kernel
        self.kernel.repair()
        self.baseline = None
        if resumed:
            record_reasoning(self.bus, store, self.reasoning)
            self.record_mode()
            self.record_baseline("resume")
        state = store.state
        if state.turn_open and state.pending_tools:
            self.start_turn()

    def attach_after_first_frame(self, store) -> None:
        """A new session has nothing to replay or repair: the UI paints its first frame before the
        kernel is built (its modules take ~10 ms to import). The UI's tasks are queued before this
        timer comes due, so the frame comes first; a Status event then asks for the next frame,
        whose status line has the session's facts (the first shows only the mode)."""
        import asyncio
        self.store = store

        def attach() -> None:
            if self.closed:
                return
            try:
                self.attach(store)
            except KhaelorError as error:
                # said as at any start (exit 2), once the UI has given the terminal back
                self.start_error = error
                self.publish({"type": "StartFailed", "text": str(error)})
                return
            self.show_status("")
            self.send_first()
        asyncio.get_running_loop().call_later(0, attach)

    def send_first(self) -> None:
        """`khaelor "query"`: the message given on the command line, once the session is
        attached and the UI listens, as if typed: the UI runs `khaelor /help` as a command."""
        text, self.args.query = getattr(self.args, "query", None), None
        if text and text.strip() and not self.closed:
            self.publish({"type": "Typed", "text": text})

    def read_layers(self) -> list:
        """Read before /new or /resume leaves this session: a file that cannot be read (a FIFO
        planted in its place) is the command's error, and this session goes on."""
        return permission_layers(self.home, self.project_root, self.settings["extra_layers"])

    def say_start_notices(self) -> None:
        """Right after the first frame (they import the trust model); quitting first skips them."""
        if self.closed or self.kernel is None:
            return
        for notice in start_notices(self.settings, self.layers):
            self.bus.emit("Notice", text=notice)

    def show_status(self, text: str) -> None:
        """The model client's word on a retry or a wait, for the status line."""
        self.bus.emit("Status", text=text)

    def publish(self, event: dict) -> None:
        """Every event to the UI's subscribers (a copy of the list: one may unsubscribe)."""
        for fn in list(self.subscribers):
            fn(event)

    async def detach(self) -> None:
        """Leave the current session (/new, /resume, quit): end its turn, then close its log."""
        import asyncio
        self.interrupt()
        if self.turn is not None:
            await asyncio.gather(self.turn, return_exceptions=True)
        if self.baseline is not None:
            self.baseline.cancel()
        # its processes end with it, ProcessExited in its own log
        await self.toolbox.close()
        # the fsync off the loop: close's own then finds nothing left to write
        await self.store.sync_off_loop()
        close_session(self.store)
        # what commands answered in a session that never began goes with it: its log, which
        # would have kept them, is never written (nor is the session resumed next)
        self.unlogged = []

    @property
    def toolbox(self):
        """The current session's tools and their state."""
        return self.kernel.toolbox

    # -- ui.Controller
    @property
    def busy(self) -> bool:
        """A turn or a `!` command runs: the UI shows a spinner, and Esc stops it."""
        shell_runs = self.shell is not None and not self.shell.done()
        return self.working or shell_runs

    @property
    def working(self) -> bool:
        """A turn runs: the kernel alone knows (it answers submit with steering then)."""
        return self.kernel is not None and self.kernel.busy

    def subscribe(self, fn):
        self.subscribers.append(fn)
        return lambda: self.subscribers.remove(fn)

    def begin(self) -> None:
        """A new session's log is created by its first message, so opening and quitting leaves
        none."""
        if self.store.events:
            return
        emit_created(self.bus, self.settings, self.project_root)
        self.log_answers()
        # a /model before the first message
        if self.kernel.ctx.model != self.settings["model"]:
            self.bus.emit("ModelChanged", model=self.kernel.ctx.model)
        record_reasoning(self.bus, self.store, self.reasoning)
        self.record_mode()
        self.record_baseline("session start")

    def record_baseline(self, reason: str) -> None:
        """BaselineRecorded, from a task: its `git status` runs off the loop; detach cancels it."""
        import asyncio
        self.baseline = asyncio.get_running_loop().create_task(self.kernel.record_baseline(reason))
        self.baseline.add_done_callback(self.task_ended)

    def submit(self, text: str):
        command, arguments = match_command(text, self.custom)
        typed = ""
        # a command file: its template, filled in, is the message (the line typed is shown)
        if command is not None:
            typed, text = text.strip(), expand_command(command, arguments)
        self.begin()
        model = command_model(command, self.settings["prices"]) if command is not None else None
        self.kernel.submit(text, model, typed)
        if not self.working:
            self.start_turn()

    def record_mode(self) -> None:
        """ModeChanged when this process's mode is not the log's (a new log records a non-default
        one; the next user message binds it to its turn)."""
        if (self.store.state.mode or "default") != self.mode:
            self.bus.emit("ModeChanged", mode=self.mode)

    def cycle_mode(self) -> None:
        """Shift-Tab: default → acceptEdits → plan → default, as in Claude Code."""
        modes = events.MODES
        self.mode = modes[(modes.index(self.mode) + 1) % len(modes)]
        if self.store.events:
            self.record_mode()

    def proceed_with_plan(self, choice: str):
        """The plan is ready: go ahead in acceptEdits or default mode, or keep planning."""
        if choice not in ("acceptEdits", "default") and self.mode != "plan":
            # Shift-Tab left plan mode while the question was open: the status line says which
            return "The plan is not approved: say what to do next."
        if choice not in ("acceptEdits", "default"):
            return "Still in plan mode: say what to change in the plan (Shift-Tab leaves it)."
        self.mode = choice
        self.record_mode()
        self.submit("Go ahead with the plan.")

    def start_turn(self) -> None:
        """The turn as a task; Kernel.run supervises it (any error becomes TaskFailed)."""
        self.turn = self.kernel.start()
        self.turn.add_done_callback(self.turn_ended)

    def turn_ended(self, turn) -> None:
        """A message typed as the turn ended starts the next one; after an Esc, queued ones wait
        to go first with the next message."""
        self.task_ended(turn)
        if not turn.cancelled() and turn is self.turn and self.kernel.send_queued():
            self.start_turn()

    def task_ended(self, task) -> None:
        """The turn or the baseline task ended: a failure is said in one line, never lost."""
        if not task.cancelled() and task.exception() is not None:
            # in the conversation, whole: the status line cut it at the terminal's width
            self.bus.emit("Notice", text=f"error: {task.exception()}")

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

    def answer_permission(self, tool_use_id: str, choice: str,
                          feedback: str) -> None:
        future = self.answers.get(tool_use_id)
        if future is not None and not future.done():
            future.set_result((choice, feedback))

    async def run_shell(self, command: str):
        """`!cmd`: the user's own command, run now (no question: the user typed it) and shown as it
        runs; Esc stops it. It and its output join the conversation (UserShellRan), so the next
        request carries them as user-side context."""
        import asyncio
        if self.working or self.shell is not None:
            return ("khaelor is working; `!` commands run between turns"
                    " (Esc interrupts the turn)")
        self.begin()
        self.shell = asyncio.current_task()
        # what it printed, kept if it is stopped
        streamed = []

        def collect(event: dict) -> None:
            ours = event.get("tool_use_id") == events.USER_SHELL_ID
            if event["type"] == "ToolOutput" and ours:
                streamed.append(event["text"])
        unsubscribe = self.bus.subscribe(collect)
        try:
            result = await self.toolbox.run("bash", {"command": command},
                                            events.USER_SHELL_ID,
                                            confine=user_shell())
        except asyncio.CancelledError:
            output = "".join(streamed)[-STOPPED_OUTPUT_CHARS:]
            self.bus.emit("UserShellRan", command=command, output=output,
                          exit_code=None, stopped=True)
            raise
        finally:
            self.shell = None
            unsubscribe()
        meta = result.meta
        self.bus.emit("UserShellRan", command=command, output=result.text,
                      exit_code=meta.get("exit_code"),
                      duration_ms=meta.get("duration_ms"), stopped=False)

    async def run_command(self, line: str):
        """A slash command, with its line in TYPED while it runs (the task's own)."""
        begun = TYPED.set((line.strip(), len(self.store.events)))
        try:
            return await self.run_typed(line)
        finally:
            TYPED.reset(begun)

    async def run_typed(self, line: str):
        name, _, rest = line.strip().partition(" ")
        entry = COMMANDS.get(name)
        if entry is None and name in self.custom:
            try:
                command_model(self.custom[name], self.settings["prices"])
            except UsageError as error:
                return self.record_answer(line, str(error))
            self.submit(line)
            return ""
        if entry is None:
            return self.record_answer(line, f"unknown command {name}; /help lists them")
        try:
            answer = await entry[0](self, rest.strip())
        except Exception as error:
            # the screen says "✗ The command failed: …", and so does a replay
            self.record_answer(line, str(error), failed=True)
            raise
        return self.record_answer(line, answer)

    def record_answer(self, line: str, answer, failed: bool = False):
        """What a command showed joins the log (CommandAnswered), so a resumed session replays it
        where it was. Not kept: /help (a view, the same each time), QUIT, TRANSCRIPT, and the
        middle of an answer over MAX_KEPT_ANSWER characters (a long /diff: the replay says so)."""
        shown = isinstance(answer, str) and (answer.strip() or failed)
        if line.split()[0] != "/help" and shown:
            import context
            kept = context.clip(answer, MAX_KEPT_ANSWER)
            self.unlogged.append({"command": line.strip(), "text": kept})
            if failed:
                self.unlogged[-1]["failed"] = True
            if self.echoed(line):
                self.unlogged[-1]["echoed"] = True
            self.log_answers()
        return answer

    def echoed(self, line: str) -> bool:
        """Whether an event this command wrote showed its line already (`typed`): its answer is
        then shown without it, below that event's ◇ line."""
        running, begun = TYPED.get()
        if running != line.strip():
            return False
        return any(event.get("typed") == running for event in self.store.events[begun:])

    def log_answers(self) -> None:
        """Once the session has begun: before its first message there is no log to write to."""
        while self.unlogged and self.store.events:
            self.bus.emit("CommandAnswered", **self.unlogged.pop(0))

    def mention_candidates(self, prefix: str) -> list:
        """Files and their folders (`src/`) for @ completion, as last listed. Listing runs in a
        thread, never on the event loop (git in a big repository takes a while): it starts at
        the first mention, and again when a new mention starts and the list is older than
        MENTION_REFRESH_S, since files come and go while khaelor works. When a listing lands,
        FilesListed makes the UI ask again. The same list while a mention is typed, so
        narrowing stays cheap."""
        new_mention = not prefix.startswith(self._mention_prefix)
        self._mention_prefix = prefix
        stale = time.monotonic() - self._files_at > MENTION_REFRESH_S
        if self._files is None or (new_mention and stale):
            self.start_listing()
        return self._files or []

    def start_listing(self) -> None:
        import asyncio
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
        import tools
        files = tools.project_files(self.toolbox.workspace, limit=MAX_MENTION_FILES,
                                    skip=is_skipped)
        folders = set()
        # each file's folders, up to the first one already seen
        for path in files:
            cut = path.rfind("/")
            while cut > 0 and path[:cut + 1] not in folders:
                folders.add(path[:cut + 1])
                cut = path.rfind("/", 0, cut)
        return files + sorted(folders)

    def status(self) -> dict:
        """Read on every frame: recomputed only when the log has grown."""
        if self.kernel is None:
            # the first frame, before attach_after_first_frame
            return {"mode": self.mode}
        key = (self.store.path, len(self.store.events), self.kernel.ctx.model,
               str(self.reasoning))
        if self._status_key != key:
            self._status = self.fold_status()
            self._status_key = key
        processes = self.toolbox.running_processes()
        return {**self._status, "processes": len(processes), "mode": self.mode}

    def fold_status(self) -> dict:
        import context
        state = self.store.state
        totals = state.usage
        summed = summed_usage(totals)
        last = state.last_usage
        prompt = (summed["input_tokens"] + summed["cache_read_tokens"]
                  + summed["cache_write_tokens"])
        # the running turn's model (a command file may name its own)
        model_id = self.kernel.ctx.model_of(state)
        window = context.window_of(model_id)
        context_pct = None
        if last is not None:
            # a prune since the last response shrinks the next request now, not at the next usage
            # (thinking_tokens is part of output_tokens)
            used = sum(last.get(key) or 0 for key in events.USAGE_KEYS)
            used -= state.freed_since_usage
            context_pct = 100 * used / window
        cache_share = summed["cache_read_tokens"] / prompt if prompt else None
        thought = [usage.get("thinking_tokens") or 0 for usage in totals.values()]
        return {"model": model_id,
                "tokens": sum(summed.values()),
                "thinking_tokens": sum(thought),
                "cost": events.cost(totals, self.settings["prices"]),
                "context_pct": context_pct,
                "cache_share": cache_share,
                "reasoning": reasoning_label(self.next_reasoning().fields),
                "branch": state.branch}

    def setting_in_use(self, command: str) -> str:
        """What /model, /thinking or /effort is now: their pickers open on it."""
        if self.kernel is None:
            return ""
        ctx = self.kernel.ctx
        chosen = {"thinking": ctx.thinking, "effort": ctx.effort,
                  **self.store.state.reasoning, **self.reasoning, "model": ctx.model}
        return str(chosen.get(command.lstrip("/")) or "")

    def next_reasoning(self, **trying):
        """The thinking fields the next turn's requests carry (model.Reasoning), with this
        process's choices (and what `trying` sets)."""
        import model
        ctx = self.kernel.ctx
        chosen = {"thinking": ctx.thinking, "effort": ctx.effort,
                  **self.store.state.reasoning, **self.reasoning, **trying}
        return model.reasoning(ctx.model, chosen["thinking"],
                               chosen["effort"], ctx.show_thinking,
                               ctx.max_tokens)

    async def quit(self) -> None:
        """Idempotent: the UI calls it when the user leaves, and interactive_main again on any
        exit."""
        if self.closed:
            return
        self.closed = True
        if self.kernel is None:
            # gone before the first frame
            close_session(self.store)
        else:
            await self.detach()
        await self.client.close()

    # -- slash commands (one table drives dispatch, /help and completion)
    async def cmd_help(self, _):
        import context
        import ui
        # in columns: a table
        commands = ["| command | what it does |", "|---|---|"]
        for name, (_, usage, text) in sorted(COMMANDS.items()):
            # a "|" would end the cell
            shown = f"{name} {usage.replace('|', ', ')}".strip()
            commands.append(f"| {shown} | {text} |")
        files = [f"- `{item.path}`{import_note(item)}" for item in self.kernel.ctx.instructions]
        if not files:
            looked_for = ", ".join(context.INSTRUCTION_FILES)
            files.append(f"- none found ({looked_for} are looked for)")
        sections = ["**Commands**", "\n".join(commands),
                    ui.keys_help(),
                    self.custom_help(),
                    "**Instruction files read**", "\n".join(files)]
        return "\n\n".join(sections)

    def custom_help(self) -> str:
        """/help's section on command files: each with its description and source."""
        if not self.custom:
            return ("**Custom commands**\n\n"
                    "none: a Markdown file in .khaelor/commands/,"
                    " .claude/commands/, $KHAELOR_HOME/commands/"
                    " or ~/.claude/commands/ becomes a /name command")
        lines = ["**Custom commands** (prompt templates: a command file"
                 " grants no permission, so `allowed-tools` in its front"
                 " matter is shown but ignored)", ""]
        for name, command in sorted(self.custom.items()):
            usage = " ".join(part for part in (name, command.argument_hint) if part)
            line = f"- `{usage}` {command.description} · {command.source}"
            if command.model:
                line += f" · model {command.model}"
            if command.allowed_tools:
                line += f" · allowed-tools ignored: {command.allowed_tools}"
            lines.append(line)
        return "\n".join(lines)

    async def cmd_new(self, _):
        layers = self.read_layers()
        await self.detach()
        directory = events.sessions_dir(self.home, self.project_root)
        self.attach(events.SessionStore.create(directory), layers)
        return f"new session {self.store.session_id}"

    async def cmd_sessions(self, _):
        import asyncio
        # Off the loop: a first listing may rebuild many caches from their logs.
        rows = await asyncio.to_thread(list_sessions, self.home,
                                       self.project_root)
        if not rows:
            return "no sessions"
        lines = []
        for row in rows[:20]:
            here = " (this one)" if row["id"] == self.store.session_id else ""
            cost = events.dollars(events.cost(row["usage"], self.settings["prices"]), "cost ?")
            title = row["title"] or "(untitled)"
            updated = age(row["updated"])
            lines.append(f"- `{row['id']}`{here} {title} · {updated}"
                         f" · {row['tokens']} tokens · {cost}")
        return ("\n".join(lines) + "\n\n`/resume ID` continues one"
                " (a unique prefix of the id is enough).")

    async def cmd_resume(self, prefix):
        if not prefix:
            return await self.cmd_sessions("")
        args = argparse.Namespace(resume=prefix, continue_=False)
        try:
            store = open_session(args, self.home, self.project_root, lister="`/sessions`")
        except UsageError as e:
            # an answer, not a failure: "✗ The command failed: no session …" read as a fault
            return str(e)
        except events.SessionBusyError as e:
            if e.pid == os.getpid():
                return f"`{e.session_id}` is the session you are in"
            return str(e)
        try:
            layers = self.read_layers()
        except KhaelorError:
            store.close()
            raise
        await self.detach()
        self.attach(store, layers)
        self.bus.emit("SessionResumed", events=list(store.events))
        title = store.state.title or "(untitled)"
        return f"resumed `{store.session_id}`: {title}"

    async def cmd_rename(self, title):
        # one line, as a title taken from the first message is
        title = " ".join(title.split())
        if not title:
            return "usage: /rename TITLE"
        self.begin()
        # its line ("◇ Session: …") is the confirmation
        self.bus.emit("SessionRenamed", title=title, **typed_line())
        return ""

    async def cmd_cost(self, _):
        lines = []
        for name, usage in self.store.state.usage.items():
            cost = events.cost({name: usage}, self.settings["prices"])
            price = events.dollars(cost, "cost unknown (no price for this model)")
            thought = ""
            if "thinking_tokens" in usage:
                thought = f" (thinking {usage['thinking_tokens']})"
            lines.append(f"- {name}: input {usage['input_tokens']},"
                         f" output {usage['output_tokens']}{thought},"
                         f" cache read {usage['cache_read_tokens']},"
                         f" cache write {usage['cache_write_tokens']}"
                         f" · {price}")
        if not lines:
            return "no model calls yet"
        label = reasoning_label(self.kernel.request)
        if label:
            lines.append(f"\nlast request: {label}")
        return "\n".join(lines)

    async def cmd_context(self, _):
        import context
        rows = self.kernel.ctx.inspect(self.store.state)
        lines = []
        for row in rows:
            line = f"- {row['section']}: ~{row['tokens']} tokens"
            if row.get("cached_tokens"):
                line += f", {row['cached_tokens']} cached"
            lines.append(line)
        pruning = context.prune_report(self.store.events, self.kernel.ctx.prune_at)
        return "\n".join(lines + [""] + pruning) + "\n\n" + self.instructions_report()

    def instructions_report(self) -> str:
        """/context's account of the instruction files: what was read, and each import that was
        not."""
        ctx = self.kernel.ctx
        lines = ["**Instruction files**", ""]
        for item in ctx.instructions:
            via = import_note(item)
            tokens = events.estimate_tokens(item.text)
            lines.append(f"- `{item.path}`{via}: ~{tokens} tokens")
        if not ctx.instructions:
            lines.append("- none")
        lines += [f"- {note}" for note in ctx.instruction_notes]
        return "\n".join(lines)

    async def cmd_compact(self, focus):
        # a cut mid-turn could fall between a tool call and its result
        if self.busy:
            return ("khaelor is working; /compact once the turn ends (or press Esc first)")
        cut_before = self.store.state.cut_seq
        try:
            await self.kernel.keep_in_budget("compact", focus, **typed_line())
        finally:
            # the "compacting…" status ends with the command
            self.bus.emit("Status", text="")
        if self.store.state.cut_seq != cut_before:
            # ContextCompacted's line says so
            return ""
        return ("nothing to compact yet: the conversation is too short to summarise")

    async def cmd_model(self, name):
        import model
        if not name:
            aliases = ", ".join(f"`{alias}` ({model_id})" for alias, model_id
                                in model.MODEL_ALIASES.items())
            return (f"model: {self.kernel.ctx.model}\n\n{aliases};"
                    f" known: {known_models(self.settings['prices'])}"
                    "\n\ntype `/model ` and pick, or `/model NAME`")
        try:
            name = model_choice(name, self.settings["prices"])
        except UsageError as error:
            return str(error)
        self.kernel.ctx.model = name
        # a session not begun yet records the choice in begin()
        if not self.store.events:
            return f"model set to {name}, from your first message"
        # its line ("◇ Model: …") is the confirmation
        self.bus.emit("ModelChanged", model=name, **typed_line())
        return ""

    async def choose_reasoning(self, key: str, value: str) -> str:
        """/thinking and /effort: shown, or chosen for the next turns (never the running one:
        on the 5.5 models a replayed thinking block holds only while the request is unchanged)."""
        import model
        ctx = self.kernel.ctx
        choices = setting_choices()[key]
        row = model.REASONING.get(model.family_of(ctx.model) or "")
        accepted = model.describe_efforts(row[1] if row else None)
        sent = reasoning_label(self.next_reasoning().fields) or "the model's defaults"
        if not value:
            return (f"{key} choices: {', '.join(choices)}"
                    f" (`/{key} CHOICE`, or type `/{key} ` and pick)"
                    f"\n\n{ctx.model} takes effort {accepted};"
                    f" the next request asks for: {sent}")
        if value not in choices:
            return f"unknown {key} `{value}`; choices: {', '.join(choices)}"
        # the log has what a resumed session chose before this process began
        unchanged = self.store.state.reasoning.get(key) == value
        self.reasoning[key] = value
        taken = self.next_reasoning()
        # each note once a session, as the requests tell theirs (ContextBuilder.reasoning)
        fresh = [note for note in taken.notes if note not in ctx.said]
        ctx.said.update(fresh)
        notes = "\n\n".join(fresh)
        adaptive = self.next_reasoning(thinking="adaptive")
        sent = [reasoning.fields.get("output_config") for reasoning in (taken, adaptive)]
        if key == "effort" and sent[0] != {"effort": value} == sent[1]:
            # thinking off (or always) that the model has only at another effort: the newer
            # choice wins, as thinking chosen after an effort does
            notes = (f"thinking is adaptive again, for effort {value} ({ctx.model} has"
                     f" thinking {self.reasoning['thinking']} only at another effort)")
            self.reasoning["thinking"], taken = "adaptive", adaptive
        if not self.store.events:
            # a session not begun yet records it in begin(): this is the only confirmation
            said = f"{key} set to {value}, from your next message"
            said += f" ({ctx.model}: {reasoning_label(taken.fields) or 'its defaults'})"
            if notes:
                said += "\n\n" + notes
            return said
        if unchanged:
            return f"{key} is {value} already"
        # its line ("◇ effort high from the next message") is the confirmation
        record_reasoning(self.bus, self.store, self.reasoning, **typed_line())
        return notes

    async def cmd_diff(self, _):
        import asyncio

        import context
        # git status, read-only, off the loop
        now = await asyncio.to_thread(context.git_baseline, self.toolbox.workspace)
        dirty = [entry["path"] for entry in now.get("dirty") or []]
        return diff_report(self.store.state, dirty)

    async def cmd_undo(self, _):
        """Rewind the last step that changed something."""
        number = last_changing_step(self.store.state)
        if number is None:
            return f"nothing to undo: {why_nothing_to_rewind(self.store.state)}"
        return await self.cmd_rewind(str(number))

    async def cmd_rewind(self, argument):
        """No argument: the steps, newest first. A number: the work tree back to before that step;
        files the user changed after the agent's last step are asked about, as `khaelor rewind`
        asks (the UI's panel calls the question's `answer`)."""
        import asyncio
        state = self.store.state
        if self.working and not state.turn_open and self.turn is not None:
            # the turn has ended and is writing its last checkpoint: a moment
            await asyncio.gather(self.turn, return_exceptions=True)
        if self.working:
            return "khaelor is working; wait for the turn to end (or press Esc) before /rewind"
        if not argument.strip().isdecimal():
            lines = step_lines(state)
            if not lines:
                return "no steps that changed the work tree yet"
            return ("\n".join(f"- `{line.strip()}`" for line in lines)
                    + "\n\n`/rewind N` puts the work tree back as it was before step N.")
        rewind = Rewind(self.bus, self.toolbox, int(argument))
        try:
            # off the loop: a checkpoint, the plan
            await asyncio.to_thread(rewind.plan)
        except KhaelorError as error:
            return str(error)
        if not rewind.restores and not rewind.moves_head():
            return rewind.describe()
        if not any(restore.user_changed for restore in rewind.restores):
            return await self.finish_rewind(rewind, "keep")
        import ui
        # the answer shows under the line typed (`/undo` asks this too)
        line = TYPED.get()[0] or f"/rewind {argument}"
        return {"capability": ui.REWIND_CAPABILITY, "tool_use_id": ui.REWIND_CAPABILITY,
                "descriptor": "overwrite the files you changed since the agent's last step",
                "preview": rewind.describe(), "command": line,
                "answer": lambda choice: self.answer_rewind(rewind, choice, line)}

    async def answer_rewind(self, rewind: Rewind, choice: str, line: str):
        """The panel /rewind opened, answered: what it shows joins the log, as a command's does;
        the line is TYPED again meanwhile (this runs in a task of its own, after the command's)."""
        begun = TYPED.set((line, len(self.store.events)))
        try:
            return self.record_answer(line, await self.finish_rewind(rewind, choice))
        finally:
            TYPED.reset(begun)

    async def finish_rewind(self, rewind: Rewind, choice: str):
        """The planned /rewind: "overwrite" writes over the files the user changed since the
        agent's last step, "keep" keeps them; any other answer (Esc) rewinds nothing."""
        import asyncio
        if choice not in ("overwrite", "keep"):
            return "Not rewound."
        if self.working:
            return "khaelor is working; not rewound (/rewind again once the turn ends)"
        if len(self.store.state.steps) != rewind.planned_steps:
            return "the work tree changed since the question; not rewound (/rewind again)"
        try:
            rewind.start(overwrite=choice == "overwrite")
            # off the loop: the writes and a checkpoint
            await asyncio.to_thread(rewind.write)
        except KhaelorError as error:
            return str(error)
        report = rewind.finish()
        # the fsync off the loop (`khaelor rewind` syncs as it closes the log)
        await self.bus.store.sync_off_loop()
        return f"{rewind.describe(rewind.kept)}\n\n{report}"

    async def cmd_processes(self, rest):
        action, _, target = rest.partition(" ")
        if action == "stop" and target:
            # its ◆ line confirms the command: the line typed goes above it
            self.toolbox.stopping_for(target, typed_line())
            stop = {"action": "stop", "id": target}
            result = await self.toolbox.run("process", stop, "user-processes")
            lines = result.text.split("\n")
            if len(lines) > 22:
                # the header and the newest lines: the model's budget is no screenful
                lines[1:-20] = [f"… {events.counted(len(lines) - 21, 'earlier line')}"]
            # an answer is Markdown: unfenced, the output's lines would join into one paragraph
            return "````\n" + "\n".join(lines) + "\n````"
        lines = []
        for process in self.toolbox.running_processes():
            runtime_s = int(process["runtime_s"])
            lines.append(f"- `{process['process_id']}` pid {process['pid']}"
                         f" · `{process['command']}` · {runtime_s}s")
        return "\n".join(lines) or "no running processes"

    async def cmd_quit(self, _):
        import ui
        return ui.QUIT

    async def cmd_transcript(self, _):
        import ui
        return ui.TRANSCRIPT

    async def cmd_permissions(self, _):
        """`khaelor permissions` in the session: the boundary, the layers and the rules, a line an
        item, so a narrow screen wraps each at its words (a code block's lines broke anywhere),
        every character as written (markdown_literal)."""
        report = policy_report(self.read_layers(), self.kernel.rules)
        return "\n".join("- " + markdown_literal(line) for line in report)

    async def cmd_status(self, _):
        import sandbox
        store = self.store
        cost = events.cost(store.state.usage, self.settings["prices"])
        spent = events.dollars(cost, "unknown (a model has no price)", digits=2)
        # paths in code spans: markdown would make __x__ in a folder's name bold
        facts = [("version", VERSION), ("session", store.session_id),
                 ("project", f"`{self.project_root}`"), ("cwd", f"`{Path.cwd()}`"),
                 ("model", self.kernel.ctx.model),
                 ("permission mode", self.kernel.permission_mode),
                 ("sandbox", sandbox.status()), ("cost so far", spent)]
        return "\n".join(f"- {name}: {value}" for name, value in facts)

    async def cmd_export(self, target):
        """The transcript as Markdown: to a file (default khaelor-<session>.md here), or with
        `clipboard` to the terminal's clipboard by OSC 52."""
        if not self.store.events:
            return "nothing to export yet: this session has no messages"
        text = transcript_markdown(self.store.events)
        if target == "clipboard":
            import base64
            data = base64.b64encode(text.encode("utf-8")).decode("ascii")
            sys.stdout.write(f"\x1b]52;c;{data}\x07")
            sys.stdout.flush()
            return (f"sent the transcript ({events.counted(len(text), 'character')}) to the"
                    " clipboard (OSC 52: your terminal must allow it)")
        path = Path(target or f"khaelor-{self.store.session_id}.md").expanduser()
        path = Path.cwd() / path
        try:
            write_own(path, text, os.O_TRUNC, self.project_root)
        except OSError as e:
            return f"`{path}` not written: {own_write_problem(e)}"
        return f"transcript written to `{path}`"

    async def cmd_init(self, arg):
        """A starting instruction file from what the repository shows; shown first, written by
        `/init write`, never over one that exists."""
        import asyncio

        import context
        root = self.project_root
        for name in context.INSTRUCTION_FILES:
            # a link counts, even one to nothing: writing through it would create its target
            if os.path.lexists(root / name):
                return f"`{name}` exists already; /init writes only a new file"
        name = "CLAUDE.md" if (root / ".claude").is_dir() else "KHAELOR.md"
        text = await asyncio.to_thread(starting_instructions, root)
        if arg != "write":
            return (f"`/init write` saves this as `{name}`:\n\n"
                    f"````markdown\n{text}````")
        try:
            write_own(root / name, text, os.O_EXCL, root)
        except OSError as e:
            return f"`{name}` not written: {own_write_problem(e)}"
        return f"wrote `{name}`: edit it to say what a newcomer must know"


def write_own(path: Path, text: str, flags: int, root: Path) -> None:
    """khaelor's own write of a file (/init, /export), never through a link planted under its name
    or, in the project `root`, under any directory's on the way (it would create or overwrite the
    file it points to, outside the project) and never waiting on a FIFO. flags: O_EXCL (a new
    file only) or O_TRUNC (a file replaced)."""
    import sandbox
    flags |= os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    path = Path(os.path.normpath(path))
    if path.is_relative_to(root):
        fd = sandbox.open_no_links(str(path), flags, 0o666)
    else:
        # out of the project the user named the path: the links on its way are theirs
        fd = os.open(path, flags, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def own_write_problem(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "a symbolic link is in its way, and khaelor does not write through one"
    if e.errno == errno.ENXIO:
        return "a FIFO is in its place"
    return e.strerror or str(e)


def transcript_markdown(log: list[dict]) -> str:
    """/export: what was said and done, as Markdown, in the order the screen showed it (a tool's
    output: its first 40 lines). What came while a reply streamed (a command's answer, steering)
    follows the reply, as on screen; a reply cut off keeps what it had written."""
    import ui
    parts = []
    # the text saved of the reply streaming, and what showed after it
    streaming = ""
    after = []
    for event in log:
        kind = event["type"]
        if kind == "ModelTextBlockCompleted":
            streaming = event.get("text") or ""
        if kind == "ModelTextBlockCompleted" or kind in events.DROPPING_EVENTS:
            # the reply ends: its text, then what showed after it
            parts += [text for text in (streaming, *after) if text]
            streaming = ""
            after = []
        if kind in ("CommandAnswered", "SteeringQueued"):
            (after if streaming else parts).append(shown_markdown(event))
        elif kind in ui.NOTE_FORMATS:
            # its ◇ line (◆ for a process), under the command line typed, as on screen
            (after if streaming else parts).append(typed_markdown(event) + ui.note_text(event))
        if kind == "TextCheckpoint":
            streaming += event.get("text") or ""
        elif kind == "UserMessageCreated":
            # a command file's line as typed, as on screen
            parts.append(f"## You\n\n{event.get('typed') or event.get('text', '')}")
        elif kind == "UserShellRan":
            output = "\n".join(str(event.get("output") or "").split("\n")[:40])
            parts.append(f"**!** `{event.get('command')}`\n\n````\n{output}\n````")
        elif kind == "Interrupted":
            parts.append("*Interrupted*")
        elif kind == "PermissionDenied":
            # not run, as its card said, and what the user told the model
            told = f" · told the model: {event['feedback']}" if event.get("feedback") else ""
            parts.append(f"✗ Denied{told}")
        elif kind == "ToolRequested":
            call = json.dumps(event.get("input"), ensure_ascii=False)
            parts.append(f"**{event.get('name')}** `{call[:300]}`")
        elif kind in ("ToolCompleted", "ToolFailed") or event.get("output"):
            # (a command stopped or lost with khaelor: what it had printed, as its card shows)
            lines = str(event.get("output") or "").rstrip("\n").split("\n")
            parts.append("````\n" + "\n".join(lines[:40]) + "\n````")
    parts += [text for text in (streaming, *after) if text]
    # a text's own final newlines would pile up blank lines before the next part
    return "\n\n".join(part.rstrip("\n") for part in parts) + "\n"


def shown_markdown(event: dict) -> str:
    """/export: a command's answer, marked as its output, or steering the user typed."""
    if event["type"] == "SteeringQueued":
        return f"## You (while it worked)\n\n{event.get('typed') or event.get('text', '')}"
    said = event.get("text", "").rstrip("\n")
    if event.get("failed"):
        said = f"The command failed: {said}"
    quoted = "\n".join("> " + line for line in said.split("\n"))
    if event.get("echoed"):
        # its line is above the ◇ line just written
        return quoted
    return f"**`{event.get('command')}`** · command output\n\n{quoted}"


def typed_markdown(event: dict) -> str:
    """/export: the command line typed above the ◇ line that confirms it, if one was."""
    return f"**`{event['typed']}`**\n\n" if event.get("typed") else ""


def starting_instructions(root: Path) -> str:
    """/init's draft: the project's layout and check commands, and headings to fill in."""
    import context
    entries = []
    for path in sorted(root.iterdir()):
        # A name with a newline would write a line of its own into the file (an instruction), one
        # with a backtick an @import outside the inline code: such names are not listed.
        plain = path.name.isprintable() and "`" not in path.name
        if plain and not path.name.startswith("."):
            entries.append(f"- `{path.name}{'/' * path.is_dir()}`")
    checks = [f"- `{command}`" for command in context.detect_checks(root, [])]
    checks = checks or ["- (none found: say how to run the tests)"]
    sections = [f"# {root.name}",
                "Instructions for coding agents (khaelor, Claude Code) in this repository.",
                "## Layout", "\n".join(entries[:40]),
                "## Checks (run after every change)", "\n".join(checks),
                "## Conventions", "- (style, naming, what never to touch)"]
    return "\n\n".join(sections) + "\n"


def import_note(item) -> str:
    """What follows an instruction file's path when another one imported it."""
    return f" (imported by `{item.imported_by}`)" if item.imported_by else ""


def known_model_ids(prices: dict) -> list[str]:
    """events.py's priced models and those config.json `prices` adds."""
    return sorted({*events.PRICES, *prices})


def known_models(prices: dict) -> str:
    return ", ".join(f"`{model_id}`" for model_id in known_model_ids(prices))


def model_choice(name: str, prices: dict) -> str:
    """The model --model or /model names: opus, sonnet and haiku are the current ids; any other
    must be known (priced) or a dated id of one, else a UsageError that lists them."""
    import model
    chosen = model.MODEL_ALIASES.get(name, name)
    for known in known_model_ids(prices):
        # a model with a price, or a dated id of one: claude-x-20250929
        if chosen == known or re.fullmatch(re.escape(known) + r"-\d{8}", chosen):
            return chosen
    aliases = ", ".join(model.MODEL_ALIASES)
    raise UsageError(f"unknown model `{name}`; use {aliases} or a known model:"
                     f" {known_models(prices)} (a model with a price in"
                     " config.json `prices` is known too)")


DIFF_SECTIONS = (
    ("preexisting", "Already changed when the session started (yours, left as they were)"),
    ("outside", "Changed during the session outside khaelor's edit tools (by you or by commands)"))


def diff_report(state, dirty_now: list | None = None,
                max_chars: int = 60_000) -> str:
    """/diff as markdown: khaelor's edits of this session file by file (from the log, so it
    survives resume), then the changes that were not khaelor's."""
    import context
    who = context.attribute_changes(state, dirty_now)
    if not state.baselines:
        # no message yet, so no baseline: what is dirty now was dirty when the session started
        who["preexisting"], who["outside"] = who["outside"], []
    edits = state.edits
    lines = ["khaelor has not changed any file in this session."]
    if edits:
        files = events.counted(len(edits), "file")
        lines = [f"**khaelor changed {files} in this session**"]
        for path, changes in edits.items():
            was_dirty = path in who["dirty_before_edit"]
            lines.append(edit_summary(path, changes, was_dirty))
        diffs = [change.get("diff", "") for changes in edits.values() for change in changes]
        body = "".join(diffs)
        if len(body) > max_chars:
            more = len(body) - max_chars
            cut = f"\n[… {more} more characters of diff …]\n"
            body = body[:max_chars] + cut
        lines += ["", "```diff", body.rstrip("\n"), "```"]
    for key, title in DIFF_SECTIONS:
        paths = who[key]
        if not paths:
            continue
        names = events.listed([f"`{p}`" for p in paths], 30)
        lines += ["", f"**{title}:** {names}"]
    return "\n".join(lines)


def edit_summary(path: str, changes: list, was_dirty: bool) -> str:
    """`- `app.py` +3 −1 in 2 edits` for one file of /diff."""
    added = sum(c.get("added", 0) for c in changes)
    removed = sum(c.get("removed", 0) for c in changes)
    created = " (created)" if changes[0].get("created") else ""
    edits = events.counted(len(changes), "edit")
    line = f"- `{path}`{created} +{added} −{removed} in {edits}"
    if was_dirty:
        line += (" · it had uncommitted changes before khaelor's first edit:"
                 " only khaelor's edits are shown")
    return line


# of a `!` command stopped with Esc, the output kept (its end)
STOPPED_OUTPUT_CHARS = 20_000
# the characters ui.INLINE_RE reads as markup (and the backslash that escapes them)
MARKDOWN_MARKERS = re.compile(r"([\\`*_~\[])")
# a command's answer the log keeps (CommandAnswered), in characters: the replay says what is not
MAX_KEPT_ANSWER = 20_000
# The slash command running, as typed, and how long the log was when it began: the event that is
# its own confirmation carries the line (`typed`: typed_line()). A context variable, not a field
# of the Session: each command runs in a task of its own, and two may run at once.
TYPED = contextvars.ContextVar("typed", default=("", 0))
# a new @ mention lists the files again when the list is older than this
MENTION_REFRESH_S = 1.0
# files offered for @ completion, at most
MAX_MENTION_FILES = 50_000
# and every dot-folder
SKIPPED_FOLDERS = frozenset({"node_modules", "__pycache__", "venv"})


def is_skipped(folder: str) -> bool:
    """A folder @-completion does not walk into outside git: dot-folders and junk."""
    return folder.startswith(".") or folder in SKIPPED_FOLDERS


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
    "/model": (Session.cmd_model, "[opus|sonnet|haiku|id]", "show or change the model"),
    "/thinking": (lambda session, mode: session.choose_reasoning("thinking", mode),
                  "[off|adaptive|always]", "how the model thinks, from the next message"),
    "/effort": (lambda session, level: session.choose_reasoning("effort", level),
                "[low|medium|high|xhigh|max]", "how hard the model works, from the next message"),
    "/diff": (Session.cmd_diff, "", "changes khaelor made in this session"),
    "/undo": (Session.cmd_undo, "", "rewind the last step that changed the work tree"),
    "/rewind": (Session.cmd_rewind, "[step]",
                "the steps, newest first; a step: the work tree back to before it"),
    "/processes": (Session.cmd_processes, "[stop ID]", "running background processes"),
    "/quit": (Session.cmd_quit, "", "leave khaelor"),
    "/exit": (Session.cmd_quit, "", "leave khaelor (as /quit)"),
    "/init": (Session.cmd_init, "[write]", "draft a KHAELOR.md from the repository"),
    "/permissions": (Session.cmd_permissions, "", "the permission layers and rules"),
    "/status": (Session.cmd_status, "", "version, session, model, sandbox, cost"),
    "/export": (Session.cmd_export, "[FILE|clipboard]", "the transcript as Markdown"),
    "/transcript": (Session.cmd_transcript, "", "read everything, every card whole (q leaves)"),
}


def run_interactive(args, home: Path, project_root: Path) -> int:
    if not sys.stdin.isatty() or not sys.stdout.isatty():
        raise UsageError("the interactive UI needs a terminal;"
                         " use -p PROMPT for scripts and pipes")
    require_api_key()
    settings = load_settings(args, home, project_root)
    store = open_session(args, home, project_root)
    import asyncio
    return asyncio.run(interactive_main(args, settings, store, home, project_root))


async def interactive_main(args, settings, store, home: Path,
                           project_root: Path) -> int:
    import asyncio

    import model
    import ui
    session = Session(args, settings, home, project_root)
    if store.events:
        # before the replay is read: what repair() records (a reply cut off by a crash) shows too
        session.attach(store)
        # after run_app subscribes the UI (it awaits nothing before)
        asyncio.get_running_loop().call_later(0, session.send_first)
    else:
        session.attach_after_first_frame(store)
    earlier = list(store.events)
    notices = [f"warning: {warning}" for warning in store.warnings]
    # after the first frame: they import the trust model (permissions.py, ~8 ms)
    asyncio.get_running_loop().call_later(0, session.say_start_notices)
    # The SDK import (~2 s) starts just after the first paint, so typing never waits for it.
    asyncio.get_running_loop().call_later(0.05, model.preload)
    asyncio.get_running_loop().call_later(0.1, prune_in_background, home)
    # Stray writes to stderr (library warnings) would tear the live region: they go to a file.
    saved_stderr = os.dup(2)
    with open(home / "stderr.log", "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        # what the user typed: 0600, like the logs
        history = events.private_file(home / "history")
        code = await ui.run_app(session, history_path=history, replay=earlier,
                                notices=notices, welcome=welcome_line(session))
    finally:
        await session.quit()
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
    if session.start_error is not None:
        raise session.start_error
    if session.store.events and code != EXIT_HANGUP:
        print(farewell_line(session.store, settings["prices"]))
    return code


def welcome_line(session) -> str:
    """The first line: what runs, where, with which model, and whether the sandbox holds. A
    resumed session's is the line its live screen began with: the model it was created on (its
    replay then shows each `/model` after it; the status line names the one that runs now)."""
    import sandbox
    boundary = "sandboxed" if sandbox.enforced() else "no OS sandbox"
    model_id = current_model(session.store, session.settings)
    if session.store.events:
        model_id = session.store.events[0].get("model") or model_id
    return (f"khaelor {VERSION} · {session.project_root} · {model_id}"
            f" · {boundary} · /help, ? for keys")


def farewell_line(store, prices: dict) -> str:
    """On quit: what the session cost and how to come back to it."""
    spent = events.dollars(events.cost(store.state.usage, prices), "cost unknown", digits=2)
    return f"session {store.session_id} · {spent} · continue it with `khaelor -c`"


def prune_in_background(home: Path) -> None:
    """File versions and checkpoints unused for 30 days go, and the session folders of khaelors
    killed with kill -9, in a thread: start-up never waits for it. A daemon: quitting mid-prune
    leaves only files that a later prune removes."""
    import threading

    import tools

    def prune():
        tools.prune_versions(home)
        tools.remove_dead_session_temps()
    threading.Thread(target=prune, name="khaelor-prune", daemon=True).start()


# ---------------------------------------------------------------- entry point

SUBCOMMANDS = {   # name: (handler, usage, what it does: --help lists them)
    "sessions": (cmd_sessions, "", "list this project's sessions"),
    "permissions": (cmd_permissions, "[--json | check --bash CMD|--read P|--write P [--json]]",
                    "show or test the permission policy"),
    "trust": (cmd_trust, "[--revoke] [--yes]",
              "review and trust this repository's permission files"),
    "sandbox": (cmd_sandbox, "[--read-only|--write|--network] [--path P] [--secrets] [--yes] --"
                " CMD", "run a command in the sandbox a permission decision gives"),
    "rewind": (cmd_rewind, "[--list] [STEP] [-r SESSION] [--yes]",
               "the work tree back to before a step of a session"),
}


def main(argv: list | None = None) -> int:
    """The entry point. Whatever was being written, a reader that has gone (`khaelor -p … |
    head -1`) ends the program quietly with 141, as a shell expects of a closed pipe."""
    open_closed_std_streams()
    try:
        try:
            return run_command_line(argv)
        finally:
            # the output's last block waits in the buffer until here
            sys.stdout.flush()
    except BrokenPipeError:
        stdout_to_devnull()
        return EXIT_PIPE


def open_closed_std_streams() -> None:
    """A standard stream closed before start (`<&-`, `>&-`) is /dev/null: Python left it None
    (AttributeError on first use), and a file opened later would take its number."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        if getattr(sys, name) is not None:
            continue
        # the lowest free number: the stream's own when it is closed, as those below are open
        devnull = os.open(os.devnull, os.O_RDWR)
        if devnull != fd:
            os.close(devnull)
            continue
        stream = open(fd, "w" if fd else "r", encoding="utf-8", errors="backslashreplace")
        setattr(sys, name, stream)


def stdout_to_devnull() -> None:
    """The reader has gone: what is still written (a flush at exit too) goes nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def run_command_line(argv: list | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the cheapest path there is: no argparse, no signals
    if argv == ["--version"]:
        print(f"khaelor {VERSION}")
        return EXIT_OK
    _exit_on_sigterm()
    home = events.khaelor_home()
    project_root = find_project_root(Path.cwd())
    args = None
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]][0](argv[1:], home, project_root)
        args = parse_args(argv)
        if args.prompt is not None:
            return run_print(args, home, project_root)
        return run_interactive(args, home, project_root)
    except KeyboardInterrupt:
        # before a run began (the stdin wait, the SDK import); asyncio.run re-raises it after one
        if not getattr(args, "reported", False):
            say_unstarted(args, failure(None, "interrupted"))
        return interrupted_exit()
    except BrokenPipeError:
        # main's to answer: the reader has gone
        raise
    # an error may name a path a step made: nothing in it acts on the terminal
    except KhaelorError as e:
        say_unstarted(args, events.visible_controls(str(e)))
        return EXIT_USAGE if isinstance(e, UsageError) else EXIT_FAILED
    # the one catch-all: one line for the user, the traceback in a file
    except Exception as e:
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
    details = f" (details in {path})" if path else ""
    kind = type(error).__name__
    print(f"khaelor: internal error: {kind}: {error}{details}",
          file=sys.stderr)
    return EXIT_FAILED


def _exit_on_sigterm() -> None:
    """SIGTERM and SIGHUP (the terminal closed) unwind like Ctrl-C (`finally` blocks stop
    processes, sync the log) but exit 128 + N, named; the UI has its own handlers meanwhile."""
    import signal   # here, not at the top: `khaelor --version` never needs it
    def handler(signum, frame):
        SIGNALLED.append(signal.Signals(signum))
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def cancel_on_sigterm(run) -> None:
    """While a run's task is on the loop, SIGTERM and SIGHUP cancel it, as asyncio does for
    SIGINT: a KeyboardInterrupt raised in whatever frame was running could leave the task before
    its `except CancelledError` (the result object then said the run never started)."""
    import signal
    def handler(signum, frame):
        SIGNALLED.append(signal.Signals(signum))
        if run.cancelling() or run.done():
            raise KeyboardInterrupt     # a second signal: unwind at once, as before
        run.cancel()
        # wake the loop, which may be waiting in select()
        run.get_loop().call_soon_threadsafe(lambda: None)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


if __name__ == "__main__":
    sys.exit(main())
