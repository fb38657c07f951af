"""tools.py: the world seam (Workspace) and the seven model-facing tools.

Owns: read write edit grep glob bash process — their schemas and descriptions (byte-stable, they are
prompt-cached) and, beside them, how their calls are shown (card, panel preview), the subject each
call's permission is judged on (permission_subject: a kind, never a tool name, reaches
permissions.py) and the failure a call is certain to meet (Toolbox.problem); input checking,
edit's replacer cascade, output budgets and spill files, the process manager, the file versions
write/edit keep and the work-tree checkpoints (a shadow repository) a rewind writes back, pruning
both, and the FileModified / ProcessStarted / ProcessExited / ToolOutput events they report;
starting every subprocess confined as the decision's `confine` says (sandbox.py builds the Landlock
ruleset), with git settings that keep a repository from running code; masking secrets in every
output; the one lister of the project's files. What the model has read and the process numbers it
reads from the log's fold (events.State), keeping no copy.
Must not: judge whether a call is allowed (permissions.py does and computes `confine`), import
anything of ours but `events` and `sandbox`, or raise out of Toolbox.run (a failed tool is a result
the model reads).
"""

import asyncio
import codecs
import contextlib
import errno
import json
import os
import posixpath
import re
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import unicodedata
import weakref
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import accumulate
from pathlib import Path
from typing import Callable
# (difflib, hashlib and mimetypes are imported where they are used: few calls need them, and at
# the top every start would pay for them)

import events
import sandbox
from sandbox import Confine

# ---------------------------------------------------------------- constants

# Model-facing text per result; the rest is spilled to a file.
OUTPUT_BUDGET_CHARS = 30_000
# Share of the budget kept from the start; the tail gets the rest (errors land last).
OUTPUT_HEAD_SHARE = 0.4
# One spill file stops growing here.
SPILL_FILE_CAP_BYTES = 50_000_000
# The spill folder is pruned, oldest first, to stay under this.
SPILL_DIR_CAP_BYTES = 200_000_000

# Lines (or a directory's entries) shown by one read without a limit.
READ_LINE_CAP = 2000
# Characters of numbered text one read returns.
READ_BYTE_CAP = 60_000
# Larger files are for bash (head, tail, grep).
READ_FILE_CAP_BYTES = 50_000_000
# A longer line is cut with a marker.
LINE_CHAR_CAP = 2000
# A model's string quoted back in a message is cut here.
QUOTE_CHARS = 200

# Files (glob) or matching lines (grep) shown.
SEARCH_RESULT_CAP = 100
# Matching lines collected before we stop counting.
GREP_SCAN_CAP = 10_000
# A matching line is cut to this many characters.
GREP_LINE_CHARS = 300
ACROSS_LINES = re.compile(r"\n|(?<!\\)\\n|(?<!\\)\$(?![|)]|$)")
# A ripgrep run is stopped after this.
SEARCH_TIMEOUT_S = 60
# The Python grep's matching of a pattern that is not a plain literal is stopped after this.
GREP_PATTERN_BUDGET_S = 10.0
# A pattern with no regex syntax: it is searched for as it is, in linear time.
PLAIN_PATTERN = re.compile(r"[^.^$*+?{}\[\]\\|()]*")

# A missing file's name is looked for among this many of the project's files.
PROJECT_FILES_LIMIT = 50_000

BASH_DEFAULT_TIMEOUT_MS = 120_000
BASH_MAX_TIMEOUT_MS = 600_000
# After a shell exits, its backgrounded children get this long to finish.
STRAY_GRACE_S = 0.3

# Rolling output kept per background process.
PROCESS_BUFFER_CHARS = 200_000
# Background processes running at once.
PROCESS_LIVE_CAP = 8
# SIGTERM, then SIGKILL after this.
PROCESS_STOP_GRACE_S = 3.0
# start/write wait this long for first output.
PROCESS_SETTLE_S = 0.5
# After a background process exits, what it left running gets this long.
PROCESS_STRAY_GRACE_S = 1.0
# On resume: a process a killed khaelor left running gets this long after SIGTERM.
ORPHAN_GRACE_S = 1.0

# Unified diff carried by FileModified.
DIFF_CHAR_CAP = 20_000
# Lines shown around an edit.
SNIPPET_CONTEXT_LINES = 4
# Claude Code's cleanupPeriodDays (30) is the precedent: unused file versions go after this long.
VERSIONS_KEEP_DAYS = 30
# prune_versions runs at most once a day; the marker's mtime (in versions/) says when it last ran.
VERSIONS_PRUNE_INTERVAL_S = 86_400
VERSIONS_PRUNE_MARKER = ".last-prune"
# A version's file name: the sha256 of its content.
BLOB_NAME = re.compile(r"[0-9a-f]{64}")
# Mean middle-line similarity a block-anchor match needs.
BLOCK_ANCHOR_SIMILARITY = 0.5

# khaelor's own credentials, masked in all tool output.
SECRET_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
SECRET_MASK = "[redacted: khaelor's API credential]"
DOTENV_MASK = "[redacted: a value from the project's .env file]"
# A password in a URL (a remote in .git/config, a pip index): what `git config -l` or
# `cat .git/config` would otherwise show the model and the session log.
URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]+:)[^/\s@]+@")
URL_PASSWORD_MASK = "[redacted]@"
# Tokens whose format names them (GitHub, GitLab, Slack, Anthropic, OpenAI, Stripe, AWS, Google,
# npm, PyPI, Hugging Face): masked wherever they show, a URL's user name included
# (https://ghp_…@github.com). Each starts with its literal prefix: a \b or a class first makes
# the scan up to ten times slower; the two prefixes that end words (disk-usage_…, shelf_…) look
# behind themselves after matching.
TOKEN = re.compile(r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{40,}|glpat-[\w-]{20,}"
                   r"|xox[abpr]-[A-Za-z0-9-]{10,}|sk-ant-[\w-]{20,}|sk_live_[A-Za-z0-9]{20,}"
                   r"|rk_live_[A-Za-z0-9]{20,}|sk-(?<![\w-]sk-)(?:proj-)?[A-Za-z0-9_]{32,}"
                   r"|AKIA[0-9A-Z]{16}|AIza[\w-]{35}|npm_[A-Za-z0-9]{36}|pypi-[\w-]{50,}"
                   r"|hf_(?<![\w-]hf_)[A-Za-z0-9]{30,}")
TOKEN_MASK = "[redacted: a token]"
# An HTTP credential in a header: what `git config -l` shows of the extraheader actions/checkout
# leaves in .git/config (AUTHORIZATION: basic <base64 of x-access-token:TOKEN>), or `curl -v`.
AUTH_HEADER = re.compile(r"(?i)(authorization:[ \t]*(?:basic|bearer|token)[ \t]+)[^\s\"']+")
AUTH_HEADER_MASK = "[redacted: a credential]"
# A private key's body, however it is printed (a diff puts + before each line), to its end line
# or, cut short, to the end of the text
PRIVATE_KEY = re.compile(r"(-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----)[\s\S]*?"
                         r"(-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)")
PRIVATE_KEY_MASK = "[redacted: a private key]"
# In the diff of a secret file (git log -p, git show, git diff print .env's past versions, whose
# values the .env masking does not know): a line that sets a value, KEY=v, key: v, "key": "v".
# Its mark (+, -, space) may be missing or another (--word-diff, --output-indicator-new);
# --word-diff wraps it in {+ +}, [- -]. The read tool's line number or colors may come first
# (a saved `git log -p --color=always`).
LINE_START = r"(?: *\d+\t)?(?:\x1b\[[0-9;]*m)*"
SECRET_DIFF_SETTING = re.compile(
    rf"""(?m)^({LINE_START}.?{LINE_START}(?:\{{\+|\[-)?\s*(?:export\s+)?["']?[\w.-]+["']?"""
    r"\s*[=:]\s*)\S.*$")
# Where a diff starts, and where it ends at the latest: the next diff, commit, or mail of a patch
DIFF_PART_START = re.compile(
    rf"(?m)^(?={LINE_START}(?:diff --|commit [0-9a-f]{{7}}|From [0-9a-f]{{40}} ))")
SECRET_DIFF_MASK = "[redacted: a value from a secret file's history]"
# Folders of installed dependencies, where masking does not look for .env files (a
# node_modules of 30,000 folders would be walked before every approved command)
DEPENDENCY_FOLDERS = ("node_modules", ".venv", "venv", ".tox", "__pycache__", "target")
# Shorter .env values (ports, flags, "true") are not worth masking.
DOTENV_VALUE_MIN_CHARS = 8
DOTENV_LINE = re.compile(r"^\s*(?:export\s+)?[A-Za-z_][A-Za-z0-9_.-]*\s*=\s*(.*?)\s*$")
# A quoted value, and the comment that may follow it: KEY="value" # note
DOTENV_QUOTED = re.compile(r"""(['"])(.*?)\1\s*(?:#.*)?""")
# What an --yes line that writes reads of the home's build credentials (sandbox.HOME_CREDENTIALS):
# settings.xml without its servers, proxies and any element naming a password, passphrase, token
# or secret (a profile's gpg.passphrase), or where such a word is left, empty settings;
# gradle.properties with only Gradle's own org.gradle.* lines.
BUILD_SECRETS = {
    "settings.xml": re.compile(r"<(servers|proxies)\b.*?</\1\s*>|<([\w.-]*(?:password|passphrase"
                               r"|token|secret)[\w.-]*)\b[^>]*>.*?</\2\s*>", re.I | re.S),
    "gradle.properties": re.compile(r"^(?!\s*(?:org\.gradle\.|[#!]|$)).*\n?", re.M),
}
BUILD_SECRET_WORD = re.compile(r"password|passphrase|token|secret", re.I)

# The folder of khaelor's modules (its venv's site-packages once installed): no command writes it.
OWN_CODE = os.path.dirname(os.path.realpath(__file__))
# Landlock rulesets a Workspace keeps for reuse.
RULESETS_KEPT = 8
# What a call may do when the kernel gives no `confine` (see sandbox.py and permissions.py).
DEFAULT_CONFINE = Confine()
# khaelor's own git calls, ripgrep.
READ_ONLY_CONFINE = Confine(write=False)
# Subprocess environment: nothing may wait on a pager or a password prompt (stdin is closed anyway).
EXEC_ENV_OVERRIDES = {"PAGER": "cat", "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0",
                      "TERM": "dumb"}
# UTF-16 by its byte-order mark: read, edit and write keep such a file UTF-16 (as Claude Code).
UTF16 = {codecs.BOM_UTF16_LE: "utf-16-le", codecs.BOM_UTF16_BE: "utf-16-be"}
# Magic numbers, to tell the model what a binary file is.
MAGIC = [
    (b"\x89PNG", "PNG image"),
    (b"\xff\xd8\xff", "JPEG image"),
    (b"GIF8", "GIF image"),
    (b"%PDF", "PDF document"),
    (b"PK\x03\x04", "ZIP archive (or docx/xlsx/jar/wheel)"),
    (b"\x1f\x8b", "gzip archive"),
    (b"\xfd7zXZ", "xz archive"),
    (b"\x7fELF", "ELF executable"),
    (b"SQLite format 3", "SQLite database"),
    (b"\x00asm", "WebAssembly module"),
    (b"RIFF", "RIFF media (WAV/AVI/WebP)"),
]
# What an over-escaped old_string means by \n, \t, \" and the like (escape-normalized matching).
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\n": "\n", "'": "'", '"': '"', "`": "`", "\\": "\\",
           "$": "$"}

# ------------------------------------------------ schemas (prompt-cached: keep byte-stable)

READ_DESCRIPTION = """Read a text file (or list a directory) from the local filesystem.
- Output lines are numbered (line number, tab, content). The numbers are not part of the file: never
  copy them into edit's old_string.
- By default up to 2000 lines from the start; pass offset (1-based line) and limit to page through
  larger files. The result says how to continue.
- Very long lines are cut with a marker. Binary files are refused with a note saying what they are.
- You must read a file before you edit or overwrite it, and read it again if it changed on disk.
- Prefer reading several files in parallel calls when you need them all."""

WRITE_DESCRIPTION = """Write a file, replacing its whole content, or create it (parent directories
are created).
- Overwriting an existing file requires that you read it first in this session and that it has not
  changed on disk since; otherwise the call is refused.
- An existing file keeps its line endings (CRLF) and byte-order mark.
- Prefer edit for changing part of a file: it is cheaper and shows a precise diff. Use write for new
  files or complete rewrites."""

EDIT_DESCRIPTION = """Replace text in a file: old_string becomes new_string.
- Read the file first; edits to unread files, or to files changed on disk since you read them, are
  refused.
- old_string must be copied from the file's content (without the line-number prefix read shows) and
  must match exactly one place; include a few surrounding lines to make it unique. Set replace_all
  to true to change every occurrence (e.g. renaming a variable).
- Small differences in indentation, whitespace or escaping are tolerated, but exact text is safest.
  A fuzzy match much larger than old_string is refused.
- old_string and new_string must differ. An empty old_string creates a new file containing
  new_string.
- The result shows the changed region with line numbers, so there is no need to re-read the file to
  check the edit."""

GREP_DESCRIPTION = """Search file contents with a regular expression (ripgrep syntax, e.g.
"def \\w+\\(", "TODO|FIXME").
- Files ignored by .gitignore are skipped. Results are matching lines as path:line: text, files most
  recently modified first, at most 100 lines; narrow the pattern, path or include when the result
  says it was truncated.
- Use this instead of running grep or rg through bash."""

GLOB_DESCRIPTION = """Find files by name pattern, e.g. "**/*.py", "src/**/test_*.ts", "*.md" (a
pattern without "/" matches at any depth).
- Files ignored by .gitignore are skipped. At most 100 paths, most recently modified first; narrow
  the pattern when the result says it was truncated.
- Use this instead of find or ls through bash."""

BASH_DESCRIPTION = """Run a shell command (bash -c) and wait for it to finish; returns its combined
stdout and stderr and exit code.
- workdir: directory to run in, relative to the project root or absolute (default the project root).
  Use it instead of "cd dir && ...".
- timeout: milliseconds, default 120000, at most 600000. On timeout the command and everything it
  started are killed.
- stdin is closed: interactive programs will not get input. Commands run non-interactively (no
  pager, no git password prompt).
- For servers, watchers, REPLs or anything long-running, use the process tool instead; a command
  that backgrounds work with & has those children stopped when it ends.
- Long output keeps its start and end; the full text is saved to a file whose path the result gives
  (read or grep it).
- Prefer read, edit, write, grep and glob over cat, sed, echo >, grep and find."""

PROCESS_DESCRIPTION = """Manage long-running background processes (dev servers, watchers, REPLs,
long builds).
- action "start" with command: run it in the background (bash -c, project root); returns an id like
  "p1" at once, with any first output.
- action "list": every process with its status, pid and runtime.
- action "read" with id: the output produced since your last read (older output beyond about 200K
  characters is dropped with a marker).
- action "write" with id and input: send input to its stdin as given (end it with a newline to
  submit a line); returns any output that follows.
- action "stop" with id: stop it and its children (SIGTERM, then SIGKILL).
- Processes keep running across turns until stopped; all are stopped when the session ends. At most
  8 run at once."""


def _schema(name: str, description: str, required: list[str], **properties: tuple) -> dict:
    """A tool schema; a property is (JSON type, description) or (JSON type, description, more
    of the JSON schema: an enum, a minimum), which _check_input enforces."""
    props = {key: {"type": kind, "description": text, **(more[0] if more else {})}
             for key, (kind, text, *more) in properties.items()}
    input_schema = {"type": "object", "properties": props, "required": required}
    return {"name": name, "description": description, "input_schema": input_schema}


SCHEMAS = [
    _schema(
        "read", READ_DESCRIPTION, ["file_path"],
        file_path=("string",
                   "File or directory to read, relative to the project root or absolute."),
        offset=("integer", "1-based line number to start from.", {"minimum": 1}),
        limit=("integer", "Number of lines to read.", {"minimum": 1})),
    _schema(
        "write", WRITE_DESCRIPTION, ["file_path", "content"],
        file_path=("string", "File to write, relative to the project root or absolute."),
        content=("string", "The complete new content of the file.")),
    _schema(
        "edit", EDIT_DESCRIPTION, ["file_path", "old_string", "new_string"],
        file_path=("string", "File to edit, relative to the project root or absolute."),
        old_string=("string", "Text to replace, copied from the file."),
        new_string=("string", "Replacement text (must differ from old_string)."),
        replace_all=("boolean",
                     "Replace every occurrence instead of exactly one (default false).")),
    _schema(
        "grep", GREP_DESCRIPTION, ["pattern"],
        pattern=("string", "Regular expression to search for."),
        path=("string", "File or directory to search (default: project root)."),
        include=("string", "Glob for the file names to search, e.g. \"*.py\" or \"*.{ts,tsx}\".")),
    _schema(
        "glob", GLOB_DESCRIPTION, ["pattern"],
        pattern=("string", "Glob pattern, e.g. \"**/*.py\"."),
        path=("string", "Directory to search (default: project root).")),
    _schema(
        "bash", BASH_DESCRIPTION, ["command"],
        command=("string", "The shell command to run."),
        timeout=("integer", "Timeout in milliseconds (default 120000, max 600000).",
                 {"minimum": 1}),
        workdir=("string", "Directory to run the command in (default: project root).")),
    _schema(
        "process", PROCESS_DESCRIPTION, ["action"],
        action=("string", "What to do.", {"enum": ["start", "list", "read", "write", "stop"]}),
        id=("string", "Process id from start or list (for read, write, stop)."),
        command=("string", "Shell command to start (for start)."),
        input=("string", "Text to send to the process's stdin (for write).")),
]
SCHEMA_OF = {schema["name"]: schema for schema in SCHEMAS}


def _glob_base(args: dict) -> str:
    """The directory a glob call starts from: its path joined with the pattern's fixed part."""
    pattern = posixpath.join(str(args.get("path") or "."), str(args.get("pattern") or ""))
    return sandbox.glob_base(pattern)


def _process_subject(args: dict) -> tuple[str, dict]:
    """start runs a command line; write feeds the running one; list, read and stop act on
    processes judged when they started (list and read only look)."""
    action = args.get("action") or ""
    if action == "start":
        return "bash", args
    if action == "write":
        return "feed", args
    return "held", {"action": f"process {action}", "read_only": action in ("list", "read")}


# Beside the schemas, how a tool's calls are shown, so that adding a tool touches this file
# (the kernel puts both on the events; the UI imports nothing of ours):
# `card`: the input fields its card line names, each after its prefix, absent ones left out;
# `output`: what a finished card shows of the output: "none" (the card or its diff says it
# all), "head" (the first lines say most) or "tail" (the first and last lines);
# `preview`: the input field the permission panel shows, or "edit" for the old and new text;
# `judged`: what its permission is judged on, (kind, fields) from the input (permission_subject).
TOOL_VIEWS = {
    "read": {"card": [("", "file_path")], "output": "none", "preview": None,
             "judged": lambda args: ("read", args)},
    "write": {"card": [("", "file_path")], "output": "none", "preview": "content",
              "judged": lambda args: ("write", args)},
    "edit": {"card": [("", "file_path")], "output": "none", "preview": "edit",
             "judged": lambda args: ("write", args)},
    "grep": {"card": [("", "pattern"), ("in ", "path")], "output": "head", "preview": None,
             "judged": lambda args: ("read", {"file_path": args.get("path") or "."})},
    "glob": {"card": [("", "pattern")], "output": "head", "preview": None,
             "judged": lambda args: ("read", {"file_path": _glob_base(args)})},
    "bash": {"card": [("", "command")], "output": "tail", "preview": "command",
             "judged": lambda args: ("bash", args)},
    "process": {"card": [("", "action"), ("", "id"), ("", "command")], "output": "tail",
                "preview": None, "judged": _process_subject},
}
PREVIEW_CHARS = 2000
# A card shows one line: a 300 KB command is not copied into the log a second time.
CARD_SUMMARY_CHARS = 500


def card_of(name: str, tool_input: dict) -> dict:
    """What a call's card shows: {"summary": "pattern in src", "output": "head"}. An unknown
    tool is named by its first string input."""
    if not isinstance(tool_input, dict):
        # a streamed input that was not a JSON object
        tool_input = {}
    view = TOOL_VIEWS.get(name)
    if view is None:
        summary = next((v for v in tool_input.values() if isinstance(v, str)), "")
        return {"summary": summary[:CARD_SUMMARY_CHARS], "output": "tail"}
    parts = [f"{prefix}{tool_input[key]}" for prefix, key in view["card"] if tool_input.get(key)]
    summary = " ".join(parts)[:CARD_SUMMARY_CHARS]
    return {"summary": summary, "output": view["output"]}


def permission_subject(name: str, tool_input: dict) -> tuple[str, dict]:
    """What permissions.decide judges a call on: (kind, fields). The kinds, agreed with
    permissions.py: "bash" a shell command line (command, workdir), "read" a path read and "write"
    a path written (file_path), "feed" text fed to a running process (input; the kernel adds the
    command the process `id` runs), "held" an act on a process judged when it started (action,
    read_only: it only looks).
    A tool this file does not declare is kind "unknown", which permissions.py denies."""
    if not isinstance(tool_input, dict):
        # a streamed input that was not a JSON object
        tool_input = {}
    view = TOOL_VIEWS.get(name)
    if view is None:
        return "unknown", {"tool": name}
    kind, fields = view["judged"](tool_input)
    # a path judged as the tools open it (Workspace.resolve)
    return kind, {key: _fs_path(value) if key in ("file_path", "workdir") and
                  isinstance(value, str) else value for key, value in fields.items()}


def permission_preview(name: str, tool_input: dict) -> str:
    """What the permission panel shows: the command, the content about to be written, the
    edit's old and new text, or else the input itself."""
    field = TOOL_VIEWS.get(name, {}).get("preview")
    if field == "edit":
        return f"- {tool_input.get('old_string', '')}\n+ {tool_input.get('new_string', '')}"
    if field == "command":
        return str(tool_input.get("command", ""))
    if field is not None:
        return str(tool_input.get(field, ""))[:PREVIEW_CHARS]
    return json.dumps(tool_input)[:PREVIEW_CHARS]

# ---------------------------------------------------------------- exceptions and data types


class ToolError(Exception):
    """A failure the model should read and repair; Toolbox.run turns it into an is_error result."""

    def __init__(self, message: str, **meta):
        super().__init__(message)
        self.meta = meta


@dataclass
class ToolResult:
    # What the model reads (budgeted, truncated with markers).
    text: str
    is_error: bool = False
    # JSON-serialisable UI metadata, e.g. {"exit_code": 0}.
    meta: dict = field(default_factory=dict)


@dataclass
class Child:
    """A started process: its handle and our ends of the pipes Workspace.exec made for it."""
    proc: "Started"
    stdout: asyncio.StreamReader
    stdin: asyncio.StreamWriter | None = None
    transports: list = field(default_factory=list)
    # The guarded files before an approved step started it (see guard_record); None: read-only.
    guarded: dict | None = None
    # the index's gitlinks then (see gitlinks)
    gitlinks: tuple = ()

    @property
    def pid(self) -> int:
        # Also its process group id (start_new_session).
        return self.proc.pid

    def close_pipes(self) -> None:
        for transport in self.transports:
            transport.close()


class Started:
    """A process started by _popen_off_the_loop, with what tools use of asyncio's Process: pid,
    returncode (None while it runs) and wait(). A thread waits for it and reaps it as soon as it
    exits, as asyncio's own watcher does."""

    def __init__(self, popen: subprocess.Popen, loop: asyncio.AbstractEventLoop):
        self.popen = popen
        self.pid = popen.pid
        # Its start (see started_ticks), read while it is not reaped yet: a leader that exits at
        # once (`sh -c 'server &'`) is gone from /proc as soon as the thread below reaps it.
        fields = sandbox.proc_stat(self.pid)
        self.ticks = int(fields[19]) if len(fields) > 19 else None
        self.exited = loop.create_future()
        threading.Thread(target=self._wait, args=(loop,), daemon=True).start()

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self.exited)

    def _wait(self, loop: asyncio.AbstractEventLoop) -> None:
        code = self.popen.wait()
        with contextlib.suppress(RuntimeError):       # the loop has closed
            loop.call_soon_threadsafe(self.exited.set_result, code)


async def _popen_off_the_loop(argv: list[str], **options) -> Started:
    """subprocess.Popen in a thread: it returns once the child has exec'd, and the fork, with the
    sandbox set up in the child before exec, held the event loop 30-50 ms in a 200 MB heap.
    Cancelled meanwhile, it waits for Popen all the same (the caller closes the pipe ends Popen
    hands the child), kills and reaps what it started, and is cancelled then."""
    starting = asyncio.ensure_future(asyncio.to_thread(subprocess.Popen, argv, **options))
    cancelled = False
    while not starting.done():
        try:
            await asyncio.wait({starting})
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if starting.exception() is None:
            _kill_group(starting.result().pid)
            threading.Thread(target=starting.result().wait, daemon=True).start()    # reaped
        raise asyncio.CancelledError
    return Started(starting.result(), asyncio.get_running_loop())

# ---------------------------------------------------------------- Workspace: the world seam


class Workspace:
    """Where tools touch the world: path resolution, file bytes in and out, subprocesses.

    Local only in V1; a remote workspace would reimplement these methods. Helpers that only stat or
    list take a Workspace rather than widening this class.
    """

    def __init__(self, cwd: Path):
        # The project root; relative paths start here.
        self.cwd = Path(cwd).resolve()
        # KHAELOR_HOME (the Toolbox sets it to the one it was given).
        self.home = events.khaelor_home()
        # The session's TMPDIR, made on first use; Toolbox.close removes it.
        self.temp_dir: Path | None = None
        # Landlock ABI; 0: commands run unconfined.
        self.abi = sandbox.probe()[0]
        # The project's secret files and what the user's rules deny reading (see prepare).
        self.secrets = sandbox.SecretScan()
        # the files the user's rules deny writing, found as the secrets are
        self.frozen = sandbox.SecretScan()
        # .git/index's stamp and the gitlinks it held (see gitlinks)
        self.gitlinks: tuple = (None, ())
        # the folders holding a repository of their own, found as the secrets are (see gitlinks)
        self.repositories = sandbox.SecretScan(DEPENDENCY_FOLDERS)
        # Landlock ruleset fds by what they were built from (see prepare), which runs in threads.
        self.rulesets: dict[tuple, int] = {}
        self.rulesets_lock = threading.Lock()
        weakref.finalize(self, _close_all, self.rulesets)
        # Environment names the user's own config passes to commands (fnmatch patterns).
        self.pass_env: list[str] = []
        # HOME for commands: the user's, never a folder of the project.
        self.user_home = _user_home(self.cwd)
        # PATH for khaelor's own programs (git, rg): never one a step could plant.
        self.own_path = _own_path(os.environ.get("PATH", ""), self.cwd)

    def resolve(self, path: str) -> Path:
        """An absolute, normalised path for a model-given path (relative to the project root). A
        file named as a folder ("f.txt/", "f.txt/.", "f.txt/../g") is refused, as open() would
        (ENOTDIR): normpath drops what follows the file's name."""
        path = _fs_path(path)
        joined = os.path.join(self.cwd, os.path.expanduser(path))
        resolved = Path(os.path.normpath(joined))
        if joined != str(resolved) and resolved.exists() and not os.path.exists(joined):
            raise ToolError(f"{_one_line(path)}: not a directory (a file's name is followed by "
                            "\"/\").", error="not_a_directory")
        return resolved

    def display(self, path: Path) -> str:
        """Project-relative when inside the project, absolute otherwise."""
        with contextlib.suppress(ValueError):
            return path.relative_to(self.cwd).as_posix() or "."
        return str(path)

    # ------------------------------------------------ files: opened as judged, through no link

    def places(self, confine: Confine) -> list[str]:
        """Where one call's file tools may open: the project and the outside paths its decision
        named (real paths: permissions.py judged each call's realpath)."""
        return [str(self.cwd), *confine.paths]

    def judged(self, path: Path, places: list[str]) -> str:
        """`path`'s real path, which must lie within `places`: what the permission judged, not
        where a link changed since then now leads."""
        real = _realpath(path)
        if not sandbox.within(real, places):
            raise ToolError(
                f"{_one_line(self.display(path))} resolves to {_one_line(real)}, outside the "
                "project and the paths approved for this call: not opened. Name that path itself "
                "to be asked (--yes approves nothing outside: then ask the user in your reply).",
                error="outside", path=real)
        return real

    def open_judged(self, path: Path, places: list[str], flags: int) -> int:
        """A descriptor for `path` (see judged), opened without following any link: one swapped into
        its path after the check makes the open fail, not go elsewhere. Never blocks on a FIFO."""
        real = self.judged(path, places)
        try:
            return sandbox.open_no_links(real, flags | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as exc:
            raise self.refusal(path, exc) from None

    def refusal(self, path: Path, exc: OSError) -> OSError | ToolError:
        """What to raise for an open that failed: a clear ToolError for a link met on the way
        (ELOOP) or a socket (ENXIO), the OSError itself otherwise."""
        shown = self.display(path)
        if exc.errno == errno.ENXIO:
            return ToolError(f"{_one_line(shown)} is a socket, not a file.", error="not_a_file")
        if exc.errno != errno.ELOOP:
            return exc
        return _raced(shown)

    def read_file(self, path: Path, places: list[str]) -> bytes:
        """A regular file's bytes (see open); a FIFO, device or socket is refused unread, and a file
        past READ_FILE_CAP_BYTES (or growing past it while it is read) is too large."""
        with os.fdopen(self.open_judged(path, places, os.O_RDONLY), "rb") as handle:
            return _read_regular(handle, self.display(path))

    def write_file(self, path: Path, data: bytes, places: list[str], force: bool = False) -> None:
        """Atomic: a temp file in the same directory, fsynced, renamed over the target; mode kept.
        A link is followed when it leads within `places`, so the link survives. The folder is
        opened as open_judged does (missing ones made from their parent's descriptor) and the
        temp file made and renamed in it, so a link swapped in meanwhile is never written
        through. New files get the umask's mode; a read-only file is left alone but by `force`."""
        folder, name = os.path.split(self.judged(path, places))
        try:
            folder_fd = _open_folder(folder)
        except OSError as exc:
            raise self.refusal(path, exc) from None
        with _closing(folder_fd):
            mode = self.file_mode(path, name, folder_fd)
            writable = mode is None or mode & 0o222 and os.access(name, os.W_OK, dir_fd=folder_fd)
            if not writable and not force:
                # rename() would replace a file the user made read-only (chmod a-w); open() refuses
                raise ToolError(f"{_one_line(self.display(path))} is read-only (mode {mode:o}), so "
                                "it was not changed; if it should change, ask the user.",
                                error="read_only")
            # A new file's temp is created 0o666 and the kernel applies the umask: reading the umask
            # would mean setting it, process-wide, while other threads may be creating files.
            create_mode = 0o666 if mode is None else 0o600
            tmp = f".{name}.{os.urandom(6).hex()}.tmp"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(tmp, flags, create_mode, dir_fd=folder_fd)
            except OSError as exc:
                # the error names the file asked for (a read-only file system), not its temp
                exc.filename = self.display(path)
                raise
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    if mode is not None:
                        os.fchmod(fd, mode)
                    os.fsync(fd)
                os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=folder_fd)
                raise

    def file_mode(self, path: Path, name: str, folder_fd: int) -> int | None:
        """The permission bits of the regular file `name` in the folder, None when there is none."""
        try:
            found = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(found.st_mode):
            # realpath left it a link: it loops (or was swapped in since); not followed.
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), self.display(path))
        if not stat.S_ISREG(found.st_mode):
            raise _not_regular(self.display(path), found.st_mode)
        return found.st_mode & 0o7777

    async def exec(self, command: str | list[str], *, cwd: Path | None = None,
                   stdin: bool = False, confine: Confine | None = None,
                   ports: Callable[[], set[int]] = set) -> Child:
        """Start a process in a new session (its own process group), stdout and stderr in one pipe,
        confined as `confine` says (None: DEFAULT_CONFINE); `ports()` names the loopback ports it
        may connect to without network (asked at each connect where seccomp supervises it).

        A string runs through bash -c, a list is an argv; stdin is closed unless asked for. The
        pipes are ours, not asyncio's: asyncio's Process.wait() also waits for its pipes to close,
        which a backgrounded grandchild can put off for ever."""
        if isinstance(command, str):
            argv = [shutil.which("bash", path=self.own_path) or "/bin/sh", "-c", command]
        else:
            argv = command
        confine = confine or DEFAULT_CONFINE
        # Off the event loop: the environment, git's driver scan (a git process) and the ruleset
        # (a /proc port scan) take tens of milliseconds.
        env, entry = await asyncio.to_thread(self.prepare, argv, confine, cwd or self.cwd, ports)
        out_read, out_write = os.pipe()
        if stdin:
            in_read, in_write = os.pipe()
        else:
            in_read, in_write = subprocess.DEVNULL, None
        try:
            proc = await _popen_off_the_loop(
                argv, cwd=cwd or self.cwd, env=env, stdin=in_read, stdout=out_write,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=entry and entry.hook)
            if entry:
                entry.started()
        except BaseException as exc:
            os.close(out_read)
            if stdin:
                os.close(in_write)
            if isinstance(exc, subprocess.SubprocessError):
                # The child could not enter the sandbox: it did not run.
                raise ToolError(
                    f"The command was not run: the sandbox could not be applied ({exc}).",
                    error="sandbox") from None
            raise
        finally:
            os.close(out_write)
            if stdin:
                os.close(in_read)
            if entry:
                # The child has exec'd (or failed): the parent needs it no longer.
                entry.close()
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        out_file = os.fdopen(out_read, "rb", 0)
        in_file = os.fdopen(in_write, "wb", 0) if stdin else None
        child = Child(proc, reader)
        try:
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), out_file)
            child.transports.append(transport)
            if in_file:
                transport, protocol = await loop.connect_write_pipe(
                    asyncio.streams.FlowControlMixin, in_file)
                child.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
                child.transports.append(transport)
        except BaseException:
            # Cancelled (Esc) as a pipe was connected: the command is not in box.groups yet, and
            # would run on where nothing stops it.
            _kill_group(proc.pid)
            child.close_pipes()
            out_file.close()
            if in_file:
                in_file.close()
            raise
        return child

    def capture(self, argv: list[str], **options) -> tuple[int, str]:
        """capture_bytes with stdout decoded (git's repository facts)."""
        code, out = self.capture_bytes(argv, **options)
        return code, out.decode("utf-8", "replace")

    def capture_bytes(self, argv: list[str], *, cwd: Path | None = None,
                      timeout_s: float = 10.0, confine: Confine = READ_ONLY_CONFINE,
                      scan_git: bool = True, env: dict | None = None,
                      stdin: bytes | None = None) -> tuple[int, bytes]:
        """Run a short command synchronously, read-only unless `confine` says otherwise, with
        `env` added and `stdin` fed to it: (exit code, stdout). Failing to start, or timing out,
        gives -1 and the reason."""
        if _runs_git(argv):
            # a git run on khaelor's own shadow repository (GIT_DIR) opens only the work tree's
            stall = _git_stall(cwd or self.cwd, own_repository="GIT_DIR" in (env or {}))
            if stall:
                return -1, f"git not run: {stall} is a FIFO or a device, git would wait".encode()
        try:
            prepared, entry = self.prepare(argv, confine, cwd or self.cwd, None, scan_git)
        except OSError as exc:
            return -1, str(exc).encode()
        prepared.update(env or {})
        prepared["PATH"] = self.own_path
        feed = {"stdin": subprocess.DEVNULL} if stdin is None else {"input": stdin}
        try:
            done = subprocess.run(
                argv, cwd=cwd or self.cwd, capture_output=True, timeout=timeout_s, env=prepared,
                start_new_session=True, preexec_fn=entry and entry.hook, **feed)
        except (OSError, subprocess.SubprocessError) as exc:
            return -1, str(exc).encode()
        finally:
            if entry:
                entry.close()
        return done.returncode, done.stdout

    def run_attached(self, argv: list[str], confine: Confine) -> int:
        """Run a command confined as `confine`, on khaelor's own terminal (`khaelor sandbox`): its
        exit code."""
        env, entry = self.prepare(argv, confine, Path.cwd(), set)
        # What the command leaves running is handed to khaelor as its parents end, and ends with
        # it, as a session's step ends with its group (which on the user's terminal would be
        # stopped reading it): it would write the project after the guard looked (a hook).
        sandbox.become_subreaper()
        try:
            child = subprocess.Popen(argv, env=env, preexec_fn=entry and entry.hook)
            if entry:
                entry.started()
        finally:
            if entry:
                entry.close()
        code = child.wait()
        _end_children()
        # killed by a signal: 128 + N, as a shell says (SIGPIPE under `| head -1` is 141)
        return 128 - code if code < 0 else code

    # ------------------------------------------------ confinement: environment and Landlock ruleset

    def prepare(self, argv: list[str], confine: Confine, cwd: Path,
                ports: Callable[[], set[int]] | None,
                scan_git: bool = True) -> tuple[dict, "sandbox.Entry | None"]:
        """(environment, what the child needs to enter its sandbox, or None: unconfined) for one
        command. The caller closes the entry once the child has started, after entry.started()
        where it has a connect supervisor; `ports` None: no session server to reach, and no
        supervisor (subprocess.run gives no moment to start one)."""
        read_only = not confine.write
        temp = str(self.session_temp())
        env = sandbox.child_environment(os.environ, self.pass_env, confine.network, self.user_home)
        env.update(EXEC_ENV_OVERRIDES)
        env.update(dict.fromkeys(("TMPDIR", "TMP", "TEMP"), temp))
        if read_only:
            # git status would otherwise refresh .git/index.
            env["GIT_OPTIONAL_LOCKS"] = "0"
        keys = self.repository_git_drivers(cwd) if _runs_git(argv) and scan_git else []
        settings = sandbox.git_settings(read_only, keys)
        # numbered after the user's own GIT_CONFIG_* entries where the command gets them
        carried = os.environ if confine.unconfined else env
        env.update(sandbox.git_env(carried, settings))
        # the user's own `!` command
        if confine.unconfined:
            own = {name: os.environ[name] for name in sandbox.SEARCH_PATHS if name in os.environ}
            return {**os.environ, **env, **own}, None
        # An approved command reaches the session's servers through the connect supervisor where
        # seccomp has one; otherwise through Landlock's port rules (a port then open on every host).
        supervisor = None
        if ports and sandbox.seccomp_available() and confine.write and not confine.network:
            supervisor = sandbox.Supervisor(ports)
        ruleset = mounts = None
        if self.abi:
            sandbox.make_parents(confine.paths)
            # what the user's rules deny reading stays closed to every command
            names, paths = (), confine.deny_paths
            if (read_only or confine.unattended) and not confine.secrets:
                names, paths = confine.hide, confine.hide_paths
            elif read_only and confine.secret_paths:
                # an approved secret read opens what it names, not every secret of the project
                # (`cat .env; git grep KEY` printed a tracked secrets.yml no question named)
                names, paths = confine.hide, confine.hide_paths
            hidden = self.secrets.find(str(self.cwd), names, paths)
            hidden = [path for path in hidden if path not in confine.secret_paths]
            if names and read_only:
                # (an approved build reads them, --yes's a copy without their secrets, below:
                # Maven stops on a settings.xml it cannot read, and actions/setup-java writes one;
                # the judge asks before a command that names them)
                hidden += sandbox.home_credentials(str(Path.home()))
            # and what only the user changes stays as it is (an approved command's namespace)
            frozen = []
            if confine.write:
                frozen = [str(self.cwd / name) for name in confine.frozen_files
                          if os.path.isfile(self.cwd / name)]
                frozen += self.frozen.find(str(self.cwd), (), confine.frozen_paths)
            # and khaelor's own code, where an approved path holds it (an install's ~/.local holds
            # pipx's venv: a postinstall that wrote a .pth there would run unconfined next start)
            approved = [os.path.realpath(path) for path in confine.paths]
            if confine.write and sandbox.within(OWN_CODE, approved):
                frozen.append(OWN_CODE)
            # Under --yes, a line that runs more than git's network (`curl -d @.git/config`; `cat
            # .git/config > n`, which a later curl sends) sees .git/config without the credentials
            # CI leaves there; a read-only one too (what it prints, the model may send)
            replaced = ()
            if confine.unattended and not confine.git_network:
                replaced = self.git_config_without_credentials()
            if confine.unattended and confine.write:
                # (closed to a read-only one) a script names none: `python3 x.py` copied them for
                # a later curl, an install's setup.py sent them
                replaced += self.home_credentials_masked()
            # an approved command's namespace covers them: its ruleset leaves their folders whole
            cover = sandbox.cover_file(self.home) if hidden else ""
            mounts = sandbox.mounts_for(confine, self.cwd, self.temp_dir, hidden, frozen, cover,
                                        replaced)
            hidden = [] if mounts and confine.write else hidden
            static_ports = set() if supervisor or read_only or not ports else ports()
            # A ruleset serves again while nothing it was built from changed (Landlock copies it
            # into each child's domain): what was granted, the secrets left out and the folders
            # they sit in (rules hold inodes: a file made in such a folder needs a new rule).
            key = (confine.write, confine.network, confine.paths_write, tuple(confine.paths),
                   tuple(confine.read_paths), tuple(map(sandbox.approved_target, confine.paths)),
                   tuple(hidden),
                   self.secrets.version if hidden else 0, os.stat(self.cwd).st_mtime_ns,
                   str(self.temp_dir), self.home, tuple(sorted(static_ports)))
            with self.rulesets_lock:
                kept = self.rulesets.get(key)
                if kept is None:
                    # its rule holds the folder, so it must exist before the first spill
                    os.makedirs(sandbox.spill_folder(self.home, self.cwd), 0o700, exist_ok=True)
                    kept = sandbox.build_ruleset(
                        confine, self.cwd, self.temp_dir, Path.home(), self.home, static_ports,
                        hidden)
                    if len(self.rulesets) >= RULESETS_KEPT:
                        # the oldest goes
                        os.close(self.rulesets.pop(next(iter(self.rulesets))))
                    self.rulesets[key] = kept
                # the entry's own copy: another thread may evict (close) the kept one before
                # this child starts, and its number could be reused meanwhile
                ruleset = os.dup(kept)
        program = sandbox.filter_for(confine, supervised=bool(supervisor))
        return env, sandbox.Entry(ruleset, program, sandbox.limits_for(confine), supervisor,
                                  mounts)

    def git_config_without_credentials(self) -> tuple[tuple[str, str], ...]:
        """((a git config, a copy with its credentials masked), …) for .git/config and each
        submodule's (actions/checkout leaves its extraheader there too) that holds one: a password
        in a URL, an authorization header, a token."""
        pairs = []
        for n, config in enumerate(self.git_configs()):
            data = _read_plain(Path(config), GUARD_FILE_CAP)
            text = "" if data is None else data.decode("utf-8", "surrogateescape")
            masked = mask_credentials(text)
            # (not a plain file within the cap, a FIFO: shown empty, never waited on or shown whole)
            if masked != text or data is None and os.path.lexists(config):
                pairs.append((config, self.spill_copy(f"git-config-{n}", masked)))
        return tuple(pairs)

    def git_configs(self) -> list[str]:
        """.git/config and the configs in .git/modules (submodules', nested ones beneath), real."""
        configs = [os.path.realpath(self.cwd / GIT_CONFIG)]
        for folder, names, files in os.walk(os.path.realpath(self.cwd / ".git" / "modules")):
            configs += [os.path.join(folder, "config")] * ("config" in files)
            # (not into a repository's objects, refs or logs: only where submodules are kept)
            names[:] = [name for name in names if name not in ("objects", "refs", "logs")]
        return configs

    def home_credentials_masked(self) -> tuple[tuple[str, str], ...]:
        """(each build credential file of the home, a copy without its secrets: BUILD_SECRETS)."""
        pairs = []
        for path in sandbox.home_credentials(str(Path.home())):
            name = os.path.basename(path)
            data = _read_plain(Path(path), GUARD_FILE_CAP)
            masked = BUILD_SECRETS[name].sub("", (data or b"").decode("utf-8", "surrogateescape"))
            if data is None or BUILD_SECRET_WORD.search(masked):
                masked = "<settings/>\n" if name.endswith(".xml") else ""
            pairs.append((path, self.spill_copy(name, masked)))
        return tuple(pairs)

    def spill_copy(self, name: str, text: str) -> str:
        """`text` written as `name` in this project's spill folder (private): what a mount shows."""
        copy = sandbox.spill_folder(self.home, self.cwd) / name
        copy.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        events.replace_private(copy, text.encode("utf-8", "surrogateescape"))
        return str(copy)

    def session_temp(self) -> Path:
        if self.temp_dir is None or not self.temp_dir.is_dir():
            # the pid names its owner: a later khaelor removes it once that process is gone
            self.temp_dir = Path(tempfile.mkdtemp(prefix=f"khaelor-session-{os.getpid()}-"))
            # Also when no Toolbox.close comes.
            weakref.finalize(self, shutil.rmtree, self.temp_dir, True)
        # an approved command's /dev/shm (sandbox.Mounts), made again if a command removed it, or
        # put a link, a file or a FIFO in its place (no later command would start)
        shm = self.temp_dir / "shm"
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISDIR(os.lstat(shm).st_mode):
                shm.unlink()
        shm.mkdir(exist_ok=True)
        return self.temp_dir

    def repository_git_drivers(self, cwd: Path) -> list[str]:
        """The code-running driver keys (diff.external, textconv, filters, …) that the
        repository's own config defines: local or worktree scope; the user's own global and system
        config are trusted."""
        argv = ["git", "config", "--show-scope", "--name-only", "-z",
                "--get-regexp", sandbox.GIT_DRIVER_KEYS.pattern]
        _, out = self.capture(argv, cwd=cwd, scan_git=False)
        # scope NUL key NUL …
        fields = out.split("\0")
        pairs = zip(fields[::2], fields[1::2])
        return [key for scope, key in pairs if scope in ("local", "worktree")]


@contextlib.contextmanager
def _closing(fd: int):
    """A descriptor closed when the block ends, however it ends."""
    try:
        yield fd
    finally:
        os.close(fd)


def _close_all(rulesets: dict[tuple, int]) -> None:
    for fd in rulesets.values():
        os.close(fd)
    rulesets.clear()


def _own_path(path: str, project: Path) -> str:
    """PATH without the folders a step could plant a program in: relative ones ("." or "bin", found
    from the project) and the project's own (an activated .venv)."""
    entries = [entry for entry in path.split(os.pathsep) if os.path.isabs(entry)]
    outside = [e for e in entries if not sandbox.within(os.path.realpath(e), [str(project)])]
    return os.pathsep.join(outside)


def _user_home(project: Path) -> str:
    """$HOME, unless it points into the project: then the account's own home directory."""
    import pwd
    home = os.path.expanduser("~")
    if sandbox.within(os.path.realpath(home), [str(project)]):
        return pwd.getpwuid(os.getuid()).pw_dir
    return home


def _runs_git(argv: list[str]) -> bool:
    """A command judged read-only has literal words only: it can run git only by naming it."""
    if os.path.basename(argv[0]) == "git":
        return True
    return argv[1:2] == ["-c"] and "git" in argv[-1]

# ---------------------------------------------------------------- the guard: nothing persists
# Inside a writable project Landlock cannot deny a subpath, so what would run code or grant rights
# later, unconfined (git's hooks and drivers when the user runs git, sandbox.GUARDED_DIRS, which
# git often ignores, so no diff shows them), is recorded before an approved step and compared after
# it. A change the user did not approve by name is put back, and what it had written is kept in the
# spill folder.
GIT_CONFIG = ".git/config"
# a rebase's todo list, whose exec lines the user's `git rebase --continue` runs
REBASE_TODO = ".git/rebase-merge/git-rebase-todo"
# an exec line as git's todo parser reads it: blanks, `exec` or `x`, blanks, the command line
TODO_EXEC = re.compile(rb"^[ \t]*(?:exec|x)[ \t]+(.*?)[ \t\r]*$", re.M)
# and what brings another config in: the worktree's own (read once extensions.worktreeConfig is
# set, a plain entry) and the pointer to a common git directory (whose config git reads)
GUARDED_FILES = (GIT_CONFIG, ".git/config.worktree", ".git/commondir", REBASE_TODO)
# and .git itself where it is a file (`gitdir: …`): one a step made where there was no repository,
# or rewrote, sends the user's git to a repository of its choosing (never named: always put back)
GIT_POINTER = ".git"
# and, for each gitlink (a submodule) in the index, the config and hooks of the repository it
# names: `git status` runs git there, which reads that config (gitlinks; a nested one may also set
# its work tree, as `git submodule add` does), and `git submodule update` runs its hooks. Its .git
# may be a file that points to that repository: only into .git/modules/<its path>, as `git
# submodule add` writes it.
NESTED_GUARDED = ("{}/.git/config", ".git/modules/{}/config", "{}/.git", "{}/.git/hooks",
                  ".git/modules/{}/hooks")
NESTED_PLAIN = re.compile(r"core\.worktree", re.I)
# and, for each linked worktree (`git worktree add`), its git directory in .git/worktrees: git run
# in that worktree, outside the project, reads the config its commondir names and its
# config.worktree, and without a commondir that folder is a repository with config and hooks
WORKTREES = ".git/worktrees"
WORKTREE_GUARDED = ("commondir", "config.worktree", "config", "hooks")
# the commondir `git worktree add` writes: the project's own .git
WORKTREE_COMMONDIR = b"../..\n"
# A git config file as git's config.c reads it, token by token: blanks (only these: a form feed
# is not one), comments, [section "sub"] headers and `key = value` entries, any of them on one
# line; a value runs on past a backslash-newline and through quotes, and ends at its comment.
GIT_CONFIG_TOKEN = re.compile(r"""
    [ \t\r\n]+ | [#;][^\n]*
  | \[ (?P<section>[A-Za-z0-9.-]+) (?: [ \t\r\n]+ "(?P<sub>(?:[^"\\\n]|\\[^\n])*)" )? \]
  | (?P<key>[A-Za-z][A-Za-z0-9-]*) [ \t]*
    (?: = (?P<value>(?:\\.|"(?:[^"\\\n]|\\.)*"|[^"\\\n#;])*) (?:[#;][^\n]*)? )? (?=\n|\Z)
  | (?P<rest>.+)
""", re.X | re.S)
GUARD_FILE_CAP = 1 << 20


def gitlinks(ws: Workspace) -> tuple[str, ...]:
    """The paths .git/index holds a gitlink at, listed again only when the index changed; and the
    folders holding a repository of their own (`git init src`): the user's git run there reads
    its config and hooks, as `git status` reads a gitlink's."""
    nested = nested_repositories(ws)
    try:
        info = os.stat(ws.cwd / ".git" / "index")
    except OSError:
        return nested
    stamp = (info.st_ino, info.st_size, info.st_mtime_ns)
    if ws.gitlinks[0] != stamp:
        code, out = ws.capture(["git", "ls-files", "--stage", "-z"], cwd=ws.cwd)
        # "160000 <hash> <stage>\t<path>"
        links = [entry.split("\t", 1)[1] for entry in out.split("\0")
                 if code == 0 and entry.startswith("160000 ")]
        ws.gitlinks = (stamp, tuple(links))
    return tuple(dict.fromkeys(ws.gitlinks[1] + nested))


def nested_repositories(ws: Workspace) -> tuple[str, ...]:
    """The project's folders that hold a .git (a folder or a file), its top left out; dependency
    folders are not looked in (nobody runs git there)."""
    found = ws.repositories.find(str(ws.cwd), (".git",))
    folders = (os.path.relpath(os.path.dirname(path), ws.cwd) for path in found)
    return tuple(folder for folder in folders if folder != ".")


def nested_guarded(links: tuple[str, ...]) -> list[str]:
    return [form.format(link) for link in links for form in NESTED_GUARDED]


def linked_worktrees(project: Path) -> list[str]:
    """The guarded files of each linked worktree's git directory (.git/worktrees/<name>/…)."""
    with contextlib.suppress(OSError):
        folder = os.path.join(os.path.realpath(project), WORKTREES)
        with _closing(sandbox.open_no_links(folder, os.O_RDONLY | os.O_DIRECTORY)) as fd:
            names = sorted(os.listdir(fd))
        return [f"{WORKTREES}/{name}/{part}" for name in names for part in WORKTREE_GUARDED]
    return []


def _worktree_plain(rel: str, old: tuple | None, new: tuple | None) -> bool:
    """A linked worktree's guarded file removed (`git worktree remove`, `prune`: its config and
    hooks stay guarded), or its commondir made as `git worktree add` makes it."""
    made = old is None and new is not None and new[1] == WORKTREE_COMMONDIR
    return new is None or made and rel.endswith("/commondir")


def guard_record(project: Path, links: tuple[str, ...] = (),
                 hooks: str | None = None) -> dict[str, tuple[int, bytes] | None]:
    """The guarded files: relative path -> (mode, bytes; a link's target). A guarded folder reached
    through a link is recorded as that link and never walked: what it points to is not ours. Every
    folder is opened without following a link, and walked from its descriptor, so one swapped for a
    link meanwhile (by a process a step left running) is not entered either. `hooks`: the folder
    core.hooksPath named before the step (None: read it now)."""
    state = {}
    real = os.path.realpath(project)
    if hooks is None:
        hooks = hooks_folder_now(project)
    for top in (*GUARDED_FILES, GIT_POINTER, *sandbox.GUARDED_DIRS, *nested_guarded(links),
                *linked_worktrees(project), *filter(None, [hooks])):
        link = _first_link(project, top)
        folder, name = os.path.split(link or top)
        with contextlib.suppress(OSError):
            path = os.path.join(real, folder)
            with _closing(sandbox.open_no_links(path, sandbox.O_PATH)) as folder_fd:
                _record_entry(state, link or top, name, folder_fd)
        walked = top in sandbox.GUARDED_DIRS or top.endswith("/hooks") or top == hooks
        if link is not None or not walked:
            continue
        with contextlib.suppress(OSError):
            flags = os.O_RDONLY | os.O_DIRECTORY
            with _closing(sandbox.open_no_links(os.path.join(real, top), flags)) as top_fd:
                for folder, _, files, folder_fd in os.fwalk(".", dir_fd=top_fd):
                    for file in files:
                        rel = os.path.normpath(f"{top}/{folder}/{file}")
                        # git runs no hook named *.sample (git init and submodule add write them)
                        if not (file.endswith(".sample") and "/hooks/" in rel):
                            _record_entry(state, rel, file, folder_fd)
    return state


def hooks_folder(config: tuple[int, bytes] | None, project: Path) -> str:
    """The project folder (relative) that a recorded .git/config's core.hooksPath names: husky's
    .husky/_, which git ignores, so no diff shows a hook planted there; "" for none or one outside
    the project."""
    entries = _config_entries(config[1] if config else b"")
    values = [value for name, value in entries if name.lower() == "core.hookspath" and value]
    if not values:
        return ""
    real = os.path.realpath(project)
    rel = os.path.relpath(os.path.join(real, values[0].strip().strip('"')), real)
    return "" if rel == "." or rel.startswith("..") else rel


def hooks_folder_now(project: Path) -> str:
    """hooks_folder of the project's .git/config as it is now."""
    state = {}
    with contextlib.suppress(OSError):
        git = os.path.join(os.path.realpath(project), ".git")
        with _closing(sandbox.open_no_links(git, sandbox.O_PATH)) as fd:
            _record_entry(state, GIT_CONFIG, "config", fd)
    return hooks_folder(state.get(GIT_CONFIG), project)


def _record_entry(state: dict, rel: str, name: str, folder_fd: int) -> None:
    """Record `name` in the folder: a link as its target, a plain file of at most GUARD_FILE_CAP
    bytes as its bytes (opened without following a link, never waiting on a FIFO), anything else
    but a folder as present."""
    with contextlib.suppress(OSError):
        info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            state[rel] = (info.st_mode, os.fsencode(os.readlink(name, dir_fd=folder_fd)))
        elif stat.S_ISREG(info.st_mode):
            data = _read_plain(name, GUARD_FILE_CAP, folder_fd)
            if data is not None:
                state[rel] = (info.st_mode, data)
        elif not stat.S_ISDIR(info.st_mode):
            # a fifo or a device: recorded as present, so that its appearing is seen
            state[rel] = (info.st_mode, b"")


def _first_link(project: Path, rel: str) -> str | None:
    """The first component of `rel` (under the project) that is a link, if one is."""
    parts = rel.split("/")
    prefixes = ("/".join(parts[:n]) for n in range(1, len(parts) + 1))
    # (os.path, not pathlib: the guard asks this of every guarded path twice per approved step)
    folder = str(project)
    return next((prefix for prefix in prefixes if os.path.islink(f"{folder}/{prefix}")), None)


def guard_check(project: Path, spill_dir: Path, before: dict, command: str,
                confine: Confine, links: tuple[str, ...] = ()) -> str:
    """After an approved step: put back what it changed of the guarded files since `before`,
    unless the user approved this very command and it names them; what the step wrote goes to
    spill/guarded. `links`: the gitlinks before and after it. The note says what was put back,
    and where its version was kept."""
    named = command if confine.attended else ""
    keep = spill_dir / "guarded"
    nested = nested_guarded(links)
    hooks = hooks_folder(before.get(GIT_CONFIG), project)
    after = guard_record(project, links, hooks)
    restored = []
    lost = []
    for rel in sorted(set(before) | set(after)):
        old = before.get(rel)
        new = after.get(rel)
        if old == new or _named(rel, named, hooks):
            continue
        if rel == GIT_CONFIG and old and new and _git_config_plain(old[1], new[1]):
            continue
        if rel == REBASE_TODO and _rebase_todo_plain(old, new, command):
            continue
        # a repository a gitlink names may be made, changed plainly or removed (nothing then runs)
        if rel in nested and (not new or _nested_plain(rel, old[1] if old else b"", new, project)):
            continue
        if rel.startswith(WORKTREES + "/") and _worktree_plain(rel, old, new):
            continue
        # a copy that cannot be kept (a step filled the disk) must not keep the change in place
        if new is not None:
            try:
                keep.mkdir(parents=True, exist_ok=True)
                (keep / f"{rel.replace('/', '_')}.{os.urandom(3).hex()}").write_bytes(new[1])
            except OSError:
                lost.append(rel)
        try:
            _put_back(project, rel, old)
        except OSError as e:
            restored.append(f"{rel} (could not: {e.strerror})")
            continue
        restored.append(rel)
    if not restored:
        return ""
    kept = f"its version is kept in {keep}"
    if lost:
        kept = f"its version of {', '.join(lost)} could not be kept in {keep}"
    return (f"[khaelor: put back {', '.join(restored)}: this command changed "
            "what git, your editor or khaelor would run or grant later, and nobody approved "
            "that by name; "
            f"{kept}. To make such a change, run a command that names "
            "the file, so that the user's question shows it.]")


def _rebase_todo_plain(old: tuple | None, new: tuple | None, command: str) -> bool:
    """A rebase's todo list made, changed or removed by a step: plain unless it gained an exec
    line that the approved command does not spell out (`git rebase -x 'make test' main` does)."""
    before = set(TODO_EXEC.findall(old[1])) if old else set()
    gained = [line for line in TODO_EXEC.findall(new[1]) if line not in before] if new else []
    return all(os.fsdecode(line) in command for line in gained)


def _put_back(project: Path, rel: str, old: tuple[int, bytes] | None) -> None:
    """Make the project's `rel` what `old` recorded (None: absent). Every folder on the way is
    opened without following a link, and a link or a file found there is removed (it is the
    project's own entry), so that nothing outside the project is read, deleted or written, and a
    .git made a file that points git elsewhere is a folder again."""
    parts = rel.split("/")
    fd = os.open(project, sandbox.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            if not stat.S_ISDIR(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                os.unlink(part, dir_fd=fd)
                os.mkdir(part, dir_fd=fd)
            step = sandbox.open_no_links(part, sandbox.O_PATH | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = step
        name = parts[-1]
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(name, dir_fd=fd)
        if old is None:
            return
        mode, data = old
        if stat.S_ISLNK(mode):
            os.symlink(os.fsdecode(data), name, dir_fd=fd)
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with _closing(os.open(name, flags, stat.S_IMODE(mode), dir_fd=fd)) as out:
            written = 0
            while written < len(data):
                written += os.write(out, data[written:])
            os.fchmod(out, stat.S_IMODE(mode))
    finally:
        os.close(fd)


def _named(rel: str, command: str, hooks: str = "") -> bool:
    if not command:
        return False
    if rel in GUARDED_FILES:
        return rel in command or ("git config" in command and rel != REBASE_TODO)
    folders = (*sandbox.GUARDED_DIRS, hooks)
    return any(rel.startswith(name) and name in command for name in folders if name)


def _nested_plain(rel: str, old: bytes, new: tuple[int, bytes], project: Path) -> bool:
    if not rel.endswith("/.git"):
        return _git_config_plain(old, new[1], nested=True)
    link = rel[:-len("/.git")]
    pointer = new[1].decode("utf-8", "replace")
    if not stat.S_ISREG(new[0]) or not pointer.startswith("gitdir:"):
        return False
    target = os.path.normpath(os.path.join(link, pointer[len("gitdir:"):].strip()))
    # `git worktree add` names that worktree's git directory in full (guarded: linked_worktrees)
    inside = os.path.relpath(target, os.path.realpath(project)) if os.path.isabs(target) else target
    return target == f".git/modules/{link}" or os.path.dirname(inside) == WORKTREES


def _git_config_plain(old: bytes, new: bytes, nested: bool = False) -> bool:
    """Whether two versions of .git/config differ only in entries that run nothing (`nested`: the
    config of a repository a gitlink names, which may also set its work tree)."""
    changed = _config_entries(old) ^ _config_entries(new)
    for name, _ in changed:
        plain = sandbox.GIT_CONFIG_PLAIN.fullmatch(name)
        if not plain and not (nested and NESTED_PLAIN.fullmatch(name)):
            return False
    return True


def _config_entries(data: bytes) -> set[tuple[str, str | None]]:
    """(`section.sub.key`, its value as written) for each entry of a git config file, read as git
    reads it (GIT_CONFIG_TOKEN, past a BOM, CRLF as LF); from a line git cannot read (it stops
    there), the rest of the file as one entry named "", which is never plain."""
    entries = set()
    section = ""
    for token in GIT_CONFIG_TOKEN.finditer(_lf(_decode_text(data))):
        if token["section"]:
            section = token["section"]
            if token["sub"] is not None:
                section += "." + re.sub(r"\\(.)", r"\1", token["sub"])
        elif token["key"]:
            entries.add((f"{section}.{token['key']}", token["value"]))
        elif token["rest"]:
            entries.add(("", token["rest"]))
    return entries


# ---------------------------------------------------------------- Toolbox: the kernel's entry point


class Toolbox:
    """The seven tools behind one `run`, and the session's tool state: each file's edit history and
    the background processes (what the model has read it asks the log's fold)."""

    def __init__(self, workspace: Workspace, home: Path, emit: Callable[..., dict],
                 state: Callable[[], events.State]):
        self.workspace = workspace
        self.spill_dir = sandbox.spill_folder(home, workspace.cwd)
        self.emit = emit
        self.schemas = [dict(schema) for schema in SCHEMAS]
        # The log's fold: what the model has read (State.stamps) and the newest process number
        # (State.n_processes) are read from it, never copied, so a resumed session and a live
        # one agree.
        self.state = state
        # [real path, mtime_ns, size] the running call saw.
        self.seen: list[list] = []
        # Where the running call's file tools may open (Workspace.places).
        self.places = [str(workspace.cwd)]
        # Content-addressed file versions: a rewind to between two edits writes them back.
        self.versions_dir = Path(home) / "versions"
        # Process groups alive right now (bash and process).
        self.groups: set[int] = set()
        # tool_use_id -> what a command stopped by the user printed until then (output_when_stopped)
        self.stopped: dict[str, str] = {}
        # None: grep/glob use the Python fallback.
        self.ripgrep = shutil.which("rg", path=workspace.own_path)
        self.dotenv = _DotEnv(workspace.cwd)
        workspace.home = Path(home)
        self.checkpoints = Checkpoints(workspace, self.keep_version, self.load_version)
        self.processes = _Processes(self)
        # False: the boundary is incomplete here (the kernel asks for every command).
        self.sandboxed = bool(workspace.abi) and sandbox.seccomp_available()
        # -p without --yes: no one answers a permission question (the sandbox's note says so)
        self.asks_nobody = False
        # If khaelor dies without awaiting close(), every group is still killed at interpreter exit.
        weakref.finalize(self, _kill_groups, self.groups)

    async def run(self, name: str, tool_input: dict, tool_use_id: str,
                  confine: Confine | None = None) -> ToolResult:
        """Run one tool call, confined as the permission decision's `confine` says (sandbox.py;
        None: DEFAULT_CONFINE). Never raises, except CancelledError (the turn was interrupted)."""
        confine = confine or DEFAULT_CONFINE
        reads_secrets = confine.secrets or (name in ("bash", "process") and confine.write
                                            and not confine.unattended)
        await asyncio.to_thread(self.dotenv.refresh, reads_secrets)
        args, invalid = _checked(name, tool_input)
        if invalid:
            return invalid
        self.seen = []
        self.places = self.workspace.places(confine)
        try:
            result = await TOOLS[name](self, args, tool_use_id, confine)
        except ToolError as exc:
            result = ToolResult(str(exc), True, exc.meta)
        except OSError as exc:
            result = _os_error_result(exc)
        except Exception as exc:
            # A bug in a tool must not end the session; the model can work around it.
            text = (f"{name} failed unexpectedly ({type(exc).__name__}: {exc}); "
                    "this is a khaelor bug. Try a different approach.")
            result = ToolResult(text, True, {"error": "internal"})
        if self.seen:
            # In the log (ToolCompleted): the fold's stamps, what a resumed session knows too.
            result.meta["seen"] = self.seen
        result.text = self.mask(result.text)
        # bash budgets its own stream.
        if len(result.text) > OUTPUT_BUDGET_CHARS and "spill" not in result.meta:
            spool = _Spool(self.spill_dir, tool_use_id or name)
            spool.add(result.text)
            result.text = spool.finish(result.meta)
        return result

    def problem(self, name: str, tool_input: dict) -> ToolResult | None:
        """The failure a call is certain to meet whatever the user answers, asked before the gate
        (the kernel fails it as the model's mistake): an unknown tool, a bad input (a write with
        `path` and `text` must not ask "Write ."), an edit of a file not read (or changed since)
        or that old_string is not in (or is in several places). None: it may work."""
        _, invalid = _checked(name, tool_input)
        if invalid or name != "edit":
            return invalid
        try:
            self._plan_edit(tool_input)
        except ToolError as exc:
            return ToolResult(self.mask(str(exc)), True, exc.meta)
        return None

    def preview(self, name: str, tool_input: dict) -> str:
        """What the permission panel shows: for an edit of a file, the diff it will make as the
        tool plans it now (every place replace_all changes, a fuzzy match as it matched), else
        permission_preview's."""
        if name == "edit":
            with contextlib.suppress(ToolError):
                planned = self._plan_edit(tool_input)
                if planned is not None:
                    path, before, done = planned
                    shown = self.workspace.display(path)
                    _, _, diff = _diff(shown, _decode_text(before), _decode_text(done.after))
                    return self.mask(diff)
        return permission_preview(name, tool_input)

    def _plan_edit(self, tool_input: dict) -> tuple[Path, bytes, "_Replaced"] | None:
        """(the file, its bytes, the edit made of them) as the tool would plan the call now, or the
        ToolError it is certain to meet; None where that cannot be told yet (creating a file, a
        bad input and other failures are left to the tool itself)."""
        args, problem = _check_input(SCHEMA_OF["edit"], tool_input)
        if problem or not args["old_string"]:
            return None
        try:
            path = self.workspace.resolve(args["file_path"])
            if not path.is_file():
                return None
            # As the tool plans it, opening only the file the model read: before any approval.
            before, done = _planned_edit(self, args, path, [_realpath(path)])
        except OSError:
            return None
        return path, before, done

    async def close(self) -> None:
        """Stop every background process (ProcessExited cause "khaelor exit"); remove the TMPDIR."""
        await self.processes.close()
        _kill_groups(self.groups)
        if self.workspace.temp_dir is not None:
            shutil.rmtree(self.workspace.temp_dir, ignore_errors=True)
            self.workspace.temp_dir = None
        _close_all(self.workspace.rulesets)

    def live_output_path(self, tool_use_id: str, process_id: str = "") -> Path:
        """Where a running command's output is appended as it comes, so that a kill -9 loses none
        of what the user saw (output_when_lost reads it back on resume). A background process's
        is named by the call that started it and its id."""
        name = f"{tool_use_id}-{process_id}" if process_id else tool_use_id
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]
        return self.spill_dir / f"running-{safe}.txt"

    def output_when_lost(self, tool_use_id: str, process_id: str = "") -> str:
        """What a command (or a background process) printed before khaelor was killed under it,
        budgeted and masked."""
        path = self.live_output_path(tool_use_id, process_id)
        try:
            text = path.read_bytes().decode("utf-8", "replace")
            path.unlink()
        except OSError:
            return ""
        spool = _Spool(self.spill_dir, tool_use_id)
        spool.add(text)
        return self.mask(spool.finish({}).rstrip("\n"))

    def output_when_stopped(self, tool_use_id: str) -> str:
        """What a command printed before the user stopped it (budgeted and masked as a result is):
        the user saw it, and may well ask about it next."""
        return self.mask(self.stopped.pop(tool_use_id, ""))

    def mask(self, text: str) -> str:
        """Secrets out of a tool's text: khaelor's own API credential never reaches the model, the
        session log or a spill file, whatever shows it (env, printenv, a .env file); commands get it
        only where the user's config passes it (sandbox.child_environment). The values of the
        project's .env files, the passwords in URLs, tokens of known formats and HTTP
        authorization headers are masked the same way."""
        for name in SECRET_ENV:
            secret = os.environ.get(name)
            if secret and len(secret) >= 8 and secret in text:
                text = text.replace(secret, SECRET_MASK)
        for value in self.dotenv.values:
            if value in text:
                text = text.replace(value, DOTENV_MASK)
        if "PRIVATE KEY-----" in text:
            text = PRIVATE_KEY.sub(rf"\1 {PRIVATE_KEY_MASK} \2", text)
        if "diff --" in text:
            text = _mask_secret_diffs(text)
        return mask_credentials(text)

    def running_processes(self) -> list[dict]:
        """[{process_id, pid, command, runtime_s}] for the processes still running."""
        return [{"process_id": process.process_id, "pid": process.child.pid,
                 "command": process.command, "runtime_s": process.runtime_s()}
                for process in self.processes.live()]

    def stopping_for(self, process_id: str, typed: dict) -> None:
        """A slash command is about to stop this process: its ProcessExited carries the command's
        line (`typed`), which the UI shows above its ◆ line."""
        process = self.processes.items.get(process_id)
        if process is not None and process.ended is None:
            process.typed = typed

    def remember(self, path: Path) -> None:
        """Record that the model has seen this file as it is now (it read it, or wrote it): the
        call's result carries it to the log, whose fold the next check_fresh reads."""
        if stamp := _stamp(Path(_realpath(path))):
            self.seen.append([_realpath(path), *stamp])

    def keep_version(self, data: bytes) -> str:
        """Store a file's content under its sha256 in KHAELOR_HOME/versions (once); its name."""
        import hashlib
        name = hashlib.sha256(data).hexdigest()
        path = self.versions_dir / name
        if path.exists():
            # Still in use: a fresh mtime keeps prune_versions off it (failing, the version is
            # there; an old mtime only risks its pruning).
            with contextlib.suppress(OSError):
                os.utime(path)
        else:
            self.versions_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            events.replace_private(path, data)
        return name

    def load_version(self, name: str) -> bytes:
        return (self.versions_dir / name).read_bytes()

    def check_fresh(self, path: Path) -> None:
        """Refuse to change a file the model has not read, or that changed on disk since it did:
        this protects the user's own concurrent edits."""
        real = _realpath(path)
        shown = _one_line(self.workspace.display(path))
        seen = self.state().stamps.get(real)
        if seen is None:
            raise ToolError(
                f"{shown} exists and you have not read it in this session. "
                "Read it first, then retry, so your change starts from its actual content.",
                error="not_read")
        if _stamp(Path(real)) != seen:
            raise ToolError(
                f"{shown} has changed on disk since you last read it "
                "(someone may be editing it). "
                "Read it again, then redo your change on the current content.",
                error="stale")

    def commit(self, path: Path, before: bytes | None, after: bytes,
               tool_use_id: str) -> tuple[int, int]:
        """Write a file for write/edit: versions, stamp, FileModified. Returns (lines added,
        removed)."""
        # Both versions (blobs named by their sha256, so the history outlives the process) are
        # kept before the file changes: a rewind to between two edits needs them. None: created.
        before_version = None
        if before is not None:
            before_version = self.keep_version(before)
        after_version = self.keep_version(after)
        self.workspace.write_file(path, after, self.places)
        self.remember(Path(_realpath(path)))
        shown = self.workspace.display(path)
        added, removed, diff = _diff(shown, _decode_text(before or b""), _decode_text(after))
        self.emit(
            "FileModified", tool_use_id=tool_use_id, path=shown, added=added, removed=removed,
            diff=self.mask(diff), created=before is None, real_path=_realpath(path),
            before_version=before_version, after_version=after_version)
        return added, removed


def _os_error_result(exc: OSError) -> ToolResult:
    """A tool's OSError as a result the model can act on: what failed, where, and what to try."""
    where = f" ({exc.filename})" if exc.filename else ""
    hint = "Check the path and permissions, then retry or try another approach."
    if exc.errno == errno.E2BIG:
        hint = ("The command is too long for the system to start; "
                "write it to a script file and run that.")
    text = f"{exc.strerror or exc}{where}. {hint}"
    return ToolResult(text, True, {"error": type(exc).__name__})


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n")

# ---------------------------------------------------------------- file versions: pruning the store


def prune_versions(home: Path, keep_days: float = VERSIONS_KEEP_DAYS) -> int:
    """Remove file versions (KHAELOR_HOME/versions) unused for keep_days, at most once a day.
    Only plain files directly in versions/ with a sha256 name go; symlinks are never followed.
    Never raises: what cannot be checked or removed is left. Returns how many were removed."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        versions = os.open(Path(home) / "versions", flags)
    except OSError:
        # No versions yet, or versions/ is not a plain directory.
        return 0
    with _closing(versions):
        if not _prune_due(versions):
            return 0
        cutoff = time.time() - keep_days * 86_400
        _remove_old_shadows(Path(home) / "checkpoints", cutoff)
        return _remove_old_blobs(versions, cutoff)


def remove_dead_session_temps() -> None:
    """The session folders (Workspace.session_temp) of khaelors killed before they could remove
    them: this user's, not a link, and only once the process that made it is gone."""
    with contextlib.suppress(OSError), os.scandir(tempfile.gettempdir()) as entries:
        for entry in entries:
            owner = re.fullmatch(r"khaelor-session-(\d+)-\w+", entry.name)
            with contextlib.suppress(OSError):
                if not owner or not entry.is_dir(follow_symlinks=False):
                    continue
                if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                    continue
                try:
                    os.kill(int(owner[1]), 0)
                    # its khaelor still runs (PermissionError: another user's process does)
                    continue
                except ProcessLookupError:
                    shutil.rmtree(entry.path)


def _remove_old_shadows(checkpoints: Path, cutoff: float) -> None:
    """A project's shadow repository goes when its last checkpoint is older than the cutoff (each
    checkpoint rewrites info/exclude): the index copies its checkpoints need are gone by then."""
    with contextlib.suppress(OSError):
        for entry in list(os.scandir(checkpoints)):
            with contextlib.suppress(OSError):
                if not entry.is_dir(follow_symlinks=False):
                    continue
                stamp = os.stat(Path(entry.path) / "info" / "exclude", follow_symlinks=False)
                if stamp.st_mtime < cutoff:
                    shutil.rmtree(entry.path)


def _prune_due(versions: int) -> bool:
    """True if the last prune was a day ago or more; then the marker is touched (now the last)."""
    try:
        marker = os.stat(VERSIONS_PRUNE_MARKER, dir_fd=versions, follow_symlinks=False)
        if time.time() - marker.st_mtime < VERSIONS_PRUNE_INTERVAL_S:
            return False
    except FileNotFoundError:
        # Never pruned here.
        pass
    except OSError:
        return False
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
    try:
        with _closing(os.open(VERSIONS_PRUNE_MARKER, flags, 0o600, dir_fd=versions)) as fd:
            os.utime(fd)
    except OSError:
        # E.g. the marker is a symlink: prune nothing rather than follow it.
        return False
    return True


def _remove_old_blobs(versions: int, cutoff: float) -> int:
    removed = 0
    with contextlib.suppress(OSError):
        for entry in list(os.scandir(versions)):
            if not BLOB_NAME.fullmatch(entry.name):
                continue
            with contextlib.suppress(OSError):
                if not entry.is_file(follow_symlinks=False):
                    continue
                if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                    continue
                # unlink never follows a symlink.
                os.unlink(entry.name, dir_fd=versions)
                removed += 1
    return removed

# ---------------------------------------------------------------- checkpoints: the shadowed tree


# An untracked file larger than this is left out of a checkpoint (and named in it).
CHECKPOINT_FILE_CAP_BYTES = 20_000_000
# The most of the user's .git/index a checkpoint keeps (a sparse file could claim terabytes), and of
# HEAD or a loose ref.
INDEX_CAP_BYTES = 1 << 30
REF_CAP_BYTES = 4096
# Changed paths one CheckpointRecorded names; it counts them all.
CHECKPOINT_NAMES_CAP = 100
# The shadow repository's info/attributes (they outrank the work tree's .gitattributes): every file
# is stored as its bytes, with no end-of-line conversion and no filter (a filter is a program: lfs,
# or one a repository's attributes name).
SHADOW_ATTRIBUTES = "* -text -filter -ident -working-tree-encoding\n"
# Nothing ever collects the shadow's objects behind a checkpoint's back.
SHADOW_CONFIG = "[gc]\n\tauto = 0\n"
# git's mode of a symbolic link and of a nested repository (a gitlink, never written back).
LINK_MODE = "120000"
GITLINK_MODE = "160000"
ABSENT_MODE = "000000"
# A commit's name (sha1 or sha256).
OID = re.compile(r"[0-9a-f]{40,64}")


class CheckpointError(events.KhaelorError):
    """A checkpoint or a rewind that could not be done; the message says which git call failed."""


@dataclass(frozen=True)
class Repository:
    """Where git keeps the project's repository; None stands for "not a repository"."""
    # The work tree's top directory.
    root: Path
    # The worktree's own git directory (HEAD, index) and the shared one (objects, info/exclude).
    git_dir: Path
    common_dir: Path
    # The commit HEAD names when it was looked at ("" before the first commit), and its branch
    # ("" when detached).
    head: str
    branch: str


@dataclass
class Restore:
    """One path a rewind writes back (oid or data) or deletes (mode ABSENT_MODE)."""
    path: str
    mode: str
    oid: str = ""
    # The bytes of a write/edit version (they come from KHAELOR_HOME/versions, not git).
    data: bytes | None = None
    # The user changed it after the agent's last step: a rewind asks first.
    user_changed: bool = False


class Checkpoints:
    """The work tree as git sees it (tracked files with their changes, untracked files that are not
    ignored), recorded as a tree in a shadow repository under KHAELOR_HOME: never as refs, objects
    or an index in the user's .git, which the commands a checkpoint must undo destroy (`rm -rf
    .git`, `gc --prune=now`) and a push would publish. The user's objects are borrowed through
    objects/info/alternates and the user's index is copied, so a checkpoint costs what changed."""

    def __init__(self, workspace: Workspace, keep: Callable[[bytes], str],
                 load: Callable[[str], bytes]):
        self.workspace = workspace
        # store and fetch bytes by name (the toolbox's file versions): the user's index
        self.keep = keep
        self.load = load
        # the repository as last found, and as first found: where a rewind may put HEAD back
        self.known: Repository | None = None
        self.first: Repository | None = None

    def take(self, previous: str = "") -> dict:
        """A CheckpointRecorded payload (without its step): tree, git, head, branch, index (a
        version name), skipped (untracked files over the cap, FIFOs and the like), changed since
        `previous` (a tree)."""
        repo = self.repository()
        root = repo.root if repo else self.workspace.cwd
        shadow = self.shadow(root)
        self._prepare(shadow, root, repo)
        index = shadow / f"index.{os.getpid()}.{os.urandom(4).hex()}"
        try:
            payload = self._record(shadow, root, repo, index)
        finally:
            index.unlink(missing_ok=True)
        if previous:
            changed = []
            if previous != payload["tree"]:
                entries = self.entries(root, previous, payload["tree"]).items()
                changed = [[entry[4], path] for path, entry in entries]
            payload["n_changed"] = len(changed)
            payload["changed"] = changed[:CHECKPOINT_NAMES_CAP]
        return payload

    def repository(self) -> Repository | None:
        """The repository's layout and HEAD: as found before, while HEAD can be read from the ref
        files (one process less per checkpoint), else from git."""
        known = self.known
        if known and (known.git_dir / "HEAD").is_file():
            head, branch = _read_head(known.git_dir, known.common_dir)
            if head:
                return replace(known, head=head, branch=branch)
        self.known = self._discover()
        self.first = self.first or self.known
        return self.known

    def _discover(self) -> Repository | None:
        # One call: HEAD before its first commit makes it fail after printing the rest.
        argv = ["git", "rev-parse", "--path-format=absolute", "--show-toplevel",
                "--absolute-git-dir", "--git-common-dir", "HEAD"]
        _, out = self.workspace.capture(argv, scan_git=False)
        lines = out.splitlines()
        if len(lines) != 4:
            return None
        git_dir = Path(lines[1])
        common_dir = Path(lines[2])
        head = lines[3] if OID.fullmatch(lines[3]) else ""
        branch = _read_head(git_dir, common_dir)[1]
        return Repository(Path(lines[0]), git_dir, common_dir, head, branch)

    def shadow(self, root: Path) -> Path:
        home = self.workspace.home
        return home / "checkpoints" / events.sessions_dir(home, root).name

    def git(self, root: Path, argv: list[str], index: Path | None = None,
            stdin: bytes | None = None, timeout_s: float = 60.0) -> bytes:
        """git in the shadow repository over the work tree `root`; only the shadow is writable."""
        shadow = self.shadow(root)
        env = {"GIT_DIR": str(shadow)}
        if argv[0] != "init":
            env["GIT_WORK_TREE"] = str(root)
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        confine = replace(READ_ONLY_CONFINE, paths=(str(shadow),), paths_write=True)
        code, out = self.workspace.capture_bytes(
            ["git", *argv], cwd=root, confine=confine, scan_git=False,
            env=env, stdin=stdin, timeout_s=timeout_s)
        if code != 0:
            raise CheckpointError(f"`git {argv[0]}` failed in {shadow} (exit {code})")
        return out

    def _prepare(self, shadow: Path, root: Path, repo: Repository | None) -> None:
        """The shadow repository, made on first use (0700), borrowing the user's objects and taking
        their info/exclude, so what the user ignores stays out."""
        if not (shadow / "HEAD").exists():
            shadow.mkdir(mode=0o700, parents=True, exist_ok=True)
            # no template: no sample hooks, nothing that could run
            self.git(root, ["init", "--bare", "-q", "--template="])
            with open(shadow / "config", "a") as config:
                config.write(SHADOW_CONFIG)
            (shadow / "info").mkdir(exist_ok=True)
            (shadow / "info" / "attributes").write_text(SHADOW_ATTRIBUTES)
        alternates = shadow / "objects" / "info" / "alternates"
        exclude = ""
        if repo:
            alternates.write_text(f"{repo.common_dir / 'objects'}\n")
            user_exclude = _read_plain(repo.common_dir / "info" / "exclude", READ_FILE_CAP_BYTES)
            exclude = (user_exclude or b"").decode(errors="replace")
        else:
            alternates.unlink(missing_ok=True)
        (shadow / "info" / "exclude").write_text(exclude)

    def _record(self, shadow: Path, root: Path, repo: Repository | None,
                index: Path) -> dict:
        payload = {"git": repo is not None, "head": "", "branch": "", "index": ""}
        if repo:
            payload.update(head=repo.head, branch=repo.branch)
            data = _read_plain(repo.git_dir / "index", INDEX_CAP_BYTES)
            if data is not None:
                payload["index"] = self.keep(data)
                if not (shadow / "index").is_file():
                    # the first checkpoint starts from the user's index (its stat cache)
                    index.write_bytes(data)
                    # git trusts an entry's stat data only when older than its index file: a
                    # file changed in the second the index was written must still be looked at
                    stamp = (repo.git_dir / "index").stat()
                    os.utime(index, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        if (shadow / "index").is_file():
            # The shadow keeps its own index of the tree it last recorded: its stat cache and its
            # cache of trees make the next write-tree redo only the folders that changed.
            shutil.copy2(shadow / "index", index)
        changed, skipped = self._changed(root, index)
        if changed:
            self._stage(root, index, changed)
        payload["tree"] = self.git(root, ["write-tree", "--missing-ok"], index).decode().strip()
        payload["skipped"] = skipped
        os.replace(index, shadow / "index")
        return payload

    def _changed(self, root: Path, index: Path) -> tuple[list[bytes], list[str]]:
        """(paths whose index entry is out of date: changed, deleted, untracked and not ignored;
        untracked files over CHECKPOINT_FILE_CAP_BYTES and FIFOs, sockets or devices, left out).
        One walk of the tree, as `git status` makes; a nested repository ("sub/") is left out."""
        argv = ["ls-files", "-z", "-t", "-m", "-d", "-o", "--exclude-standard"]
        listed = self.git(root, argv, index).split(b"\0")
        changed = {}
        skipped = []
        for line in listed:
            tag = line[:2]
            name = line[2:]
            if not name or name.endswith(b"/"):
                continue
            if _left_out(root / os.fsdecode(name), untracked=tag == b"? "):
                skipped.append(os.fsdecode(name))
                continue
            changed[name] = True
        return list(changed), skipped

    def _stage(self, root: Path, index: Path, changed: list[bytes]) -> None:
        argv = ["update-index", "--add", "--remove", "--replace", "-z", "--stdin"]
        try:
            self.git(root, argv, index, stdin=b"\0".join(changed) + b"\0")
        except CheckpointError:
            # e.g. a file it cannot read: add takes what it can
            self.git(root, ["add", "-A", "--ignore-errors", "--", "."], index)

    def entries(self, root: Path, old: str, new: str) -> dict[str, tuple]:
        """path -> (mode in old, oid in old, mode in new, oid in new, status: A added, D deleted,
        M changed, T type changed) for the paths that differ between two trees."""
        argv = ["diff-tree", "-r", "-z", "--no-renames", old, new]
        fields = self.git(root, argv).decode(errors="surrogateescape").split("\0")
        found = {}
        for head, path in zip(fields[::2], fields[1::2]):
            if not path:
                continue
            old_mode, new_mode, old_oid, new_oid, status = head.lstrip(":").split(" ")
            found[path] = (old_mode, old_oid, new_mode, new_oid, status)
        return found

    def plan(self, root: Path, target: dict, overlay: dict[str, bytes], last: str,
             now: str, since: dict[str, tuple] | None = None) -> list[Restore]:
        """What going back to the checkpoint `target` (with `overlay`, files written by write/edit
        after it) writes and deletes: the paths the agent changed between `target` and `last` (the
        checkpoint after its last step) that differ now; a path that also changed between `last`
        and `now` was changed by someone else since, and is marked; one `target` skipped is kept.
        `since`: {path: (content before, after)} of write/edit from the step on, for the files no
        tree has (ignored by git): marked when they are no longer as write/edit left them."""
        agent = self.entries(root, target["tree"], last)
        user = self.entries(root, last, now)
        restores = []
        for path, (mode, oid, last_mode, last_oid, _) in agent.items():
            if path in overlay or path in target["skipped"]:
                continue
            current = (last_mode, last_oid)
            if path in user:
                current = user[path][2:4]
            if current != (mode, oid):
                restores.append(Restore(path, mode, oid, user_changed=path in user))
        for path, data in overlay.items():
            # a file outside the project write/edit changed (approved) is not rewound, as none is
            if not path.startswith("../") and _read_plain(root / path, READ_FILE_CAP_BYTES) != data:
                # not changed between the checkpoints: "" keeps the file's mode as it is now
                mode = agent.get(path, ("",))[0]
                if mode == ABSENT_MODE:
                    mode = "100644"
                restores.append(Restore(path, mode, data=data, user_changed=path in user))
        known = {*agent, *overlay}
        if since:
            argv = ["ls-tree", "-r", "-z", "--name-only", target["tree"]]
            known.update(self.git(root, argv).decode(errors="surrogateescape").split("\0"))
        for path, (before, after) in (since or {}).items():
            if path in known or path.startswith("../"):
                continue
            data = _read_plain(root / path, READ_FILE_CAP_BYTES)
            if data != before:
                mode = ABSENT_MODE if before is None else ""
                restores.append(Restore(path, mode, data=before, user_changed=data != after))
        return sorted(restores, key=lambda r: r.path)

    def apply(self, root: Path, restores: list[Restore]) -> list[str]:
        """Write back and delete as planned, byte for byte, the executable bit included. Returns
        what could not be restored, each with why."""
        wanted = [r.oid for r in restores if r.data is None and r.mode != ABSENT_MODE]
        blobs = self._blobs(root, wanted)
        problems = []
        deletes = [r for r in restores if r.mode == ABSENT_MODE]
        # a folder a write goes into is never removed and made anew: it keeps its mode (0700)
        used = {str(folder) for r in restores if r.mode != ABSENT_MODE
                for folder in Path(r.path).parents}
        for restore in sorted(deletes, key=lambda r: r.path, reverse=True):
            try:
                self._delete(root, restore.path, used)
            except OSError as exc:
                problems.append(f"{restore.path}: {exc.strerror or exc}")
        for restore in restores:
            if restore.mode in (ABSENT_MODE, GITLINK_MODE):
                continue
            data = restore.data
            if data is None:
                data = blobs[restore.oid]
            try:
                problem = self._write(root, restore.path, restore.mode, data)
            except OSError as exc:
                problem = exc.strerror or str(exc)
            except ToolError as exc:
                # write_file's refusal: a link or a FIFO swapped in meanwhile
                problem = str(exc)
            if problem:
                problems.append(f"{restore.path}: {problem}")
        return problems

    def _blobs(self, root: Path, oids: list[str]) -> dict[str, bytes]:
        """The contents of these blobs, through one `git cat-file --batch`."""
        if not oids:
            return {}
        out = self.git(root, ["cat-file", "--batch"], stdin="\n".join(oids).encode() + b"\n")
        blobs = {}
        at = 0
        for oid in oids:
            end = out.index(b"\n", at)
            header = out[at:end].split(b" ")
            if header[-1] == b"missing":
                raise CheckpointError(f"the checkpoint's copy of blob {oid} is missing")
            size = int(header[2])
            blobs[oid] = out[end + 1:end + 1 + size]
            at = end + 1 + size + 1
        return blobs

    def _delete(self, root: Path, path: str, used: set[str]) -> None:
        """Remove a file a later step created, then the folders that leaves empty but `used`."""
        folder, name = os.path.split(path)
        fd = _judged_folder(root, folder)
        if fd is None:
            return
        with _closing(fd), contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                # a folder where the step made a file: left alone
                return
            os.unlink(name, dir_fd=fd)
        while folder and folder not in used:
            folder, name = os.path.split(folder)
            fd = _judged_folder(root, folder)
            if fd is None:
                return
            with _closing(fd):
                try:
                    os.rmdir(name, dir_fd=fd)
                except OSError:
                    return

    def _write(self, root: Path, path: str, mode: str, data: bytes) -> str:
        folder, name = os.path.split(path)
        # made from descriptors: a link planted on the way must not lead the folders outside
        fd = _judged_folder(root, folder, make=True)
        if fd is None:
            return "its folder now leads outside the project"
        with _closing(fd):
            try:
                kind = stat.S_IFMT(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
            except FileNotFoundError:
                kind = None
            if kind == stat.S_IFDIR:
                return "a folder is in its place now"
            if kind and (kind != stat.S_IFREG or mode == LINK_MODE):
                # a link, FIFO or socket (or a file where a link goes back): never written through
                os.unlink(name, dir_fd=fd)
            if mode == LINK_MODE:
                os.symlink(os.fsdecode(data), name, dir_fd=fd)
                return ""
            self.workspace.write_file(root / path, data, [os.path.realpath(root)], force=True)
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            written = os.open(name, flags, dir_fd=fd)
        with _closing(written):
            permissions = os.fstat(written).st_mode & 0o7777
            if mode == "100755":
                # x wherever r is, as git checks out an executable
                permissions |= (permissions & 0o444) >> 2
            elif mode:
                permissions &= ~0o111
            os.fchmod(written, permissions)
        return ""

    def restore_head(self, repo: Repository, recorded: dict) -> None:
        """HEAD, its branch and the index as a checkpoint recorded them, only in the repository
        the session found first: a step that made .git a "gitdir: elsewhere" file would have the
        ref updates and the index written into another repository, or outside the project."""
        now = self.repository() or repo
        first = self.first or now
        for found in (repo, now):
            if (found.git_dir, found.common_dir) != (first.git_dir, first.common_dir):
                raise CheckpointError(f"HEAD and the index not put back: the repository is now "
                                      f"{found.git_dir}, not {first.git_dir}")
        branch = recorded["branch"]
        head = recorded["head"]
        moved = (branch, head) != (now.branch, now.head)
        if moved and branch and head:
            self._user_git(repo, ["update-ref", f"refs/heads/{branch}", head])
        if branch and branch != now.branch:
            self._user_git(repo, ["symbolic-ref", "HEAD", f"refs/heads/{branch}"])
        elif not branch and head and head != now.head:
            self._user_git(repo, ["update-ref", "--no-deref", "HEAD", head])
        if not recorded["index"]:
            return
        data = self.load(recorded["index"])
        if _read_plain(repo.git_dir / "index", INDEX_CAP_BYTES) != data:
            self.workspace.write_file(repo.git_dir / "index", data,
                                      [os.path.realpath(repo.git_dir)])

    def _user_git(self, repo: Repository, args: list[str]) -> None:
        """git in the user's repository; no hook of theirs runs (reference-transaction would): the
        call is khaelor's, not theirs."""
        argv = ["git", "-C", str(repo.root), "-c", "core.hooksPath=/dev/null", *args]
        code, _ = self.workspace.capture(argv, cwd=repo.root, confine=DEFAULT_CONFINE,
                                         scan_git=False)
        if code != 0:
            raise CheckpointError(f"`git {' '.join(args[:2])}` failed (exit {code})")


def _read_head(git_dir: Path, common_dir: Path) -> tuple[str, str]:
    """(the commit HEAD names, read from the files refs live in (loose, else packed-refs), ""
    when that does not tell (no commit yet, another ref store: git is asked then); its branch,
    "" when detached)."""
    ref = _read_ref(git_dir / "HEAD").removeprefix("ref: ")
    head = ref
    branch = ""
    if ref.startswith("refs/heads/"):
        branch = ref.removeprefix("refs/heads/")
        head = _read_ref(common_dir / ref)
        if not head:
            packed = _read_ref(common_dir / "packed-refs", READ_FILE_CAP_BYTES)
            found = re.search(rf"^([0-9a-f]+) {re.escape(ref)}$", packed, re.M)
            head = found.group(1) if found else ""
    if not OID.fullmatch(head):
        head = ""
    return head, branch


def _read_ref(path: Path, cap: int = REF_CAP_BYTES) -> str:
    """A file of git's (HEAD, a loose ref, a gitdir or commondir pointer, packed-refs) as stripped
    text; "" unless it is a regular file of at most `cap` bytes."""
    return (_read_plain(path, cap) or b"").decode(errors="replace").strip()


def _read_plain(path: Path | str, cap: int, folder_fd: int = sandbox.AT_FDCWD) -> bytes | None:
    """The bytes of a file a step could have replaced (the repository's HEAD, refs, index and
    info/exclude; a file a rewind compares; a guarded file, `path` then a name in `folder_fd`),
    None unless it is a regular file of at most `cap` bytes: khaelor reads it outside the
    sandbox, so a link there is not followed (to a key that a checkpoint would copy and a rewind
    write back), a FIFO not waited on, /dev/zero not read."""
    try:
        if folder_fd == sandbox.AT_FDCWD:
            path = os.path.join(os.path.realpath(path.parent), path.name)
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
        fd = sandbox.open_no_links(path, flags, dir_fd=folder_fd)
    except (OSError, ValueError):
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = _read_at_most(handle, cap + 1)
    return data if len(data) <= cap else None


# What git opens (blocking) before anything else: in the work tree, in the git directory, and in
# the directory a linked worktree shares. A FIFO or a device planted as one of them would hold
# every git run khaelor starts (status, checkpoints, the start-up baseline) until its time-out.
GIT_TREE_OPENS = (".gitignore", ".gitattributes", ".git")
GIT_DIR_OPENS = ("HEAD", "commondir", "config.worktree", "index")
GIT_COMMON_OPENS = ("config", "packed-refs", "shallow", "info/exclude", "info/attributes",
                    "info/grafts", "objects/info/alternates")


def _git_stall(cwd: Path, own_repository: bool = False) -> str:
    """The file among those git opens first that would make it wait (a FIFO or a device, or a
    link to one), else "". own_repository: git runs on khaelor's shadow, not the one in cwd."""
    top = next((d for d in (cwd, *cwd.parents) if os.path.lexists(d / ".git")), cwd)
    suspects = [top / name for name in GIT_TREE_OPENS]
    if not own_repository:
        git_dir = top / ".git"
        if git_dir.is_file():
            # a linked worktree or a submodule: "gitdir: <path>"
            git_dir = top / _read_ref(git_dir).removeprefix("gitdir: ")
        common = git_dir / (_read_ref(git_dir / "commondir") or ".")
        ref = _read_ref(git_dir / "HEAD").removeprefix("ref: ")
        suspects += [git_dir / name for name in GIT_DIR_OPENS]
        suspects += [common / name for name in GIT_COMMON_OPENS]
        if ref.startswith("refs/") and ".." not in ref:
            suspects.append(common / ref)
    return next((str(path) for path in suspects if _waits(path)), "")


def _waits(path: Path) -> bool:
    """Opening it blocks or never ends: a FIFO or a device (through links)."""
    with contextlib.suppress(OSError, ValueError):
        mode = os.stat(path).st_mode
        return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
    return False


def _left_out(path: Path, untracked: bool) -> bool:
    """A FIFO, socket or device (git cannot record one, and one would fail the whole checkpoint: a
    step could plant one so that no later step has a checkpoint), or an untracked file over
    CHECKPOINT_FILE_CAP_BYTES."""
    with contextlib.suppress(OSError):
        found = os.lstat(path)
        mode = found.st_mode
        special = not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode))
        return special or (untracked and found.st_size > CHECKPOINT_FILE_CAP_BYTES)
    return False


def _judged_folder(root: Path, folder: str, make: bool = False) -> int | None:
    """A descriptor for the project's `folder` (made, with its parents, if `make`), None when its
    real path leads outside the project or it is gone: opened without following a link, so one a
    running process swaps in after the check is not gone through (to delete or write elsewhere)."""
    real = os.path.realpath(root / folder)
    if not sandbox.within(real, [os.path.realpath(root)]):
        return None
    with contextlib.suppress(OSError):
        if make:
            return _open_folder(real)
        return sandbox.open_no_links(real, sandbox.O_PATH | os.O_DIRECTORY)
    return None


# ---------------------------------------------------------------- input checking


def _checked(name: str, tool_input) -> tuple[dict | None, ToolResult | None]:
    """(clean arguments, None), or (None, the failure: no such tool, or a bad input)."""
    schema = SCHEMA_OF.get(name)
    if schema is None:
        text = f"Unknown tool {_quoted(name)}. The tools are: {', '.join(TOOLS)}."
        return None, ToolResult(text, True, {"error": "unknown_tool"})
    args, problem = _check_input(schema, tool_input)
    return args, problem and ToolResult(problem, True, {"error": "invalid_input"})


def _check_input(schema: dict, tool_input) -> tuple[dict | None, str | None]:
    """(clean arguments, None), or (None, a message telling the model how to repair the call).
    A null optional counts as absent; JSON 5.0 is a fine integer, true is not."""
    props = schema["input_schema"]["properties"]
    required = schema["input_schema"]["required"]
    args = {}
    problems = []
    if not isinstance(tool_input, dict):
        problems.append(f"the input must be a JSON object, got {_type_name(tool_input)}")
        tool_input = {}
    for key, value in tool_input.items():
        prop = props.get(key, {})
        kind = prop.get("type")
        if kind == "integer" and isinstance(value, float) and value.is_integer():
            value = int(value)
        allowed = prop.get("enum", [value])
        if kind is None:
            problems.append(_unknown_parameter(key, props))
        elif value is None:
            continue
        elif _type_name(value) != kind:
            problems.append(f"'{key}' must be {kind}, got {_type_name(value)}")
        elif value not in allowed:
            problems.append(f"'{key}' must be one of {', '.join(allowed)}, got {_quoted(value)}")
        elif "minimum" in prop and value < prop["minimum"]:
            problems.append(f"'{key}' must be at least {prop['minimum']}, got {value}")
        elif isinstance(value, str) and _unwritable(key, value):
            problems.append(_unwritable(key, value))
        else:
            args[key] = value
    # A required key already reported (wrong type, bad value) is not also "missing".
    problems += [f"missing required parameter '{key}'" for key in required
                 if key not in args and not any(f"'{key}'" in problem for problem in problems)]
    if not problems:
        return args, None
    name = schema["name"]
    return None, (f"Invalid input for {name}: {'; '.join(problems)}.\n"
                  f"Expected {name}({_signature(props, required)}). "
                  f"Call {name} again with corrected input.")


def _unwritable(key: str, value: str) -> str | None:
    """A NUL that JSON carried where no path, pattern or command can hold one (a file's content
    or a process's input may), or None."""
    if "\0" in value and key not in ("content", "input"):
        return f"'{key}' holds a NUL character (\\u0000), which no path or command can hold"
    return None


def _unknown_parameter(key: str, props: dict) -> str:
    import difflib
    near = difflib.get_close_matches(key, list(props), n=1, cutoff=0.4)
    if near:
        return f"unknown parameter {_quoted(key)} (did you mean '{near[0]}'?)"
    return f"unknown parameter {_quoted(key)}"


def _quoted(text: str) -> str:
    """A model's string quoted in a message, cut short: a huge one echoed would fill the result."""
    cut = f"… ({len(text):,} characters)" if len(text) > QUOTE_CHARS else ""
    return repr(text[:QUOTE_CHARS]) + cut


def _signature(props: dict, required: list[str]) -> str:
    """A tool's parameters as `name: type`, with `?` after the optional ones."""
    return ", ".join(f"{key}{'' if key in required else '?'}: {prop['type']}"
                     for key, prop in props.items())


JSON_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string",
                   list: "array", dict: "object", type(None): "null"}


def _type_name(value) -> str:
    return JSON_TYPE_NAMES.get(type(value), type(value).__name__)

# ---------------------------------------------------------------- output budgets, spills, secrets


class _Spool:
    """One result's text. Under the budget it is kept whole; past it, everything goes to a spill
    file the model can read or grep, and only a head and a tail stay in memory."""

    def __init__(self, spill_dir: Path, name: str):
        self.spill_dir = spill_dir
        self.name = name
        self.head_cap = int(OUTPUT_BUDGET_CHARS * OUTPUT_HEAD_SHARE)
        # Room for the omission marker.
        self.tail_cap = OUTPUT_BUDGET_CHARS - self.head_cap - 500
        self.parts: list[str] = []
        self.head = ""
        self.tail = ""
        self.total = 0
        self.newlines = 0
        self.spilled = 0
        self.spill_path: Path | None = None
        # The open spill file; False when it could not be made.
        self.handle = None

    def add(self, text: str) -> None:
        self.total += len(text)
        self.newlines += text.count("\n")
        if self.handle is None:
            self.parts.append(text)
            if self.total <= OUTPUT_BUDGET_CHARS:
                return
            text = "".join(self.parts)
            self.parts = []
            self.head = text[:self.head_cap]
            self.open_spill_file()
        self.tail = (self.tail + text)[-self.tail_cap:]
        if self.handle and self.spilled < SPILL_FILE_CAP_BYTES:
            room = SPILL_FILE_CAP_BYTES - self.spilled
            self.spilled += self.handle.write(text[:room])
            if self.spilled >= SPILL_FILE_CAP_BYTES:
                self.handle.write("\n[spill file capped here; later output was not kept]\n")

    def open_spill_file(self) -> None:
        try:
            self.spill_dir.mkdir(parents=True, exist_ok=True)
            _prune_spill(self.spill_dir)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.name)[:60] or "output"
            prefix = f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-"
            fd, path = tempfile.mkstemp(dir=self.spill_dir, suffix=".txt", prefix=prefix)
            self.spill_path = Path(path)
            self.handle = os.fdopen(fd, "w", encoding="utf-8", errors="replace")
        except OSError:
            self.spill_path = None
            self.handle = False

    def finish(self, meta: dict) -> str:
        """The model-facing text: all of it, or head + omission marker + tail, cut at line ends. The
        spill file's path goes in meta["spill"]."""
        if self.handle is None:
            return "".join(self.parts)
        if self.handle:
            self.handle.close()
            meta["spill"] = str(self.spill_path)
        head = self.head
        cut = head.rfind("\n")
        if cut > len(head) // 2:
            head = head[:cut + 1]
        tail = self.tail
        cut = tail.find("\n")
        if 0 <= cut < len(tail) // 2:
            tail = tail[cut + 1:]
        n_omitted = self.total - len(head) - len(tail)
        n_lines = max(0, self.newlines - head.count("\n") - tail.count("\n"))
        where = "full output could not be saved"
        if self.spill_path:
            where = (f"full output ({self.total:,} characters) saved to {self.spill_path}; "
                     "read it with offset/limit or grep it")
            if self.total > LINE_CHAR_CAP * (self.newlines + 1):
                # read cuts each line at LINE_CHAR_CAP: minified JSON would show one cut line
                where += (f" (its lines are longer than the {LINE_CHAR_CAP:,} characters read "
                          "shows of each: see parts with `grep -o '.\\{0,200\\}WORD.\\{0,200\\}'` "
                          "or `cut -c`)")
        lines = events.counted(n_lines, "line")
        marker = f"[… {n_omitted:,} characters ({lines}) omitted; {where} …]"
        return f"{head}\n{marker}\n{tail}"


def _open_live_output(path: Path) -> int | None:
    """A descriptor to append a running command's output to (Toolbox.live_output_path), or None
    when the spill folder cannot take it: the command runs all the same."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    except OSError:
        return None


def _prune_spill(spill_dir: Path) -> None:
    """Keep the spill folders of all projects under their cap (room left for one more file), the
    oldest going first, with the files left beside them by versions before per-project folders."""
    files = []
    for entry in os.scandir(spill_dir.parent):
        inside = os.scandir(entry) if entry.is_dir(follow_symlinks=False) else [entry]
        files += [(found.stat().st_mtime, found.stat().st_size, found.path)
                  for found in inside if found.is_file(follow_symlinks=False)]
    files.sort()
    total = sum(size for _, size, _ in files)
    for _, size, path in files:
        if total <= SPILL_DIR_CAP_BYTES - SPILL_FILE_CAP_BYTES:
            break
        Path(path).unlink(missing_ok=True)
        total -= size


def mask_credentials(text: str) -> str:
    """A URL's password, an authorization header's credential and tokens of known formats masked:
    in every tool output (Toolbox.mask) and the copy of .git/config a --yes line reads."""
    if "@" in text:
        text = URL_PASSWORD.sub(r"\1" + URL_PASSWORD_MASK, text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = AUTH_HEADER.sub(r"\1" + AUTH_HEADER_MASK, text)
    return TOKEN.sub(TOKEN_MASK, text)


def _mask_secret_diffs(text: str) -> str:
    """The values in each diff of a file named as a secret (`diff --git a/.env b/.env`, ... --cc,
    --no-prefix: a word of its first line names it), up to the next diff or commit."""
    parts = DIFF_PART_START.split(text)
    for n, part in enumerate(parts):
        first = part.partition("\n")[0]
        if "diff --" not in first:
            continue
        # (a read tool's line number, colors)
        first = re.sub(r"\x1b\[[0-9;]*m", "", first).lstrip(" 0123456789\t")
        # Either name: a .env renamed to .env.example shows the values it held as removed lines
        names = [word.strip('"') for word in first.split()[2:]]
        if first.startswith("diff --") and any(map(sandbox.is_secret_name, names)):
            parts[n] = SECRET_DIFF_SETTING.sub(rf"\1{SECRET_DIFF_MASK}", part)
    return "".join(parts)


def _refuse_masks(new_text: str, before: bytes | None, shown: str) -> None:
    """A write or edit must not put a mask where the secret it hid was: a model that read a
    masked .env and wrote it back would replace every value with the mask. A file that holds
    the mask's text itself (khaelor's own source) may still be edited."""
    for mask in (SECRET_MASK, DOTENV_MASK, URL_PASSWORD_MASK, TOKEN_MASK, PRIVATE_KEY_MASK,
                 SECRET_DIFF_MASK, AUTH_HEADER_MASK):
        in_file = before is not None and mask.encode() in before
        if mask in new_text and not in_file:
            raise ToolError(
                f"Not written: the new text for {shown} holds {mask!r}, which stands for a "
                "secret khaelor hid from you; writing it would replace the real value. "
                "Leave the lines that hold secrets as they are and edit the others "
                "(the edit tool changes only what old_string names).",
                error="masked_secret")


# A .env file larger than this is not read for values to mask.
DOTENV_CAP_BYTES = 10_000_000


class _DotEnv:
    """The values in the project's .env files (.env, .env.*, *.env, but not the templates:
    .env.example and the like), KEY=value lines with quotes stripped; a file is read again only
    when it changed (mtime, size). The root's files are looked at before every call; every
    folder's (found as secret files are: SecretScan lists a folder again only when it changed)
    before a call that may read them: one approved to, or an approved command, which reads the
    project's secret files unless --yes approved it. A value once known stays masked: a file
    gone, or a folder unreadable for a while (a step's `chmod 000 .`), takes none out."""

    def __init__(self, root: Path):
        self.root = root
        self.scan = sandbox.SecretScan(DEPENDENCY_FOLDERS)
        # (one refresh at a time: it runs in a thread, and the scan keeps its listings)
        self.lock = threading.Lock()
        self.stamps: dict[str, tuple[int, int]] = {}
        self.known: set[str] = set()
        # Longest first, so a value inside another is not masked half.
        self.values: list[str] = []

    def refresh(self, everywhere: bool = False) -> None:
        with self.lock:
            if everywhere:
                paths = self.scan.find(str(self.root), sandbox.ENV_FILES)
            else:
                matches = sandbox.secret_matcher(sandbox.ENV_FILES)
                paths = []
                with contextlib.suppress(OSError):
                    paths = [entry.path for entry in os.scandir(self.root) if matches(entry.name)]
            for path in paths:
                with contextlib.suppress(OSError):
                    found = os.stat(path)
                    stamp = (found.st_mtime_ns, found.st_size)
                    if stat.S_ISREG(found.st_mode) and self.stamps.get(path) != stamp:
                        self.stamps[path] = stamp
                        self._read(path)

    def _read(self, path: str) -> None:
        # (a FIFO or a sparse giant is not read)
        data = _read_plain(Path(os.path.realpath(path)), DOTENV_CAP_BYTES)
        for line in (data or b"").decode(errors="replace").splitlines():
            value = _dotenv_value(line)
            if len(value) >= DOTENV_VALUE_MIN_CHARS:
                self.known.add(value)
        self.values = sorted(self.known, key=len, reverse=True)


def _dotenv_value(line: str) -> str:
    """The value of a KEY=value line, quotes stripped; "" for a comment or another line."""
    match = DOTENV_LINE.match(line)
    if not match:
        return ""
    value = match.group(1)
    quoted = DOTENV_QUOTED.fullmatch(value)
    if quoted:
        return quoted.group(2)
    if " #" in value:
        # An unquoted value ends where a comment starts.
        return value.split(" #", 1)[0].rstrip()
    return value


def _one_line(name: str) -> str:
    """A path as one line of a listing: a byte that is not UTF-8 (os's surrogate for it) as \\xHH,
    which the tools take back (_fs_path); JSON-quoted with a control character or an end space."""
    name = re.sub("[\udc80-\udcff]", lambda found: f"\\x{ord(found[0]) - 0xDC00:x}", name)
    if name != name.strip() or any(ord(c) < 32 or c == "\x7f" for c in name):
        return json.dumps(name, ensure_ascii=False)
    return name

# ---------------------------------------------------------------- process groups to their end


def _end_children() -> None:
    """Kill and reap khaelor's children, and theirs as they are handed to it (a child subreaper),
    until none is left: one forking meanwhile hands its child on to the next round."""
    me = b"%d" % os.getpid()
    for _ in range(100):
        children = [int(entry.name) for entry in os.scandir("/proc")
                    if entry.name.isdigit() and sandbox.proc_stat(int(entry.name))[1:2] == [me]]
        if not children:
            return
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _kill_groups(pgids: set[int]) -> None:
    """Kill every group still alive; also the last resort at interpreter exit (weakref.finalize)."""
    for pgid in list(pgids):
        _kill_group(pgid)
    pgids.clear()


def started_ticks(pid: int) -> int | None:
    """When a process leading its own group started, in clock ticks since boot (/proc/PID/stat):
    with its pid it names one process for good, since a pid is used again, never with the same
    start. None: not running, or not a group leader."""
    fields = sandbox.proc_stat(pid)
    leads = len(fields) > 19 and fields[2] == b"%d" % pid and fields[0] != b"Z"
    return int(fields[19]) if leads else None


def stop_orphans(processes: list[tuple]) -> set[int]:
    """Stop the groups of the background processes, (pid, started_ticks) each, that a killed
    khaelor left running: SIGTERM, then SIGKILL after ORPHAN_GRACE_S. Only a pid that is still
    the process started at those ticks, or a group its leader left; the pids stopped."""
    ours = set()
    for pid, ticks in processes:
        if not isinstance(pid, int) or not isinstance(ticks, int):
            continue
        if started_ticks(pid) == ticks or _left_by_its_leader(pid, ticks):
            ours.add(pid)
    for pid in ours:
        _kill_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while any(map(_group_alive, ours)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in ours:
        _kill_group(pid, signal.SIGKILL)
    return ours


def _left_by_its_leader(pgid: int, ticks: int) -> bool:
    """Whether the group's leader is gone (or a zombie) and members that started after it remain:
    the children a shell left running (`server &`). Linux gives a pid out again only once no
    group bears its number, so they are the leader's, unless the group ended, its pid went to a
    new leader and that one left children too: a chance taken."""
    leader = sandbox.proc_stat(pgid)
    if leader and leader[0] != b"Z":
        return False
    for member in sandbox.pids_in_groups({pgid}):
        fields = sandbox.proc_stat(member)
        if len(fields) > 19 and int(fields[19]) >= ticks:
            return True
    return False


def _group_alive(pgid: int) -> bool:
    """Whether any live process remains in the group. killpg also reaches zombies that a
    non-reaping init (containers) leaves behind, so /proc settles it where there is one."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return not os.path.isdir("/proc") or bool(sandbox.pids_in_groups({pgid}))


async def _pump(stream: asyncio.StreamReader, on_text: Callable[[str], None],
                mask: Callable[[str], str]) -> None:
    """Read a pipe to EOF, handing on plain text: secrets masked, terminal escapes dropped,
    carriage-return redraws (progress bars) reduced to their last state. It works on whole lines, so
    nothing split across two reads is cut in half; a line past 64K characters goes as it stands."""
    def clean(text: str) -> str:
        # a NUL (binary output) is no text: shown as U+FFFD, as bytes that are not UTF-8 are
        return mask(events.without_escapes(text)).replace("\0", "\ufffd")

    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    carry = ""
    try:
        while chunk := await stream.read(65_536):
            text = carry + decoder.decode(chunk)
            cut = text.rfind("\n") + 1
            if not cut and len(text) >= 65_536:
                cut = len(text)
            carry = text[cut:]
            text = clean(text[:cut])
            if text:
                on_text(text)
    finally:
        text = clean(carry + decoder.decode(b"", final=True))
        if text:
            on_text(text)


async def _supervise(box: Toolbox, child: Child, confine: Confine, command: str,
                     on_text: Callable[[str], None], timeout_s: float | None,
                     grace_s: float) -> tuple[bool, bool]:
    """Pump a child's output to on_text, masked, until it exits, then clear out its process group
    (which _start put in box.groups): (timed out, left strays). On timeout or cancellation the whole
    group is killed, grandchildren included; after a normal exit what it left running gets grace_s
    to finish. A descendant that left our group may hold the pipe open, so the pump is not waited on
    for ever. _watch_temp stops a read-only command (on_text is told why); after an approved one,
    on_text gets guard_check's note, also when it was cancelled."""
    pump = asyncio.create_task(_pump(child.stdout, on_text, box.mask))
    watchdog = None
    if not confine.write:
        watchdog = asyncio.create_task(_watch_temp(box.workspace.session_temp(), child.pid))
    timed_out = False
    stray = False
    try:
        try:
            async with asyncio.timeout(timeout_s):
                await child.proc.wait()
        except TimeoutError:
            timed_out = True
        else:
            # _group_alive reads /proc: off the loop
            if await asyncio.to_thread(_group_alive, child.pid):
                await asyncio.wait({pump}, timeout=grace_s)
            stray = await asyncio.to_thread(_group_alive, child.pid)
        _kill_group(child.pid)
        await asyncio.wait({pump}, timeout=1.0)
        await child.proc.wait()
        if watchdog and watchdog.done():
            on_text(f"\nStopped: the session temp dir passed {sandbox.TEMP_DIR_CAP >> 20} MiB, "
                    "the most a command that runs without asking may write.\n")
        return timed_out, stray
    finally:
        pump.cancel()
        if watchdog:
            watchdog.cancel()
        _kill_group(child.pid)
        box.groups.discard(child.pid)
        child.close_pipes()
        if child.guarded is not None:
            # Off the loop (it lists the project's repositories), and to its end even if this step
            # is cancelled meanwhile: the thread runs on.
            checked = asyncio.to_thread(_guard_after, box, child, command, confine)
            note = await asyncio.shield(checked)
            if note:
                on_text(f"\n{note}\n")


def _guard_after(box: Toolbox, child: Child, command: str, confine: Confine) -> str | None:
    """The guard's check after an approved command: what it changed put back (guard_check)."""
    links = (*child.gitlinks, *gitlinks(box.workspace))
    return guard_check(box.workspace.cwd, box.spill_dir, child.guarded, command, confine,
                       tuple(dict.fromkeys(links)))

# ---------------------------------------------------------------- read and file helpers


async def _tool_read(box: Toolbox, args: dict, tool_use_id: str, confine: Confine) -> ToolResult:
    # Off the event loop: an 11 MB file takes 60 ms to read, decode and split.
    return await asyncio.to_thread(read_now, box, args, True)


def read_now(box: Toolbox, args: dict, elsewhere: bool = False) -> ToolResult:
    """read, at once (it never waits): the tool, and an @mention attached to a message. Raises
    ToolError as the tool does. A directory's entries are numbered and paged as a file's lines.
    `elsewhere` (off the loop only): a missing file's name is looked for in the whole project."""
    ws = box.workspace
    path = _existing(ws, args["file_path"], directory=False, elsewhere=elsewhere)
    shown = _one_line(ws.display(path))
    fd = ws.open_judged(path, box.places, os.O_RDONLY)
    heading = ""
    noun = "line"
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        lines = _listing(fd)
        shown += "/"
        heading = f"{shown} is a directory:\n"
        noun = "item"
    else:
        with os.fdopen(fd, "rb") as handle:
            data = _read_regular(handle, shown)
        kind = _binary_kind(data[:8192], path.name)
        if kind:
            raise ToolError(
                f"{shown} is a binary file ({kind}, {len(data):,} bytes); read shows text files "
                "only.", error="binary")
        box.remember(path)
        lines = _split_lines(_decode_text(data))
    offset = args.get("offset", 1)
    limit = args.get("limit")
    total = len(lines)
    if total == 0:
        return ToolResult(f"{shown} is empty (0 {noun}s).", meta={"path": shown, "lines": 0})
    if offset > total:
        raise ToolError(
            f"offset {offset} is past the end of {shown}, which has "
            f"{events.counted(total, noun)}.",
            error="offset")
    body, last = _numbered_page(lines, offset, limit or READ_LINE_CAP)
    text = heading + "\n".join(body)
    if last < total:
        text += (f"\n\n(Showing {noun}s {offset}–{last} of {total}. "
                 f"Use offset={last + 1} to continue.)")
    elif offset > 1:
        text += f"\n\n(Showing {noun}s {offset}–{last} of {total}; end of file.)"
    meta = {"path": shown, "lines": total, "start": offset, "end": last}
    # masked here too: an @mention's attachment does not pass through Toolbox.run
    return ToolResult(box.mask(text), meta=meta)


def _listing(folder_fd: int) -> list[str]:
    """A directory's entries for read (its descriptor, closed here): subdirectories first."""
    with _closing(folder_fd):
        entries = sorted(os.scandir(folder_fd), key=lambda entry: (not entry.is_dir(), entry.name))
    return [_one_line(entry.name + ("/" if entry.is_dir() else "")) for entry in entries]


def _read_regular(handle, shown: str) -> bytes:
    """The bytes of an open file if it is a regular one (a FIFO or a device could block or never
    end), up to READ_FILE_CAP_BYTES: more, even from a file still growing, is too large."""
    found = os.fstat(handle.fileno())
    if not stat.S_ISREG(found.st_mode):
        raise _not_regular(shown, found.st_mode)
    size = found.st_size
    if size <= READ_FILE_CAP_BYTES:
        data = _read_at_most(handle, READ_FILE_CAP_BYTES + 1)
        size = len(data)
    if size > READ_FILE_CAP_BYTES:
        raise ToolError(
            f"{shown} is {size:,} bytes, too large to read whole; use bash with head, "
            "tail, sed -n 'FROM,TOp' or grep on it.",
            error="too_large")
    return data


def _realpath(path: Path) -> str:
    """os.path.realpath, whose readlink fails (EINVAL) when a link it met stops being one as it
    walks: a process swapping it, reported as the race it is."""
    try:
        return os.path.realpath(path)
    except OSError:
        raise _raced(str(path)) from None


def _raced(shown: str) -> ToolError:
    return ToolError(
        f"{_one_line(shown)} was not opened: a folder or file on its path became a symbolic link "
        "after it was checked (a running process may be changing it), and khaelor does not follow "
        "such a link. Look at it with ls -l, then retry.",
        error="raced")


def _read_at_most(handle, n_bytes: int) -> bytes:
    """Up to n_bytes, even of a file that grows as it is read, in chunks: read(n) would allocate all
    n_bytes first (50 MB, for every file the Python grep reads)."""
    chunks = []
    while n_bytes > 0:
        chunk = handle.read(min(n_bytes, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        n_bytes -= len(chunk)
    return b"".join(chunks)


def _not_regular(shown: str, mode: int) -> ToolError:
    kinds = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
             stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}
    kind = kinds.get(stat.S_IFMT(mode), "a special file")
    return ToolError(
        f"{shown} is {kind}, not a regular file, so it was not read "
        "(reading it could block or never end).",
        error="not_a_file")


def _open_folder(folder: str) -> int:
    """A descriptor for the real folder `folder` (as sandbox.open_no_links opens), made with its
    missing parents first, each from its parent's descriptor: where write_file renames."""
    try:
        return sandbox.open_no_links(folder, sandbox.O_PATH | os.O_DIRECTORY)
    except FileNotFoundError:
        parent_fd = _open_folder(os.path.dirname(folder))
    with _closing(parent_fd):
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.basename(folder), dir_fd=parent_fd)
        flags = sandbox.O_PATH | os.O_DIRECTORY
        return sandbox.open_no_links(os.path.basename(folder), flags, dir_fd=parent_fd)


def _binary_kind(head: bytes, name: str) -> str | None:
    """What a file is if its head says binary: a magic number, a NUL, or many control bytes (8-bit
    text and a colored log's escapes pass). None: text."""
    kind = next((what for magic, what in MAGIC if head.startswith(magic)), None)
    n_control = sum(1 for byte in head if byte < 9 or 13 < byte < 32 and byte != 0x1B)
    looks_binary = b"\0" in head or n_control > len(head) // 10
    if head[:2] in UTF16 or (kind is None and not looks_binary):
        return None
    import mimetypes
    return kind or mimetypes.guess_type(name)[0] or "binary data"


def _numbered_page(lines: list[str], offset: int, n_wanted: int) -> tuple[list[str], int]:
    """Up to n_wanted numbered lines from `offset` (1-based), stopping at READ_BYTE_CAP characters
    (at least one line): (the numbered lines, the last line number shown)."""
    body = []
    n_chars = 0
    end = min(len(lines), offset - 1 + n_wanted)
    for index in range(offset - 1, end):
        numbered = _numbered([lines[index]], index + 1)
        if body and n_chars + len(numbered) > READ_BYTE_CAP:
            break
        body.append(numbered)
        n_chars += len(numbered) + 1
    return body, offset - 1 + len(body)


def _numbered(lines: list[str], first: int) -> str:
    """cat -n style: right-aligned line number, a tab, the line (a long one cut with a marker)."""
    numbered = []
    for number, line in enumerate(lines, first):
        text = f"{number:>6}\t{line[:LINE_CHAR_CAP]}"
        if len(line) > LINE_CHAR_CAP:
            text += f"… [line cut: {len(line):,} characters]"
        numbered.append(text)
    return "\n".join(numbered)


def _split_lines(text: str) -> list[str]:
    """Lines without their endings ("\\r\\n" or "\\n"); a final newline starts no other line."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _decode_text(data: bytes) -> str:
    """A file's text without its byte-order mark (UTF-8, or UTF-16 with one)."""
    return data.decode(UTF16.get(data[:2], "utf-8"), "replace").removeprefix("\ufeff")


def _uses_crlf(text: str) -> bool:
    crlf = text.count("\r\n")
    return crlf > 0 and crlf >= text.count("\n") - crlf


def _signal_name(number: int) -> str:
    """SIGKILL, or SIGRTMIN+3 for a real-time signal (signal.Signals has no member for those)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
            return f"SIGRTMIN+{number - signal.SIGRTMIN}"
        return f"signal {number}"


def _stamp(path: Path) -> tuple[int, int] | None:
    with contextlib.suppress(OSError):
        found = path.stat()
        return found.st_mtime_ns, found.st_size
    return None


def _missing(ws: Workspace, path: Path, elsewhere: bool = False) -> ToolError:
    """A missing path, with up to three existing ones the model probably meant; `elsewhere`: also
    the same name in the project's other folders (it lists them: not on the event loop)."""
    shown = _one_line(ws.display(path))
    if os.path.islink(path):
        return ToolError(
            f"{shown} is a symbolic link to nothing: its target is missing or "
            "the link loops back on itself.",
            error="broken_link")
    near = []
    # "/src/app.py" meant the project's.
    in_project = ws.cwd / str(path).lstrip("/")
    if path.is_absolute() and in_project.exists():
        near.append(ws.display(in_project))
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    names = []
    with contextlib.suppress(OSError):
        names = os.listdir(parent)
    import difflib
    # compared without case: "readme.md" meant README.md
    by_lower = {name.lower(): name for name in names}
    for lower in difflib.get_close_matches(path.name.lower(), list(by_lower), n=3, cutoff=0.5):
        near.append(_one_line(ws.display(parent / by_lower[lower])))
    if elsewhere and not near and sandbox.within(str(path), [str(ws.cwd)]):
        # the same name in another folder: "app.py" or "scr/app.py" meant src/app.py
        wanted = path.name.lower()
        with contextlib.suppress(OSError, ToolError):
            near += [_one_line(rel) for rel in project_files(ws, limit=PROJECT_FILES_LIMIT)
                     if posixpath.basename(rel).lower() == wanted]
    near = list(dict.fromkeys(near))[:3]
    hint = " Use glob to find files by name."
    if near:
        hint = f" Did you mean: {', '.join(near)}?"
    return ToolError(f"{shown} does not exist.{hint}", error="not_found")


def _fs_path(path: str) -> str:
    """A model's path, each \\xHH of a byte that is not UTF-8 (as _one_line shows it; the log keeps
    no lone surrogate) back as that byte. A name that truly holds such a backslash is for bash."""
    return re.sub(r"\\x([89a-f][0-9a-f])", lambda hh: chr(0xDC00 + int(hh[1], 16)), path)


def _existing(ws: Workspace, value: str | None, directory: bool = True,
              elsewhere: bool = False) -> Path:
    """The path a model gave (default the project root): it must exist, and be a folder if asked."""
    path = ws.resolve(value) if value else ws.cwd
    if not path.exists():
        raise _missing(ws, path, elsewhere)
    if directory and not path.is_dir():
        raise ToolError(f"{ws.display(path)} is a file, not a directory.", error="not_a_directory")
    return path

# ---------------------------------------------------------------- edit: the replacer cascade
# OpenCode's nine strategies (from the Cline / gemini-cli lineage), tried in order. Each returns the
# spans of the file text it matches. Single mode: the first strategy with exactly one span wins; an
# ambiguous strategy makes the edit fail with the candidates' line numbers, unless a later, stricter
# strategy (indentation-flexible, trimmed-boundary) narrows it to one of them. With replace_all the
# text-preserving strategies run and multi-occurrence gathers every whitespace variant at once.


# (start, end) offsets of a match in the file text.
Span = tuple[int, int]
# Whether a block of the file's lines is the block old_string wants: (got, want) -> bool.
LinesCheck = Callable[[list[str], list[str]], bool]


def _find_lines(old: str) -> list[str]:
    """old_string's lines, as _split_lines gives a file's; at least one."""
    return _split_lines(old) or [""]


def _unescape(text: str) -> str:
    return re.sub(r"\\([ntr'\"`\\$\n])", lambda m: ESCAPES[m.group(1)], text)


def _indent(lines: list[str]) -> str:
    """The leading whitespace every non-blank line shares."""
    heads = [_leading_space(line) for line in lines if line.strip()]
    return os.path.commonprefix(heads) if heads else ""


def _dedent(lines: list[str]) -> list[str]:
    cut = len(_indent(lines))
    return [line[cut:].rstrip() if line.strip() else "" for line in lines]


def _similarity(a: str, b: str) -> float:
    """1 - Levenshtein distance / longer length."""
    if a == b:
        return 1.0
    if not a or not b:
        return 0.0
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            deletion = previous[j] + 1
            insertion = current[j - 1] + 1
            substitution = previous[j - 1] + (char_a != char_b)
            current.append(min(deletion, insertion, substitution))
        previous = current
    return 1 - previous[-1] / max(len(a), len(b))


class _Haystack:
    """A file's text, split into lines once, and the strategies that search it for old_string: each
    returns the (start, end) text offsets of the places it matches."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.split("\n")
        # each line's offset: the lengths before it, each with its newline
        self.starts = [0, *accumulate(len(line) + 1 for line in self.lines[:-1])]

    @cached_property
    def trimmed(self) -> list[str]:
        return [line.strip() for line in self.lines]

    def span(self, first: int, last: int) -> Span:
        """Text offsets of whole lines first..last (the last line's newline excluded)."""
        return self.starts[first], self.starts[last] + len(self.lines[last])

    def text_span(self, first: int, last: int) -> Span:
        """Lines first..last without the first's indentation, which new_string then keeps."""
        start, end = self.span(first, last)
        return start + len(_leading_space(self.lines[first])), end

    def line_of(self, offset: int) -> int:
        return self.text.count("\n", 0, offset) + 1

    def find_trimmed(self, wanted: str, start: int) -> int | None:
        """The index of the first line from `start` on that is `wanted` once trimmed."""
        lines = range(start, len(self.lines))
        return next((index for index in lines if self.trimmed[index] == wanted), None)

    def exact(self, old: str) -> list[Span]:
        if not old:
            return []
        return [match.span() for match in re.finditer(re.escape(old), self.text)]

    def blocks(self, size: int, same: Callable[[list[str]], bool], whole: bool = True,
               first: str | None = None) -> list[Span]:
        """The line strategies' one loop: every block of `size` lines that `same` accepts (and
        whose first line is `first` once trimmed, if given: a cheap pre-filter), as whole lines, or
        (not `whole`) without the first's indentation, which new_string then keeps."""
        span = self.span if whole else self.text_span
        return [span(i, i + size - 1) for i in range(len(self.lines) - size + 1)
                if (first is None or self.trimmed[i] == first) and same(self.lines[i:i + size])]

    def line_blocks(self, old: str, same: LinesCheck) -> list[Span]:
        """Blocks of whole lines, as many as old_string has, that `same` accepts (the first line
        pre-filters)."""
        want = _find_lines(old)
        if not "".join(want).strip():
            return []
        return self.blocks(len(want), lambda got: same(got, want), first=want[0].strip())

    def line_trimmed(self, old: str) -> list[Span]:
        return self.line_blocks(old, lambda got, want: _stripped(got) == _stripped(want))

    def block_anchor(self, old: str) -> list[Span]:
        """First and last lines as anchors; the middle only needs to be similar: the mean
        Levenshtein similarity of its lines, scaled down when the two middles differ in length."""
        want = _find_lines(old)
        first = want[0].strip()
        last = want[-1].strip()
        middle = [w.strip() for w in want[1:-1]]
        if len(want) < 3 or not first or not last:
            return []
        scored = []
        for i, line in enumerate(self.trimmed):
            if line != first:
                continue
            j = self.find_trimmed(last, i + 2)
            if j is None:
                continue
            got = self.trimmed[i + 1:j]
            score = sum(map(_similarity, got, middle)) / max(len(got), len(middle))
            scored.append((score, i, j))
        best = max((score for score, _, _ in scored), default=0.0)
        if best < BLOCK_ANCHOR_SIMILARITY:
            return []
        return [self.span(i, j) for score, i, j in scored if score >= best - 1e-9]

    def whitespace_normalized(self, old: str) -> list[Span]:
        """Runs of whitespace compare equal, as in OpenCode's replacer: a one-line old_string
        within a line, a longer one over as many whole lines (without the first's indentation)."""
        words = old.split()
        size = len(_find_lines(old))
        if not words:
            return []
        if size > 1:
            return self.blocks(size, lambda got: " ".join(got).split() == words, whole=False)
        within = re.compile(r"[ \t]+".join(map(re.escape, words)))
        spans = []
        for i, line in enumerate(self.lines):
            if line.split() == words:
                # the whole line (but its indentation, which new_string keeps)
                spans.append(self.text_span(i, i))
            else:
                found = within.finditer(line)
                spans += [(self.starts[i] + m.start(), self.starts[i] + m.end()) for m in found]
        return spans

    def indentation_flexible(self, old: str) -> list[Span]:
        """The same lines with the same relative indentation, shifted as a whole."""
        return self.line_blocks(old, lambda got, want: _dedent(got) == _dedent(want))

    def escape_normalized(self, old: str) -> list[Span]:
        """old_string arrived escaped one level too many (\\n, \\", \\t as two characters)."""
        plain = _unescape(old)
        if plain != old:
            found = self.exact(plain) or self.line_trimmed(plain)
            if found:
                return found
        return self.escaped_lines(plain)

    def escaped_lines(self, plain: str) -> list[Span]:
        """Whole lines that read as old_string once the file's own escapes are undone: the file
        has `'it\\'s'` where the model quoted `'it's'` (OpenCode's replacer looks both ways)."""
        want = _stripped(_find_lines(plain))

        def same(got: list[str]) -> bool:
            return "\\" in "".join(got) and _stripped(map(_unescape, got)) == want
        return self.blocks(len(want), same, whole=False)

    def trimmed_boundary(self, old: str) -> list[Span]:
        """old_string without its leading and trailing whitespace (a blank line the file lacks)."""
        core = old.strip()
        if not core or core == old:
            return []
        return self.exact(core) or self.line_trimmed(core)

    def context_aware(self, old: str) -> list[Span]:
        """Same line count, both anchors, and at least half the middle lines equal."""
        want = _stripped(_find_lines(old))
        if len(want) < 3 or not want[0] or not want[-1]:
            return []
        n_wanted = sum(1 for line in want[1:-1] if line)

        def same(got: list[str], _) -> bool:
            got = _stripped(got)
            pairs = zip(got[1:-1], want[1:-1])
            equal = sum(1 for g, w in pairs if w and g == w)
            return got[-1] == want[-1] and equal * 2 >= n_wanted
        return self.line_blocks(old, same)

    def multi_occurrence(self, old: str) -> list[Span]:
        """replace_all over fuzzy matches: what whitespace-tolerant strategies find, no overlaps."""
        finders = (self.line_trimmed, self.whitespace_normalized,
                   self.indentation_flexible, self.trimmed_boundary)
        found = set().union(*(finder(old) for finder in finders))
        # Left to right; of two that start together, the longer first.
        ordered = sorted(found, key=lambda span: (span[0], -span[1]))
        spans: list[Span] = []
        for start, end in ordered:
            if not spans or start >= spans[-1][1]:
                spans.append((start, end))
        return spans

    def quote_normalized(self, old: str) -> list[Span]:
        """old_string typed with straight quotes and plain dashes where the file has typographic
        ones, or the other way round (Claude Code's edit, Codex's apply-patch match so): one
        character for one, so a match's offsets are the file's."""
        text = self.text.translate(PLAIN_PUNCTUATION)
        plain = old.translate(PLAIN_PUNCTUATION)
        if text == self.text and plain == old:
            return []
        return [m.span() for m in re.finditer(re.escape(plain), text)]

    def unicode_normalized(self, old: str) -> list[Span]:
        """old_string in another Unicode normalization than the file (é typed as one character,
        stored as e + U+0301): both compared as NFC, a character with its combining marks at a
        time, so a match maps back to whole characters of the file."""
        if all(unicodedata.is_normalized("NFC", both) for both in (self.text, old)):
            return []
        starts = [at for at, ch in enumerate(self.text) if not unicodedata.combining(ch)]
        if starts[:1] != [0]:
            starts.insert(0, 0)
        normal_at = {}
        pieces = []
        length = 0
        for start, end in zip(starts, [*starts[1:], len(self.text)]):
            normal_at[length] = start
            pieces.append(unicodedata.normalize("NFC", self.text[start:end]))
            length += len(pieces[-1])
        normal_at[length] = len(self.text)
        want = unicodedata.normalize("NFC", old)
        if not want:
            return []
        found = re.finditer(re.escape(want), "".join(pieces))
        return [(normal_at[m.start()], normal_at[m.end()]) for m in found
                if m.start() in normal_at and m.end() in normal_at]


# Typographic quotes and dashes as the ASCII a model types (Codex's seek_sequence), and the curly
# quotes back (opening, closing).
PLAIN_PUNCTUATION = str.maketrans("‘’‚‛“”„‟‐‑‒–—―−", "''''\"\"\"\"-------")
CURLY_QUOTES = {"'": "‘’", '"': "“”"}
# When a strategy runs: without / with replace_all.
SINGLE = "single"
BULK = "bulk"
CASCADE = [
    ("exact", _Haystack.exact, {SINGLE, BULK}),
    ("quote_normalized", _Haystack.quote_normalized, {SINGLE, BULK}),
    ("line_trimmed", _Haystack.line_trimmed, {SINGLE}),
    ("block_anchor", _Haystack.block_anchor, {SINGLE}),
    ("whitespace_normalized", _Haystack.whitespace_normalized, {SINGLE}),
    ("indentation_flexible", _Haystack.indentation_flexible, {SINGLE}),
    ("escape_normalized", _Haystack.escape_normalized, {SINGLE, BULK}),
    ("trimmed_boundary", _Haystack.trimmed_boundary, {SINGLE}),
    ("context_aware", _Haystack.context_aware, {SINGLE}),
    ("multi_occurrence", _Haystack.multi_occurrence, {BULK}),
    ("unicode_normalized", _Haystack.unicode_normalized, {SINGLE, BULK}),
]
# Stricter than what precedes them in one respect.
NARROWING = {"indentation_flexible", "trimmed_boundary"}


def _adapt(old: str, matched: str, new: str) -> str:
    """new_string fitted to what old_string actually matched: the file's indentation when the whole
    block was shifted, and the file's surrounding whitespace when old_string's differed."""
    if old == matched or not new:
        return new
    old_lines = old.strip("\n").split("\n")
    got_lines = matched.strip("\n").split("\n")
    same_shape = len(old_lines) == len(got_lines)
    if same_shape and _dedent(old_lines) == _dedent(got_lines):
        was = _indent(old_lines)
        now = _indent(got_lines)
        old = _reindent(old, was, now)
        # It may carry the file's indentation already.
        if _indent(new.strip("\n").split("\n")) != now:
            new = _reindent(new, was, now)
    elif same_shape and _stripped(old_lines) == _stripped(got_lines):
        # old_string's indentation was wrong line by line (often: none at all).
        new = _indent_each(old_lines, got_lines, new)
    # Leading whitespace: what old_string had, what the file had there, what new_string has.
    was, got, now = map(_leading_space, (old, matched, new))
    if was and was != got and now == was and new.strip():
        new = got + new.lstrip()
    was, got, now = map(_trailing_space, (old, matched, new))
    if was and was != got and now == was and new.strip():
        new = new.rstrip() + got
    return new


def _curled(old: str, new: str, matched: str) -> str:
    """new_string in the quotes of the text it replaces, for each kind (' or "): curly where that
    text has only curly ones (an opening one at the start or after a space or bracket, else a
    closing one: it's), straight where old_string had curly ones and the text has none."""
    for ch, (opening, closing) in CURLY_QUOTES.items():
        curly = opening in matched or closing in matched
        if ch not in matched and curly:
            new = re.sub(rf"(?:^|(?<=[\s(\[{{])){ch}", opening, new).replace(ch, closing)
        elif not curly and (opening in old or closing in old):
            new = new.replace(opening, ch).replace(closing, ch)
    return new


def _stripped(lines) -> list[str]:
    return [line.strip() for line in lines]


def _indent_each(old_lines: list[str], got_lines: list[str], new: str) -> str:
    """new_string with each line indented as the file's line in its place, when new_string has
    old_string's line count and each line's indentation as old_string had it; else unchanged."""
    body = new.strip("\n")
    if not body.strip():
        return new
    new_lines = body.split("\n")
    if len(new_lines) != len(old_lines):
        return new
    fitted = []
    for old_line, got_line, new_line in zip(old_lines, got_lines, new_lines):
        if _leading_space(new_line) != _leading_space(old_line):
            return new
        if new_line.strip():
            new_line = _leading_space(got_line) + new_line.lstrip()
        fitted.append(new_line)
    head = new[:len(new) - len(new.lstrip("\n"))]
    tail = new[len(new.rstrip("\n")):]
    return head + "\n".join(fitted) + tail


def _leading_space(text: str) -> str:
    return text[:len(text) - len(text.lstrip())]


def _trailing_space(text: str) -> str:
    return text[len(text.rstrip()):]


def _reindent(text: str, was: str, now: str) -> str:
    """Each non-blank line that starts with `was` starts with `now` instead."""
    lines = []
    for line in text.split("\n"):
        if line.startswith(was) and line.strip():
            line = now + line[len(was):]
        lines.append(line)
    return "\n".join(lines)


@dataclass
class _Replaced:
    # The new file text.
    text: str
    # Which cascade step matched.
    strategy: str
    # Replacements made.
    count: int
    # 1-based line where the first replacement starts in the new text.
    first_line: int
    # Lines that replacement spans.
    n_lines: int
    # The file's bytes to write (its BOM and line endings put back).
    after: bytes = b""


def _replace(text: str, old: str, new: str, replace_all: bool, shown_path: str) -> _Replaced:
    hay = _Haystack(text)
    mode = BULK if replace_all else SINGLE
    ambiguous: list[Span] = []
    oversized: Span | None = None
    for name, finder, modes in CASCADE:
        if mode not in modes:
            continue
        spans = finder(hay, old)
        if name == "exact" and len(spans) > 1 and not replace_all:
            # The model's exact text is ambiguous: no fuzzy strategy may pick for it.
            ambiguous = spans
            break
        if ambiguous:
            if name not in NARROWING:
                continue
            spans = _overlapping(spans, ambiguous)
        if name != "exact":
            # A fuzzy match much larger than what the model quoted is more likely wrong than right.
            big = [span for span in spans if _disproportionate(hay, span, old)]
            if oversized is None and big:
                oversized = big[0]
            spans = [span for span in spans if span not in big]
        if len(spans) > 1 and not replace_all:
            ambiguous = ambiguous or spans
            continue
        if spans:
            if name == "escape_normalized" and _unescape(old) != old:
                # An over-escaped old_string came with an over-escaped new_string.
                old = _unescape(old)
                new = _unescape(new)
            return _replace_spans(hay.text, spans, old, new, name)
    if ambiguous:
        lines = [hay.line_of(start) for start, _ in ambiguous]
        raise ToolError(
            f"old_string matches {len(ambiguous)} places in {shown_path} ({_line_list(lines)}). "
            "Include more surrounding lines so it matches exactly one, "
            "or set replace_all to true to change every occurrence.",
            error="ambiguous",
            lines=lines)
    if oversized:
        first = hay.line_of(oversized[0])
        last = hay.line_of(oversized[1])
        raise ToolError(
            f"The closest match for old_string in {shown_path} spans lines {first}–{last}, "
            "much more text than old_string; "
            "refusing a fuzzy replacement that could delete unrelated code. "
            "Copy old_string exactly from the file (read it again if needed).",
            error="disproportionate")
    raise ToolError(_not_found(hay, old, shown_path), error="not_found")


def _line_list(numbers: list[int]) -> str:
    """The matches' lines, as "lines 1, 3", or "line 1 ×2" where several share a line
    ("lines 1, 1" reads as a typo)."""
    counts = Counter(numbers)
    parts = []
    for number, count in list(counts.items())[:20]:
        parts.append(f"{number} ×{count}" if count > 1 else str(number))
    label = "line" if len(counts) == 1 else "lines"
    return f"{label} {', '.join(parts)}"


def _overlapping(spans: list[Span], others: list[Span]) -> list[Span]:
    """The spans that overlap one of the others."""
    return [(start, end) for start, end in spans
            if any(start < other_end and other_start < end for other_start, other_end in others)]


def _disproportionate(hay: _Haystack, span: Span, old: str) -> bool:
    """A match much larger than old_string, in characters or in lines."""
    start, end = span
    too_long = end - start > 2 * len(old) + 200
    too_many_lines = hay.text.count("\n", start, end) > 2 * old.count("\n") + 4
    return too_long or too_many_lines


def _replace_spans(text: str, spans: list[Span], old: str, new: str, strategy: str) -> _Replaced:
    # Text before the first span, its replacement, text up to the next span, …
    pieces = []
    at = 0
    for start, end in spans:
        line_start = text.rfind("\n", 0, start) + 1
        whole_lines = text[end:end + 1] == "\n" and not text[line_start:start].strip()
        if not new and whole_lines and line_start >= at and not old.endswith("\n"):
            # Deleting whole lines deletes them, indentation and line break too (as Claude Code's
            # edit does), not leaving a blank line.
            start, end = line_start, end + 1
        pieces.append(text[at:start])
        if strategy == "quote_normalized":
            pieces.append(_curled(old, new, text[start:end]))
        else:
            pieces.append(_adapt(old, text[start:end], new))
        at = end
    new_text = "".join(pieces) + text[at:]
    first_line = pieces[0].count("\n") + 1
    n_lines = pieces[1].count("\n") + 1
    return _Replaced(new_text, strategy, len(spans), first_line, n_lines)


def _not_found(hay: _Haystack, old: str, shown_path: str) -> str:
    """The repair message: where the closest text is, shown as the model should have quoted it."""
    message = (f"old_string was not found in {shown_path} (tried exact and fuzzy matching). "
               "Copy it exactly from the file, including whitespace, "
               "without read's line-number prefixes; "
               "read the file again if it may have changed.")
    want = [line for line in _find_lines(old) if line.strip()]
    if not want:
        return message
    import difflib
    close = difflib.get_close_matches(want[0].strip(), hay.trimmed, n=1, cutoff=0.6)
    if not close:
        return message
    index = hay.trimmed.index(close[0])
    shown = hay.lines[index:index + min(len(_find_lines(old)), 12)]
    similar = _numbered(shown, index + 1)
    # A zero-width space or a no-break space looks the same as what the model quoted.
    hidden = sorted({ch for ch in "".join(shown) if _invisible(ch)} - set(old))
    if hidden:
        names = ", ".join(f"U+{ord(ch):04X} {unicodedata.name(ch, '')}".rstrip() for ch in hidden)
        similar += f"\nThese lines hold characters that look like nothing or a space: {names}."
    return f"{message}\nThe most similar text starts at line {index + 1}:\n{similar}"


def _invisible(ch: str) -> bool:
    category = unicodedata.category(ch)
    return category == "Cf" or category == "Zs" and ch != " "

# ---------------------------------------------------------------- write and edit


async def _tool_write(box: Toolbox, args: dict, tool_use_id: str, confine: Confine) -> ToolResult:
    ws = box.workspace
    text = args["content"]
    path = ws.resolve(args["file_path"])
    shown = _one_line(ws.display(path))
    if path.is_dir() or args["file_path"].endswith("/"):
        raise ToolError(f"{shown}/ is a directory path; give a file path.", error="is_directory")
    before = None
    written = _EditText(text, False, False)
    if path.exists():
        # An overwrite keeps the old file's CRLF line endings, byte-order mark and UTF-16.
        box.check_fresh(path)
        before = ws.read_file(path, box.places)
        if "\ufffd" in text:
            # a file not UTF-8: refused, or its bytes read showed as U+FFFD would be lost
            _EditText.of(before, shown)
        crlf = _uses_crlf(_decode_text(before)) and "\r\n" not in text
        bom = before.startswith((codecs.BOM_UTF8, *UTF16)) and not text.startswith("\ufeff")
        written = _EditText(text, bom, crlf, UTF16.get(before[:2], "utf-8"))
    _refuse_masks(args["content"], before, shown)
    data = written.back(text)
    if data == before:
        meta = {"path": shown, "added": 0, "removed": 0}
        return ToolResult(f"{shown} already has exactly this content; nothing changed.", meta=meta)
    added, removed = box.commit(path, before, data, tool_use_id)
    lines = events.counted(len(_split_lines(args["content"])), "line")
    text = f"Wrote {shown} ({lines}; +{added} −{removed})."
    if before is None:
        text = f"Created {shown} ({lines})."
    meta = {"path": shown, "added": added, "removed": removed, "created": before is None}
    return ToolResult(text, meta=meta)


@dataclass
class _EditText:
    """A file's text as edit matches it: LF line endings and no BOM; `back` puts both back."""
    text: str
    bom: bool
    crlf: bool
    encoding: str = "utf-8"

    @classmethod
    def of(cls, data: bytes, shown: str) -> "_EditText":
        encoding = UTF16.get(data[:2], "utf-8")
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError:
            raise ToolError(
                f"{shown} is not UTF-8 text; edit it with bash (e.g. sed) instead.",
                error="encoding") from None
        crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")    # mixed: LF stays LF
        if crlf:
            text = _lf(text)
        return cls(text.removeprefix("\ufeff"), text.startswith("\ufeff"), crlf, encoding)

    def back(self, text: str) -> bytes:
        if self.crlf:
            text = text.replace("\n", "\r\n")
        if self.bom:
            text = "\ufeff" + text
        return text.encode(self.encoding)


def _edit_strings(args: dict, bom: bool) -> tuple[str, str]:
    """old_string and new_string in LF, whatever the file uses (written back in its own line
    ending), without the BOM a model copied from a file that has one."""
    old = _lf(args["old_string"])
    new = _lf(args["new_string"])
    if old == new:
        raise ToolError(
            "old_string and new_string are identical, so the edit would change nothing. "
            "Put the replacement text in new_string.",
            error="no_change")
    if bom:
        old = old.removeprefix("\ufeff")
        new = new.removeprefix("\ufeff")
    return old, new


def _planned_edit(box: Toolbox, args: dict, path: Path,
                  places: list[str]) -> tuple[bytes, "_Replaced"]:
    """(the file's bytes, the edit made of them, whose `after` is what to write), or the ToolError
    the call meets (unread or changed since, a secret's mask, not UTF-8, not found, ambiguous)."""
    shown = _one_line(box.workspace.display(path))
    box.check_fresh(path)
    before = box.workspace.read_file(path, places)
    _refuse_masks(args["new_string"], before, shown)
    file = _EditText.of(before, shown)
    old, new = _edit_strings(args, file.bom)
    if old == "":
        if file.text.strip():
            raise ToolError(
                f"old_string is empty but {shown} has content. Quote the text to replace, "
                "or use write to replace the whole file.",
                error="empty_old_string")
        done = _Replaced(new, "exact", 1, 1, new.count("\n") + 1)
    else:
        done = _replace(file.text, old, new, args.get("replace_all", False), shown)
    done.after = file.back(done.text)
    if done.after == before:
        raise ToolError(f"{shown} already reads as this edit would leave it.", error="no_change")
    return before, done


async def _tool_edit(box: Toolbox, args: dict, tool_use_id: str, confine: Confine) -> ToolResult:
    ws = box.workspace
    path = ws.resolve(args["file_path"])
    shown = _one_line(ws.display(path))
    _edit_strings(args, False)
    if not path.exists():
        if args["old_string"] == "":
            write_args = {"file_path": args["file_path"], "content": args["new_string"]}
            return await _tool_write(box, write_args, tool_use_id, confine)
        error = await asyncio.to_thread(_missing, ws, path, True)
        raise ToolError(
            f"{error} To create a new file, use write (or edit with an empty old_string).",
            **error.meta)
    if path.is_dir():
        raise ToolError(f"{shown} is a directory; give a file path.", error="is_directory")
    # Off the event loop (it only reads): fuzzy matching in a 10,000-line file takes up to 100 ms.
    before, done = await asyncio.to_thread(_planned_edit, box, args, path, box.places)
    added, removed = box.commit(path, before, done.after, tool_use_id)
    meta = {"path": shown, "added": added, "removed": removed, "strategy": done.strategy,
            "replacements": done.count}
    return ToolResult(_edit_report(shown, done, added, removed), meta=meta)


def _edit_report(shown_path: str, done: _Replaced, added: int, removed: int) -> str:
    lines = _split_lines(done.text)
    first = max(1, done.first_line - SNIPPET_CONTEXT_LINES)
    last_replaced = done.first_line + done.n_lines - 1
    last = min(len(lines), last_replaced + SNIPPET_CONTEXT_LINES)
    if last - first > 40:
        # A long replacement: its start and end are enough to check it.
        start = _numbered(lines[first - 1:first + 19], first)
        end = _numbered(lines[last - 20:last], last - 19)
        snippet = f"{start}\n   …\n{end}"
    else:
        snippet = _numbered(lines[first - 1:last], first)
    count = events.counted(done.count, "replacement")
    where = "first replacement, " if done.count > 1 else ""
    fuzzy = ""
    if done.strategy != "exact":
        strategy = done.strategy.replace("_", "-")
        fuzzy = f" old_string did not match exactly; matched by the {strategy} strategy."
    return (f"Edited {shown_path}: {count} (+{added} −{removed}).{fuzzy}\n"
            f"Lines {first}–{last} now ({where}as read would show them):\n{snippet}")


def _diff(shown_path: str, before: str, after: str) -> tuple[int, int, str]:
    """(lines added, lines removed, unified diff capped at DIFF_CHAR_CAP). Only the changed middle
    is given to difflib, so a one-line edit in a 10,000-line file stays cheap."""
    a = before.splitlines(keepends=True)
    b = after.splitlines(keepends=True)
    # commonprefix compares any sequences: here, lists of lines.
    prefix = len(os.path.commonprefix([a, b]))
    suffix = len(os.path.commonprefix([a[prefix:][::-1], b[prefix:][::-1]]))
    # 3 lines of context stay on each side.
    low = max(0, prefix - 3)
    keep = max(0, suffix - 3)
    import difflib
    lines = difflib.unified_diff(
        a[low:len(a) - keep], b[low:len(b) - keep],
        f"a/{shown_path}", f"b/{shown_path}", n=3)
    out = []
    added = 0
    removed = 0
    for n, line in enumerate(lines):
        if n < 2:
            # The ---/+++ file header: a changed line may begin with "++" or "--" too.
            pass
        elif line.startswith("@@"):
            line = _shift_hunk_header(line, low)
        elif line.startswith("+"):
            added += 1
        elif line.startswith("-"):
            removed += 1
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    diff = "".join(out)
    if len(diff) > DIFF_CHAR_CAP:
        cut = f"\n[… diff cut at {DIFF_CHAR_CAP:,} of {len(diff):,} characters …]\n"
        diff = diff[:DIFF_CHAR_CAP] + cut
    return added, removed, diff


def _shift_hunk_header(line: str, low: int) -> str:
    """An @@ -a,b +c,d @@ header of a diff of lines from `low` on, numbered as in the whole file."""
    def shifted(match: re.Match) -> str:
        return f"{match.group(1)}{int(match.group(2)) + low}"
    return re.sub(r"([-+])(\d+)", shifted, line, count=2)

# ---------------------------------------------------------------- grep and glob
# ripgrep when it is on PATH, otherwise Python over the same candidate files: `git ls-files` in a
# repository (so .gitignore applies), a walk elsewhere. Hidden files count, .git never does; glob
# patterns follow ripgrep's --glob rules (no "/" means "at any depth") and are always applied by us:
# ripgrep's own --glob would override .gitignore.


def _glob_matcher(pattern: str) -> Callable[[str], bool]:
    """A pattern with a "/" matches the relative path, else the base name (as ripgrep's --glob)."""
    pattern = pattern.strip().removeprefix("./")
    regex = re.compile(sandbox.glob_regex(pattern.lstrip("/")) + r"\Z")
    if "/" in pattern.rstrip("/"):
        return lambda rel: regex.match(rel) is not None
    return lambda rel: regex.match(rel.rsplit("/", 1)[-1]) is not None


def project_files(ws: Workspace, root: Path | None = None, places: list[str] | None = None,
                  limit: int | None = None,
                  skip: Callable[[str], bool] = lambda name: name == ".git") -> list[str]:
    """The files under `root` (default the project root) as relative POSIX paths: the one lister,
    for grep and glob without ripgrep and for @-mention completion. git's view where there is one
    (tracked files, and untracked ones not ignored), else a walk that enters no folder `skip`
    names; only plain files, never a link; at most `limit`."""
    root = root or ws.cwd
    places = places or [str(ws.cwd)]
    argv = ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"]
    code, out = ws.capture(argv, cwd=root)
    found = []
    with _closing(ws.open_judged(root, places, os.O_RDONLY | os.O_DIRECTORY)) as root_fd:
        if code == 0:
            # (nothing listed: an empty repository, or every file ignored, not a walk of them)
            listed = [rel for rel in out.split("\0") if rel][:limit]
            return [rel for rel in listed if _plain_file(rel, root_fd)]
        # From the judged folder's descriptor, fwalk enters no folder a link was swapped in for.
        for folder, dirs, files, folder_fd in os.fwalk(".", dir_fd=root_fd):
            dirs[:] = sorted(d for d in dirs if not skip(d))
            for name in sorted(files):
                if _plain_file(name, folder_fd):
                    found.append(os.path.normpath(f"{folder}/{name}"))
            if limit is not None and len(found) >= limit:
                break
    return found[:limit]


def _plain_file(name: str, folder_fd: int) -> bool:
    """A file the search reads, as ripgrep chooses: never a link it meets at the end (a
    committed notes.txt -> ~/.aws/credentials, or -> /etc/passwd), only plain files."""
    try:
        found = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(found.st_mode)


async def _list_files(box: Toolbox, root: Path, confine: Confine) -> list[str]:
    """The files under `root`: ripgrep's list (NUL-separated: a name may hold a newline) or ours."""
    if not box.ripgrep:
        return await asyncio.to_thread(project_files, box.workspace, root, box.places)
    argv = ["--files", "--null", "--hidden", "--no-messages", "--glob", "!.git"]
    records, _ = await _ripgrep(box, argv, root, 10**7, confine, end="\0")
    return [rel.removeprefix("./") for rel in records]


async def _ripgrep(box: Toolbox, argv: list[str], cwd: Path, cap: int, confine: Confine,
                   end: str = "\n") -> tuple[list[str], int]:
    """ripgrep's output records, split at `end` (at most `cap`; then it is stopped), and its exit
    code. It runs read-only, and reads outside the project only where the call's approved paths
    say."""
    read_only = replace(READ_ONLY_CONFINE, paths=confine.paths)
    child = await box.workspace.exec([box.ripgrep, *argv], cwd=cwd, confine=read_only)
    chunks = []
    n_records = 0
    try:
        async with asyncio.timeout(SEARCH_TIMEOUT_S):
            while n_records < cap and (chunk := await child.stdout.read(65_536)):
                chunks.append(chunk)
                n_records += chunk.count(end.encode())
            _kill_group(child.pid)
            await child.proc.wait()
    except TimeoutError:
        raise ToolError(
            f"The search took over {SEARCH_TIMEOUT_S} s and was stopped; "
            "narrow the path or pattern.",
            error="timeout") from None
    finally:
        _kill_group(child.pid)
        child.close_pipes()
    # a name that is not UTF-8 kept as os keeps it (its text line: grep's _rg_grep)
    records = b"".join(chunks).decode("utf-8", "surrogateescape").split(end)
    if records[-1] == "":
        # The output ended with `end`; a last record without it still counts.
        records.pop()
    return records[:cap], child.proc.returncode


def _newest_first(root: Path, rels) -> list[str]:
    # a file that cannot be stat'ed sorts as the oldest
    stamps = {rel: _stamp(root / rel) or (0, 0) for rel in rels}
    return sorted(rels, key=lambda rel: (-stamps[rel][0], rel))


async def _tool_glob(box: Toolbox, args: dict, tool_use_id: str, confine: Confine) -> ToolResult:
    ws = box.workspace
    pattern = _fs_path(args["pattern"])
    if not pattern.strip():
        raise ToolError("pattern is empty; pass a glob such as **/*.py.", error="empty_pattern")
    root = _existing(ws, args.get("path"))
    if pattern.startswith("/") or ".." in pattern.split("/"):
        # An absolute pattern, or one going up ("../*"), names its own folder, as permission_subject
        # judged it (_glob_base): search there, not under path, where the matcher would drop its
        # "/" and match a look-alike, or match nothing (no listed file starts with "../").
        pattern = posixpath.join(args.get("path") or ".", pattern)
        base = sandbox.glob_base(pattern)
        if base == pattern.rstrip("/"):
            base = posixpath.dirname(base)
        root = _existing(ws, base)
        # anchored ("/*.py" matches the folder's own files, not the same name anywhere below)
        pattern = "/" + pattern[len(base):].lstrip("/")
    # As judged (the real path; "link/../.." is not where normpath puts it), not Landlock alone.
    ws.judged(root, box.places)
    match = _glob_matcher(pattern)
    found = [rel for rel in await _list_files(box, root, confine) if match(rel)]
    meta = {}
    kept, note = _without_secrets(box, confine, root, found, meta)
    files = await asyncio.to_thread(_newest_first, root, kept)
    meta.update(files=len(files), truncated=len(files) > SEARCH_RESULT_CAP)
    if not files:
        where = ws.display(root)
        if where == ".":
            where = "the project"        # not "under .."
        text = f"No files match {_quoted(pattern)} under {where}.{note}"
        if pattern.endswith("/"):
            # git's rule: a pattern ending in "/" names a folder, and glob lists only files
            folder = pattern.rstrip("/")
            text += f" glob lists files: for what a folder holds, try {_quoted(folder + '/**')}."
        return ToolResult(text, meta=meta)
    shown = "\n".join(_one_line(ws.display(root / rel)) for rel in files[:SEARCH_RESULT_CAP])
    if len(files) > SEARCH_RESULT_CAP:
        shown += (f"\n\n(Showing the {SEARCH_RESULT_CAP} most recently modified "
                  f"of {len(files):,} matching files. "
                  "Narrow the pattern or pass a path to see others.)")
    return ToolResult(shown + note, meta=meta)


def _without_secrets(box: Toolbox, confine: Confine, root: Path, rels,
                     meta: dict) -> tuple[list[str], str]:
    """(the files grep and glob show, the note naming the secret ones they leave out; `meta`
    gets the engine and their number): a file whose name matches one of the call's `hide`
    patterns, or path its hide_paths or deny_paths, is secret; a link into a closed location (a
    committed notes.txt -> ~/.aws/credentials; ripgrep never follows links, so only the Python
    fallback meets these) is left out silently, as ripgrep does. When the user granted reading
    secrets for this call, only what the user's rules deny reading is left out."""
    meta.update(engine="ripgrep" if box.ripgrep else "python", hidden=0)
    closed = sandbox.closed_locations(Path.home(), box.workspace.home, confine.paths)
    hidden = confine.deny_paths if confine.secrets else confine.hide_paths
    is_secret = sandbox.secret_matcher(() if confine.secrets else confine.hide, hidden)
    kept = []
    secret = []
    for rel in rels:
        path = root / rel
        if is_secret(box.workspace.display(path)):
            secret.append(rel)
        elif not (os.path.islink(path) and sandbox.within(_realpath(path), closed)):
            kept.append(rel)
    meta["hidden"] = len(secret)
    if not secret:
        return kept, ""
    ws = box.workspace
    names = events.listed([_one_line(ws.display(root / rel)) for rel in sorted(secret)], 5)
    return kept, (f"\n\n({events.counted(len(secret), 'secret file')} left out: {names}. "
            "Reading them needs the user's permission (or their rules deny it): ask for it, "
            "or read one with the read tool so that the user is asked.)")


async def _tool_grep(box: Toolbox, args: dict, tool_use_id: str, confine: Confine) -> ToolResult:
    ws = box.workspace
    pattern = args["pattern"]
    include = args.get("include")
    target = _existing(ws, args.get("path"), directory=False)
    ws.judged(target, box.places)
    root = target if target.is_dir() else target.parent
    keep = _glob_matcher(include) if include else (lambda rel: True)
    hits = None
    if box.ripgrep:
        # ripgrep judges its own syntax (it knows \p{L}, Python's re does not); what it refuses
        # (look-around, backreferences) Python's re may take, as it would where rg is missing
        hits = await _rg_grep(box, pattern, target, root, include, keep, confine)
    if hits is None:
        try:
            regex = re.compile(POSIX_SET.sub(_posix_classes, pattern))
        except re.error as exc:
            raise _bad_pattern(pattern, str(exc)) from None
        hits = await asyncio.to_thread(_py_grep, ws, regex, target, root, keep, box.places)
    # Filtered here for both engines: the same result.
    meta = {}
    kept, note = _without_secrets(box, confine, root, hits, meta)
    hits = {rel: hits[rel] for rel in kept}
    total = sum(map(len, hits.values()))
    meta.update(matches=total, files=len(hits), truncated=total > SEARCH_RESULT_CAP)
    if not hits:
        text = f"No matches for {_quoted(pattern)} in {_one_line(ws.display(target))}."
        if ACROSS_LINES.search(pattern):
            text += (" Lines are searched one at a time: a line break (\\n) or a $ with text after "
                     "it never matches. Search for one line, or escape $ as \\$.")
        return ToolResult(text + note, meta=meta)
    out = []
    for rel in _newest_first(root, hits):
        shown = _one_line(ws.display(root / rel))
        for number, text in hits[rel][:SEARCH_RESULT_CAP - len(out)]:
            out.append(f"{shown}:{number}: {_grep_line(text)}")
    if total > SEARCH_RESULT_CAP:
        counted = f"{total:,}" if total < GREP_SCAN_CAP else f"more than {GREP_SCAN_CAP:,}"
        out.append(f"\n(Showing {SEARCH_RESULT_CAP} of {counted} matching lines "
                   f"in {events.counted(len(hits), 'file')}, most recently modified files first. "
                   "Narrow it with a more specific pattern, a path, or include "
                   "(e.g. \"*.py\").)")
    return ToolResult("\n".join(out) + note, meta=meta)


def _grep_line(text: str) -> str:
    text = text.rstrip("\r")
    if len(text) <= GREP_LINE_CHARS:
        return text
    return text[:GREP_LINE_CHARS] + "… [line cut]"


# ripgrep's POSIX classes, which Python's re reads as nested sets (matching wrongly, and printing
# a FutureWarning on the terminal): a bracket set holding one (sandbox.POSIX_CLASSES: what each is).
POSIX_SET = re.compile(r"\[\^?(?:[^][]|\[:[a-z]+:\])*\[:[a-z]+:\](?:[^][]|\[:[a-z]+:\])*\]")


def _posix_classes(bracket_set: re.Match) -> str:
    return re.sub(r"\[:([a-z]+):\]", lambda named: sandbox.POSIX_CLASSES.get(named[1], named[0]),
                  bracket_set[0])


def _bad_pattern(pattern: str, problem: str) -> ToolError:
    return ToolError(
        f"Invalid regular expression {_quoted(pattern)}: {problem.rstrip('.')}. "
        "Escape special characters such as ( [ { . * + ? | "
        "with a backslash to match them literally.",
        error="bad_pattern")


# A file's matching lines: (line number, text).
Hits = dict[str, list[tuple[int, str]]]
RG_GREP_ARGS = ["--line-number", "--no-heading", "--with-filename", "--null", "--color", "never",
                "--hidden", "--no-messages", "--max-columns", "1000", "--max-columns-preview",
                "--crlf", "--glob", "!.git"]


async def _rg_grep(box: Toolbox, pattern: str, target: Path, root: Path,
                   include: str | None, keep: Callable[[str], bool],
                   confine: Confine) -> Hits | None:
    argv = list(RG_GREP_ARGS)
    if include and "/" not in include.rstrip("/"):
        # A file type filters without overriding .gitignore.
        argv += ["--type-add", f"khaelor:{include}", "--type", "khaelor"]
    argv += ["-e", pattern, "--", "." if target.is_dir() else target.name]
    records, code = await _ripgrep(box, argv, root, GREP_SCAN_CAP, confine)
    if code == 2 and records and "\0" not in records[0]:
        # a pattern it refuses: the Python engine's to take or refuse (None)
        return None
    hits: Hits = {}
    # path NUL number ":" text; a path may hold a newline, so a record can span two of ripgrep's
    # lines
    found = re.findall(r"([^\0]*)\0(\d+):(.*)\n?", "\n".join(records))
    for rel, number, text in found:
        rel = rel.removeprefix("./")
        if keep(rel):
            # the text as the Python grep decodes it
            text = text.encode(errors="surrogateescape").decode(errors="replace")
            hits.setdefault(rel, []).append((int(number), text))
    return hits


def _py_grep(ws: Workspace, regex: re.Pattern, target: Path, root: Path,
             keep: Callable[[str], bool], places: list[str]) -> Hits:
    """grep without ripgrep. Files are opened from the judged folder's descriptor, never through a
    link; a pattern that is not a plain literal is matched in a child process with a time budget."""
    real = ws.judged(target, places)
    single = target.is_file()
    if single:
        folder = os.path.dirname(real)
        rels = [os.path.basename(real)] if keep(target.name) else []
    else:
        folder = real
        rels = list(filter(keep, project_files(ws, root, places)))
    try:
        folder_fd = sandbox.open_no_links(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise ws.refusal(target, exc) from None
    with _closing(folder_fd):
        if PLAIN_PATTERN.fullmatch(regex.pattern):
            # A literal cannot backtrack: no child (a fork costs milliseconds).
            hits = _grep_files(regex, folder_fd, rels)
        else:
            hits = _in_child(lambda: _grep_files(regex, folder_fd, rels))
    if single:
        # Shown under the name it was asked by (a link's own name).
        return {target.name: lines for lines in hits.values()}
    return hits


def _grep_files(regex: re.Pattern, folder_fd: int, rels: list[str]) -> Hits:
    hits = {}
    n_hits = 0
    # A whole file is checked first, as lines (^ and $ at each line's ends); \A, \Z and
    # look-around see across a line's end there, so such a pattern is tried line by line only.
    whole = re.compile(regex.pattern, regex.flags | re.MULTILINE)
    if re.search(r"\\[AZ]|\(\?<?[=!]", regex.pattern):
        whole = re.compile("")
    for rel in rels:
        text = _read_text_file(folder_fd, rel)
        if not text or not (whole.search(text) or "\r" in text and whole.search(_lf(text))):
            continue
        # ripgrep's lines: none after a last newline, a CR kept; its $ is before "\r\n" too (--crlf)
        for number, line in enumerate(text.removesuffix("\n").split("\n"), 1):
            if regex.search(line) or (line[-1:] == "\r" and regex.search(line[:-1])):
                # _grep_line shows no more: a minified file's line stays small.
                hits.setdefault(rel, []).append((number, line[:GREP_LINE_CHARS + 2]))
                n_hits += 1
        if n_hits >= GREP_SCAN_CAP:
            break
    return hits


def _in_child(work: Callable[[], Hits]) -> Hits:
    """work()'s result, computed in a forked child that has GREP_PATTERN_BUDGET_S: Python's re
    cannot be stopped from another thread, and a pattern like (a+)+$ backtracks for ever."""
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid == 0:
        # The child: only the match loop and the pipe; _exit skips every cleanup of the parent's.
        status = 1
        try:
            # Ctrl-C and resizes are for the parent: out of the terminal's process group, and
            # no signal forwarded to the parent's event loop through its wakeup fd.
            signal.set_wakeup_fd(-1)
            os.setpgid(0, 0)
            os.close(read_end)
            view = memoryview(json.dumps(work()).encode())
            while view:
                view = view[os.write(write_end, view):]
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    output = None
    try:
        output = _read_within(read_end, GREP_PATTERN_BUDGET_S)
    finally:
        os.close(read_end)
        if output is None:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if output is None:
        raise ToolError(
            f"The pattern took too long (over {GREP_PATTERN_BUDGET_S:g} s) and was stopped: it "
            "may backtrack without end (nested repeats like (a+)+). Simplify the pattern or narrow "
            "the path.",
            error="timeout")
    if os.waitstatus_to_exitcode(status) != 0:
        raise ToolError("The search failed; retry it, or narrow the path.", error="search_failed")
    return json.loads(output)


def _read_within(fd: int, budget_s: float) -> bytes | None:
    """All a pipe gives until it closes, or None when that takes over budget_s."""
    deadline = time.monotonic() + budget_s
    chunks = []
    # poll, not select: select cannot watch a descriptor numbered 1024 or more
    waiting = select.poll()
    waiting.register(fd, select.POLLIN)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not waiting.poll(remaining * 1000):
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _read_text_file(folder_fd: int, rel: str) -> str | None:
    """A file's text for the Python grep, opened beneath folder_fd through no link, at most
    READ_FILE_CAP_BYTES of it; None if it cannot be read, is not a regular file (a FIFO would
    block) or is binary (a NUL in it, as ripgrep judges)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = sandbox.open_no_links(rel, flags, dir_fd=folder_fd)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = handle.read(8192)
            # A binary file (even a 1 GB one) is judged by its head.
            if b"\0" not in data:
                data += _read_at_most(handle, READ_FILE_CAP_BYTES)
    except OSError:
        return None
    if b"\0" in data:
        return None
    return data.decode("utf-8", "replace")

# ---------------------------------------------------------------- bash


def _command(args: dict) -> str:
    """bash's and process start's command, refused when blank: it would run nothing, and pass."""
    if not args["command"].strip():
        raise ToolError("command is empty; pass the shell command to run.", error="invalid_input")
    return args["command"]


async def _tool_bash(box: Toolbox, args: dict, tool_use_id: str, confine: Confine) -> ToolResult:
    command = _command(args)
    timeout_ms = args.get("timeout", BASH_DEFAULT_TIMEOUT_MS)
    capped = timeout_ms > BASH_MAX_TIMEOUT_MS
    timeout_ms = min(timeout_ms, BASH_MAX_TIMEOUT_MS)
    workdir = _existing(box.workspace, args.get("workdir"))
    spool = _Spool(box.spill_dir, tool_use_id or "bash")
    live_path = box.live_output_path(tool_use_id or "bash")
    live = _open_live_output(live_path)

    def on_text(text: str) -> None:
        spool.add(text)
        if live is not None and spool.total <= SPILL_FILE_CAP_BYTES:
            with contextlib.suppress(OSError):
                os.write(live, text.encode("utf-8", "replace"))
        box.emit("ToolOutput", tool_use_id=tool_use_id, text=text)

    started = time.monotonic()
    try:
        child = await _start(box, command, confine, workdir)
        ticks = {"started_ticks": child.proc.ticks} if child.proc.ticks else {}
        box.emit("CommandStarted", tool_use_id=tool_use_id, pid=child.pid, **ticks)
        timed_out, stray = await _supervise(
            box, child, confine, command, on_text, timeout_ms / 1000, STRAY_GRACE_S)
    except asyncio.CancelledError:
        box.stopped[tool_use_id] = spool.finish({}).rstrip("\n")
        raise
    finally:
        if live is not None:
            os.close(live)
            live_path.unlink(missing_ok=True)
    exit_code = child.proc.returncode
    duration_ms = int((time.monotonic() - started) * 1000)
    meta = {"exit_code": exit_code, "duration_ms": duration_ms, "timed_out": timed_out}
    output = spool.finish(meta).rstrip("\n") or "(no output)"
    parts = [output, ""]
    if timed_out:
        parts.append(
            f"Timed out after {timeout_ms / 1000:g} s: "
            "the command and every process it started were killed. "
            "For servers, watchers or long builds use process (action \"start\") "
            "and poll it with process (action \"read\"); "
            f"for a slow command pass a larger timeout, in ms (max {BASH_MAX_TIMEOUT_MS}).")
    elif exit_code < 0:
        parts.append(f"Exit code: {exit_code} (killed by {_signal_name(-exit_code)})")
    else:
        parts.append(f"Exit code: {exit_code}")
    if stray:
        parts.append(
            "Note: processes it left running in the background were stopped; "
            "use the process tool for long-running work.")
    refused = None
    if box.sandboxed and exit_code != 0:
        ws = box.workspace
        refused = sandbox.explain(
            output, confine, workdir, ws.cwd, ws.temp_dir, Path.home(), ws.home, box.asks_nobody)
    if refused:
        meta["sandbox_refused"] = True
        parts.append(refused)
    if capped:
        parts.append(f"(timeout capped at the {BASH_MAX_TIMEOUT_MS} ms ceiling)")
    return ToolResult("\n".join(parts), is_error=timed_out, meta=meta)


async def _watch_temp(temp: Path, pid: int) -> None:
    """Stop a read-only command's group once the session temp dir passes its cap (RLIMIT_FSIZE
    bounds one file only)."""
    while await asyncio.to_thread(_tree_bytes, temp) <= sandbox.TEMP_DIR_CAP:
        await asyncio.sleep(0.5)
    _kill_group(pid)


def _tree_bytes(root: Path) -> int:
    """Disk blocks in use under `root`, in bytes (a sparse file counts what it holds)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total


async def _start(box: Toolbox, command: str, confine: Confine, cwd: Path | None = None,
                 stdin: bool = False) -> Child:
    """Start a command for bash or process: its group is now in box.groups, and for an approved
    step, the guarded files as they were before it in child.guarded."""
    ws = box.workspace
    guarded = None
    links = ()
    if confine.write:
        links = await asyncio.to_thread(gitlinks, ws)
        guarded = await asyncio.to_thread(guard_record, ws.cwd, links)

    def ports() -> set[int]:
        """Without network, a command may still connect to what khaelor's own processes listen on:
        the ports are looked up when it connects (the supervisor runs in a thread: a copy)."""
        if confine.network:
            return set()
        return sandbox.listening_ports(set(box.groups))
    child = await ws.exec(command, cwd=cwd, stdin=stdin, confine=confine, ports=ports)
    box.groups.add(child.pid)
    child.guarded = guarded
    child.gitlinks = links
    return child

# ---------------------------------------------------------------- process: background processes


@dataclass
class _Process:
    """A background process and its output: the newest PROCESS_BUFFER_CHARS characters, and how far
    the model has read them."""
    # "p1", "p2", … per session.
    process_id: str
    command: str
    child: Child
    confine: Confine
    started: float = field(default_factory=time.monotonic)
    # time.monotonic() when it exited; None while running.
    ended: float | None = None
    # Why we stopped it ("stopped", "khaelor exit"); None: it exited by itself.
    cause: str | None = None
    # {"typed": the line}: `/processes stop ID` stops it, and its ProcessExited shows that line
    typed: dict = field(default_factory=dict)
    watcher: asyncio.Task | None = None
    text: str = ""
    # Absolute position of text[0] in everything it ever wrote.
    base: int = 0
    # Absolute position up to which the model has read.
    read_pos: int = 0
    # Set by new output and by the exit.
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    # Where its output is appended as it comes (Toolbox.live_output_path), so that a kill -9
    # of khaelor loses none of it; live is None: the spill folder could not take it.
    live_path: Path | None = None
    live: int | None = None
    # Characters in that file: past twice the buffer, it is written again as the buffer.
    live_chars: int = 0

    def append(self, text: str) -> None:
        self.text += text
        if len(self.text) > PROCESS_BUFFER_CHARS:
            drop = len(self.text) - PROCESS_BUFFER_CHARS
            self.text = self.text[drop:]
            self.base += drop
        self.keep_live(text)
        self.arrived.set()

    def keep_live(self, text: str) -> None:
        """The newest output in the live file too; a server that runs for days keeps its tail,
        never more than 2 × PROCESS_BUFFER_CHARS of it."""
        if self.live is None:
            return
        if self.live_chars + len(text) > 2 * PROCESS_BUFFER_CHARS:
            text, self.live_chars = self.text, 0
            with contextlib.suppress(OSError):
                os.ftruncate(self.live, 0)
                os.lseek(self.live, 0, os.SEEK_SET)
        self.live_chars += len(text)
        with contextlib.suppress(OSError):
            os.write(self.live, text.encode("utf-8", "replace"))

    def take(self) -> tuple[int, str]:
        """(characters dropped unread, the new output) since the last take."""
        start = max(self.read_pos, self.base)
        dropped = start - self.read_pos
        new = self.text[start - self.base:]
        self.read_pos = self.base + len(self.text)
        self.arrived.clear()
        return dropped, new

    def runtime_s(self) -> float:
        return round((self.ended or time.monotonic()) - self.started, 1)

    def status(self) -> str:
        code = self.child.proc.returncode
        if self.ended is None:
            return "running"
        if self.cause:
            return f"{self.cause} (exit code {code})"
        return f"exited (code {code})"


class _Processes:
    """The session's background processes. Their watchers are tasks of their own, so an interrupted
    turn leaves them running; close() stops them all."""

    def __init__(self, box: "Toolbox"):
        # its workspace, process groups, masking, spill folder, events and the log's fold (the
        # newest process number: ProcessStarted)
        self.box = box
        self.items: dict[str, _Process] = {}
        self.closed = False

    def live(self) -> list[_Process]:
        return [p for p in self.items.values() if p.ended is None]

    async def start(self, command: str, confine: Confine, tool_use_id: str) -> _Process:
        if self.closed:
            raise ToolError("khaelor is shutting down; no new processes.", error="closed")
        live = self.live()
        if len(live) >= PROCESS_LIVE_CAP:
            ids = ", ".join(p.process_id for p in live)
            raise ToolError(
                f"{len(live)} processes are already running ({ids}), "
                f"the limit is {PROCESS_LIVE_CAP}. "
                "Stop one you no longer need with process action \"stop\" first.",
                error="too_many")
        # Shielded: if the turn is cancelled mid-spawn, the process still gets registered (and so
        # stopped later).
        return await asyncio.shield(self._spawn(command, confine, tool_use_id))

    async def _spawn(self, command: str, confine: Confine, tool_use_id: str) -> _Process:
        box = self.box
        child = await _start(box, command, confine, stdin=True)
        process = _Process(f"p{box.state().n_processes + 1}", command, child, confine)
        # (no await before the watcher starts: the file is open before the first output)
        process.live_path = box.live_output_path(tool_use_id, process.process_id)
        process.live = _open_live_output(process.live_path)
        self.items[process.process_id] = process
        process.watcher = asyncio.create_task(
            self._watch(process), name=f"khaelor process {process.process_id}")
        ticks = child.proc.ticks
        box.emit("ProcessStarted", process_id=process.process_id, pid=child.pid, command=command,
                 tool_use_id=tool_use_id, **({"started_ticks": ticks} if ticks else {}))
        self.forget_exited()
        return process

    def forget_exited(self) -> None:
        """Keep the table small: beyond 4 × PROCESS_LIVE_CAP entries, the oldest exited ones go."""
        exited = [key for key, p in self.items.items() if p.ended is not None]
        n_extra = max(0, len(self.items) - 4 * PROCESS_LIVE_CAP)
        for key in exited[:n_extra]:
            del self.items[key]

    async def _watch(self, process: _Process) -> None:
        """Collect output until the process exits, clear out its group, report ProcessExited once.
        """
        box = self.box
        try:
            await _supervise(box, process.child, process.confine, process.command,
                             process.append, None, PROCESS_STRAY_GRACE_S)
        except asyncio.CancelledError:
            # The event loop is closing without close(): still no orphans.
            process.cause = process.cause or "khaelor exit"
            raise
        finally:
            process.ended = time.monotonic()
            process.arrived.set()
            box.emit("ProcessExited", process_id=process.process_id,
                     exit_code=process.child.proc.returncode, cause=process.cause or "exited",
                     **process.typed)
            # its end is in the log: the file was only for a kill -9 before it
            if process.live is not None:
                os.close(process.live)
                process.live = None
                process.live_path.unlink(missing_ok=True)

    async def stop(self, process: _Process, cause: str) -> None:
        """SIGTERM to the whole group, SIGKILL after a grace period."""
        if process.ended is not None:
            return
        process.cause = cause
        _kill_group(process.child.pid, signal.SIGTERM)
        await asyncio.wait({process.watcher}, timeout=PROCESS_STOP_GRACE_S)
        if not process.watcher.done():
            _kill_group(process.child.pid, signal.SIGKILL)
            await asyncio.wait({process.watcher}, timeout=2.0)

    async def close(self) -> None:
        self.closed = True
        await asyncio.gather(*(self.stop(p, "khaelor exit") for p in self.live()))

    async def write(self, process: _Process, text: str) -> str:
        name = process.process_id
        if process.ended is not None:
            raise ToolError(
                f"{name} has {process.status()}; it takes no more input.",
                error="exited")
        try:
            process.child.stdin.write(text.encode("utf-8"))
            await asyncio.wait_for(process.child.stdin.drain(), 5.0)
        except (BrokenPipeError, ConnectionResetError):
            raise ToolError(f"{name} closed its stdin.", error="stdin_closed") from None
        except TimeoutError:
            raise ToolError(
                f"{name} is not reading its stdin (write timed out after 5 s).",
                error="stdin_blocked") from None
        return f"Wrote {events.counted(len(text), 'character')} to {name}."

    async def settle(self, process: _Process, timeout_s: float) -> None:
        """Wait briefly for output (or exit), then a moment more so a burst arrives whole."""
        all_read = process.base + len(process.text) == process.read_pos
        if all_read and process.ended is None:
            try:
                await asyncio.wait_for(process.arrived.wait(), timeout_s)
            except TimeoutError:
                return
        if process.ended is None:
            await asyncio.sleep(0.1)


async def _tool_process(box: Toolbox, args: dict, tool_use_id: str, confine: Confine) -> ToolResult:
    action = args["action"]
    procs = box.processes

    def needs(key: str, what: str) -> str:
        if key not in args:
            raise ToolError(
                f"process action \"{action}\" needs '{key}' ({what}). "
                "Call process again with it.",
                error="invalid_input")
        return args[key]

    if action == "list":
        return _process_list(procs)
    lines = []
    if action == "start":
        needs("command", "the shell command to start")
        process = await procs.start(_command(args), confine, tool_use_id)
        lines.append(f"Started {process.process_id}. Poll it with process action \"read\", "
                     f"id \"{process.process_id}\".")
    else:
        process_id = needs("id", "the process id, e.g. \"p1\"")
        process = procs.items.get(process_id)
        lost = box.state().lost_output.get(process_id)
        if process is None and lost is not None:
            # started before a khaelor that was killed (repair kept what it had printed)
            text = (f"{process_id} was lost when khaelor exited while it ran; it is not running "
                    f"now (start it again if it is needed). Its output until then:\n{lost}")
            return ToolResult(text, meta={"process_id": process_id, "status": "lost"})
        if process is None:
            known = ", ".join(procs.items) or "none yet"
            raise ToolError(
                f"No process with id {_quoted(args['id'])} (known: {known}). "
                "Use process action \"list\".",
                error="unknown_process")
    if action == "write":
        lines.append(await procs.write(process, needs("input", "the text to send")))
    if action == "stop":
        await procs.stop(process, "stopped")
    elif action == "read":
        await procs.settle(process, 1.0)
    else:
        await procs.settle(process, PROCESS_SETTLE_S)
    dropped, new = process.take()
    lines.append(f"[{process.process_id} · {process.status()} · pid {process.child.pid} · "
                 f"{process.runtime_s():g} s] {process.command}")
    if dropped:
        lines.append(f"[… {dropped:,} earlier characters were dropped "
                     "from the buffer before you read them …]")
    lines.append(new.rstrip("\n") if new.strip() else "(no new output)")
    meta = {"process_id": process.process_id, "pid": process.child.pid,
            "status": process.status(), "exit_code": process.child.proc.returncode}
    if process.cause:
        # khaelor stopped it: its code answers our signal (-15), no failure of its own (✗ exit -15)
        meta["exit_code"] = None
    return ToolResult("\n".join(lines), meta=meta)


def _process_list(procs: _Processes) -> ToolResult:
    rows = [f"{p.process_id}  {p.status()}  pid {p.child.pid}  {p.runtime_s():g} s  {p.command}"
            for p in procs.items.values()]
    if not rows:
        text = "No background processes. Start one with process action \"start\"."
        return ToolResult(text, meta={"count": 0})
    meta = {"count": len(rows), "running": len(procs.live())}
    return ToolResult("\n".join(rows), meta=meta)


TOOLS = {"read": _tool_read, "write": _tool_write, "edit": _tool_edit, "grep": _tool_grep,
         "glob": _tool_glob, "bash": _tool_bash, "process": _tool_process}
