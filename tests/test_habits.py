"""Issue 22: a Claude Code user's daily habits, through the interactive controller (no terminal)
and, where only the real program proves it, the real program against the fake API."""
import json
from pathlib import Path

import pytest

import ui
from fake_api import reply, text, tool_use
from test_claude_parity import in_session


# ---------------------------------------------------------------- item 8: models by name

def test_model_names_resolve_alike_in_slash_model_and_the_flag(project, env, monkeypatch):
    async def choose(session):
        listing = await session.cmd_model("")
        refused = await session.cmd_model("claude-opus-5-5 extra")
        kept = session.kernel.ctx.model
        chosen = await session.cmd_model("opus")
        return listing, refused, kept, chosen, session.kernel.ctx.model, session.command_choices
    listing, refused, kept, chosen, now, choices = in_session(project, env, monkeypatch, choose)
    assert "`opus` (claude-opus-5-5)" in listing and "pick" in listing
    assert refused.startswith("unknown model `claude-opus-5-5 extra`")
    assert kept == "claude-sonnet-5-5"
    assert now == "claude-opus-5-5" and "claude-opus-5-5" in chosen
    assert choices["/model"][:3] == ["opus", "sonnet", "haiku"]
    haiku = in_session(project, env, monkeypatch, lambda s: _model_of(s), argv=["--model", "haiku"])
    assert haiku == "claude-haiku-5-5"


async def _model_of(session):
    return session.kernel.ctx.model


def test_config_names_models_as_the_flag_does(project, env, monkeypatch):
    """config.json's "model": "opus" reached the API as the model "opus" (a 404 mid-task)."""
    from pathlib import Path
    home = Path(env["KHAELOR_HOME"])
    home.mkdir(exist_ok=True)
    (home / "config.json").write_text('{"model": "opus", "aux_model": "haiku"}')

    async def models(session):
        return session.kernel.ctx.model, session.kernel.ctx.aux_model
    assert in_session(project, env, monkeypatch, models) == ("claude-opus-5-5", "claude-haiku-5-5")


def test_the_model_flag_takes_a_name_and_refuses_what_slash_model_refuses(khaelor, fake):
    fake.enqueue(reply(text("hi")))
    result = khaelor.run("-p", "hi", "--model", "sonnet", "--output-format", "json")
    assert result.returncode == 0, result.stderr
    assert fake.requests[-1]["body"]["model"] == "claude-sonnet-5-5"
    refused = khaelor.run("-p", "hi", "--model", "claude-opus-5-5-extra")
    assert refused.returncode == 2 and "unknown model `claude-opus-5-5-extra`" in refused.stderr
    assert json.loads(result.stdout)["is_error"] is False


# ---------------------------------------------------------------- item 10: Claude Code's habits

def test_exit_init_permissions_status_and_export(project, env, monkeypatch, tmp_path):
    (project / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (project / "src").mkdir()

    async def habits(session):
        session.begin()
        session.bus.emit("UserMessageCreated", text="fix the parser")
        await session.toolbox.run("process", {"action": "start", "command": "sleep 5 # *a* __b__"},
                                  "p1")
        shown = {name: await session.run_command(name) for name in
                 ("/exit", "/init", "/permissions", "/status", "/processes")}
        shown["/init write"] = await session.run_command("/init write")
        shown["/init again"] = await session.run_command("/init")
        shown["/export"] = await session.run_command(f"/export {tmp_path / 'out.md'}")
        return shown
    shown = in_session(project, env, monkeypatch, habits)
    assert shown["/exit"] is ui.QUIT
    assert "`/init write` saves this as `KHAELOR.md`" in shown["/init"]
    assert "- `src/`" in shown["/init"] and "-m pytest -q`" in shown["/init"]
    written = (project / "KHAELOR.md").read_text()
    assert written.startswith(f"# {project.name}") and "## Checks" in written
    assert "exists already" in shown["/init again"]
    assert "layer: user" in shown["/permissions"] and "boundary:" in shown["/permissions"]
    assert "- model: claude-sonnet-5-5" in shown["/status"] and "- version: " in shown["/status"]
    # as code: markdown would take the stars and underscores for emphasis
    assert f"- project: `{project}`" in shown["/status"]
    assert "· `sleep 5 # *a* __b__` ·" in shown["/processes"]
    assert "## You\n\nfix the parser" in (tmp_path / "out.md").read_text()


@pytest.mark.parametrize("width", [40, 60, 100])
def test_slash_permissions_wraps_at_words_live_and_replayed_in_colour_or_not(project, env,
                                                                           monkeypatch, width):
    """QA: /permissions showed its report as a code block, whose long lines the terminal broke
    anywhere at 40 or 60 columns ("enforced  file" / "s: reads from"). A line an item: each wraps
    at its words under its bullet (only a word longer than a line is broken), every character
    as written (a rule's `*`, `_` and backquotes are not markup), live and replayed."""
    import re

    import khaelor
    from test_sessions import live_and_replayed
    (project / ".khaelor").mkdir()
    rules = {"deny": ["Read(./secrets/**)", "Read(./a`b*c_d_`)"], "allow": ["Bash(npm run t:*)"]}
    (project / ".khaelor" / "config.json").write_text(json.dumps({"permissions": rules}))

    async def script(session):
        report = khaelor.policy_report(session.read_layers(), session.kernel.rules)
        return report, await live_and_replayed(session, ["/rename t", "/permissions"], width)
    report, (shown, replayed, log) = in_session(project, env, monkeypatch, script)
    assert replayed == shown, shown
    lines = [" ".join(line.split()) for line in report]
    for rule in ("59 deny file.read secrets/** ", "60 deny file.read a`b*c_d_` "):
        assert any(line.startswith(rule) for line in lines), lines
    assert_wrapped_at_words(shown.split("› /permissions\n")[1].splitlines(), lines, width)
    coloured = ui.render_transcript(log, width, color=True)
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", row) for row in coloured]
    assert_wrapped_at_words(plain[plain.index("› /permissions") + 1:], lines, width)


def assert_wrapped_at_words(rows: list, lines: list, width: int) -> None:
    """`rows` show `lines`, one bulleted item each, in `width` columns, broken only at a space
    or inside a word too long for a line."""
    items = []
    for row in rows:
        assert len(row) <= width and row.startswith(("• ", "  ")), row
        if row.startswith("• "):
            items.append([])
        items[-1].append(row[2:])
    assert len(items) == len(lines), items
    for item, line in zip(items, lines):
        at = 0
        for row in item:
            assert line.startswith(row, at), (row, line)
            at += len(row)
            if at < len(line) and line[at] == " ":
                at += 1
            elif at < len(line):
                word = line[:at].split(" ")[-1] + line[at:].split(" ")[0]
                assert len(word) > width - 2, (row, line)
        assert at == len(line), (item, line)


def test_slash_enter_opens_the_menu_and_question_mark_shows_the_keys():
    from test_ui import COLOR, FakeController, K, app_screen, text_of
    ctrl = FakeController()
    app = ui.App(ctrl, style=COLOR, width=80, height=30)
    screen, stream = app_screen(app)
    app.on_key(K("text", "/"))
    app.composer.close_menu()
    app.on_key(K("enter"))
    assert ctrl.calls == [] and app.composer.text == "/" and app.composer.menu
    app.composer.clear()
    app.on_key(K("text", "?"))
    stream.feed(app.render(1.0))
    assert "Esc" in text_of(screen) and "Ctrl-O" in text_of(screen) and app.composer.text == ""


def test_the_keys_shown_by_question_mark_include_shift_tab():
    """README: `?` shows the keys, and Shift-Tab cycles default → accept edits → plan. The list
    (also /help's and --help's) left Shift-Tab out: the one way into plan mode went unsaid."""
    from test_ui import COLOR, FakeController, K, app_screen, text_of
    app = ui.App(FakeController(), style=COLOR, width=100, height=40)
    screen, stream = app_screen(app)
    app.on_key(K("text", "?"))
    stream.feed(app.render(1.0))
    assert "Shift-Tab" in text_of(screen) and "plan" in text_of(screen), text_of(screen)


# ---------------------------------------------------------------- item 14: one message per event

def test_an_api_error_shows_once_and_internal_words_never_reach_the_user():
    from test_ui import event, timeline_text
    broke = "the connection closed mid-stream"
    shown = timeline_text([
        event("ModelRequestFailed", kind="retryable", status=200, message=broke, retrying=False),
        event("TaskFailed", reason=broke),
        event("ToolRequested", tool_use_id="p", name="process",
              input={"action": "start", "command": "npm run dev"}),
        event("ToolStarted", tool_use_id="p", name="process"),
        event("ToolCompleted", tool_use_id="p", name="process", meta={"process_id": "p1"},
              output='Started p1. Poll it with process action "read", id "p1".\n'
                     "[p1 · running · pid 7 · 1 s] npm run dev\nlistening on 3000"),
    ])
    assert shown.count(broke) == 1 and "(200)" not in shown
    assert "Poll it with" not in shown and "listening on 3000" in shown


def test_model_rename_and_compact_confirm_once(project, env, monkeypatch):
    from test_ui import timeline_text

    async def confirm(session):
        session.begin()
        said = [await session.cmd_model("haiku"), await session.cmd_rename("parser work")]
        return said, list(session.store.events)
    said, log = in_session(project, env, monkeypatch, confirm)
    assert said == ["", ""]
    shown = timeline_text(log)
    assert shown.count("◇ Model: claude-haiku-5-5") == 1 and shown.count("parser work") == 1


# ---------------------------------------------------------------- item 13: @file attaches the file

def test_a_mentioned_file_and_folder_go_with_the_message_but_no_secret(khaelor, fake, project):
    (project / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (project / "src").mkdir()
    (project / "src" / "app.py").write_text("print('hi')\n")
    (project / ".env").write_text("TOKEN=attach-me-never\n")
    fake.enqueue(reply(text("seen")))
    result = khaelor.run("-p", "explain @calc.py, see @src/ and @.env")
    assert result.returncode == 0, result.stderr
    sent = json.dumps(fake.requests[-1]["body"]["messages"][0])
    assert "<attached-file path=\\\"calc.py\\\">" in sent and "return a + b" in sent
    assert "app.py" in sent and "attach-me-never" not in sent
    created = [e for e in khaelor.log() if e["type"] == "UserMessageCreated"][0]
    # the screen shows what was typed
    assert created["text"] == "explain @calc.py, see @src/ and @.env"


def test_a_mention_not_attached_is_said_with_why_on_screen_and_headless(khaelor, fake, project,
                                                                       env, monkeypatch):
    """@.env (reading it asks) and @nosuch.txt were dropped silently; "⎿ attached" named only the
    others. Each one left out is now named, with why, in the UI and on -p's stderr."""
    from test_ui import event, timeline_text
    (project / "calc.py").write_text("x = 1\n")
    (project / ".env").write_text("TOKEN=attach-me-never\n")
    (project / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    typed = "see @calc.py @.env @nosuch.txt @logo.png"
    fake.enqueue(reply(text("seen")))
    result = khaelor.run("-p", typed)
    assert result.returncode == 0, result.stderr
    assert "@.env not attached: reading it asks; the model can read it with its tools" in result.stderr
    assert "@nosuch.txt not attached: no such file or folder" in result.stderr
    assert "@logo.png not attached: a binary file" in result.stderr
    # and the model is told too, or it would take the mention for a file it was shown
    sent = fake.requests[-1]["body"]["messages"][-1]["content"][0]["text"]
    assert '<not-attached path=".env">reading it asks' in sent and "attach-me-never" not in sent
    assert '<not-attached path="nosuch.txt">no such file or folder</not-attached>' in sent
    assert '<not-attached path="logo.png">a binary file' in sent

    async def attach(session):
        return session.kernel.attachments(typed)
    made = in_session(project, env, monkeypatch, attach)
    assert [name for name, _ in made["skipped"]] == [".env", "nosuch.txt", "logo.png"]
    shown = timeline_text([event("UserMessageCreated", text=typed, **made)])
    assert "⎿ attached calc.py" in shown
    assert "⎿ not attached @.env: reading it asks" in shown
    assert "⎿ not attached @nosuch.txt: no such file or folder" in shown


def test_an_at_sign_before_punctuation_alone_attaches_nothing(project, env, monkeypatch):
    """"wait @..." names no file: the punctuation stripped, nothing is left (it attached the
    project's listing as path="")."""
    (project / "calc.py").write_text("x = 1\n")

    async def attach(session):
        return [session.kernel.attachments(text) for text in ("wait @...", "hm @?", "@calc.py)")]
    dots, question, named = in_session(project, env, monkeypatch, attach)
    assert dots == {} and question == {}
    assert named["attachments"][0].startswith('<attached-file path="calc.py">')


def test_a_file_mentioned_twice_is_attached_once_and_takes_one_place(project, env, monkeypatch):
    """"@calc.py … @calc.py." attached the file twice, and five mentions of one file left no place
    for a sixth, different one."""
    (project / "calc.py").write_text("x = 1\n")
    (project / "notes.md").write_text("y\n")

    async def attach(session):
        return session.kernel.attachments("@calc.py vs @calc.py. " * 3 + "and @notes.md")
    attached = in_session(project, env, monkeypatch, attach)["attachments"]
    assert [item.split('"')[1] for item in attached] == ["calc.py", "notes.md"]


def test_a_path_with_spaces_is_attached_as_the_composer_completes_it(project, env, monkeypatch):
    """The @ menu completes a name with a space as @"my notes.md"; the kernel read `"my` and
    attached nothing, and /context's pruning did not know it was attached."""
    import events
    (project / "my notes.md").write_text("the notes\n")

    async def attach(session):
        return session.kernel.attachments('compare @"my notes.md", please')
    attached = in_session(project, env, monkeypatch, attach)["attachments"]
    assert [item.split('"')[1] for item in attached] == ["my notes.md"]
    assert events.mentions('@"my notes.md" and @a.py, @""') == ["my notes.md", "a.py"]


def test_a_mentioned_file_counts_as_read_so_the_model_can_edit_it_at_once(khaelor, fake, project):
    """As Claude Code: the attachment is the read, no round trip to read it again before an edit."""
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    fix = tool_use("edit", {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"})
    # (the verification gate may ask for a check once or twice: the model answers the same)
    fake.enqueue(reply(fix), *[reply(text("fixed"))] * 3)
    result = khaelor.run("-p", "fix @calc.py", "--yes")
    assert result.returncode == 0, result.stderr
    assert (project / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    created = [e for e in khaelor.log() if e["type"] == "UserMessageCreated"][0]
    assert created["seen"] and created["seen"][0][0].endswith("calc.py")


def test_the_message_says_what_was_attached_and_counts_one_more_line():
    from test_ui import event, timeline_text
    rows = "\n".join(f"row {k}" for k in range(ui.USER_MESSAGE_MAX_LINES + 1))
    attached = '<attached-file path="calc.py">\n1\tx\n</attached-file>'
    shown = timeline_text([event("UserMessageCreated", text=rows, attachments=[attached])])
    assert "⎿ attached calc.py" in shown
    assert "… 1 more line" in shown and "1 more lines" not in shown


# ---------------------------------------------------------------- item 16: small things

def test_a_pasted_200_lines_says_200():
    composer = ui.Composer()
    composer.handle(ui.Key("paste", "".join(f"line {k}\n" for k in range(200))))
    assert composer.text == "[Pasted 200 lines]"


def test_help_lists_the_commands_in_columns(project, env, monkeypatch):
    async def show(session):
        return await session.cmd_help("")
    shown = in_session(project, env, monkeypatch, show)
    for width in (60, 100):
        timeline = ui.Timeline(ui.Style(False), width)
        timeline.note(shown)
        settled = timeline.take_settled()
        for command, does in (("/compact", "summarise"), ("/effort", "how")):
            rows = [row for row in settled if command in row]
            assert rows and does in rows[0], rows      # the command and what it does, side by side


def test_permissions_lists_your_rules_first_marks_missing_files_and_speaks_json(khaelor, env):
    from pathlib import Path
    config = Path(env["KHAELOR_HOME"]) / "config.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({"permissions": [
        {"capability": "process.execute", "pattern": "make *", "action": "allow"}]}))
    listing = khaelor.run("permissions").stdout.splitlines()
    rules = [line for line in listing if line[:3].strip().isdigit()]
    assert "make *" in rules[0] and str(config) in rules[0] and "default" in rules[1]
    assert any(line.endswith("(no such file)") for line in listing if line.startswith("layer:"))
    data = json.loads(khaelor.run("permissions", "--json").stdout)
    mine = {"kind": "user", "source": str(config), "trusted": True, "exists": True}
    assert mine in data["layers"]
    assert any(rule["pattern"] == "make *" and rule["layer"] == "user" for rule in data["rules"])


def test_the_welcome_line_and_the_farewell_say_what_runs_and_how_to_come_back(project, env,
                                                                              monkeypatch):
    import khaelor as cli

    async def lines(session):
        session.begin()
        session.bus.emit("ModelResponseCompleted", message_id="msg_1", stop_reason="end_turn",
                         model="claude-sonnet-5-5",
                         usage={"input_tokens": 1000, "output_tokens": 100, "cache_read_tokens": 0,
                                "cache_write_tokens": 0})
        farewell = cli.farewell_line(session.store, {})
        return cli.welcome_line(session), farewell, session.store.session_id
    welcome, farewell, session_id = in_session(project, env, monkeypatch, lines)
    assert welcome.startswith(f"khaelor {cli.VERSION} · {project} · claude-sonnet-5-5 · ")
    assert "sandbox" in welcome
    assert farewell == f"session {session_id} · $0.00 · continue it with `khaelor -c`"


def test_a_resumed_sessions_welcome_line_names_the_model_it_was_shown_with_live(
        khaelor, fake, project, env, monkeypatch):
    """QA: `khaelor -c` printed its welcome line with the model that runs now (`/model opus`
    chosen in the session, or `--model opus` given to -c) where the live screen had shown the one
    the session began on: the replay then differed from what was on the screen."""
    import khaelor as cli
    fake.enqueue(reply(text("hi")))
    assert khaelor.run("-p", "hi", "--model", "haiku").returncode == 0
    home = Path(env["KHAELOR_HOME"])
    for argv in (["-c"], ["-c", "--model", "opus"]):
        args = cli.parse_args(argv)
        settings = cli.load_settings(args, home, project)
        session = cli.Session(args, settings, home, project)
        session.store = cli.open_session(args, home, project)
        try:
            assert " · claude-haiku-5-5 · " in cli.welcome_line(session), argv
        finally:
            session.store.close()


def test_permissions_aligns_the_ignored_rules_with_the_rules(khaelor, project):
    settings = project / ".claude" / "settings.json"
    settings.parent.mkdir()
    rules = {"allow": ["Bash(npm test:*)", "WebFetch(domain:x.com)"], "deny": ["Read(.env)"]}
    settings.write_text(json.dumps({"permissions": rules}))
    listing = khaelor.run("permissions").stdout.splitlines()
    denied = [line for line in listing if line[:3].strip().isdigit() and str(settings) in line]
    ignored = [line for line in listing if line.startswith("  -  ")]
    assert len(denied) == 1 and len(ignored) == 4, listing      # npm test: 3 command capabilities
    column = denied[0].index(str(settings))
    assert {line.index(str(settings)) for line in denied + ignored} == {column}
    assert all("(ignored: " in line for line in ignored)
    assert "no web tool" in ignored[-1] and "`khaelor trust`" in ignored[0]


def test_a_connection_error_names_the_address():
    import anthropic
    import httpx2
    import model
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/messages")
    error = model.classify(anthropic.APIConnectionError(request=request))
    assert error.kind == "retryable"
    assert "cannot reach the API at http://127.0.0.1:9/v1/messages" in str(error)


def test_the_start_warning_counts_the_rules_as_written(project, env, monkeypatch):
    from pathlib import Path

    import khaelor as cli
    import permissions
    monkeypatch.setenv("HOME", env["HOME"])
    settings = project / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"permissions": {"allow": ["Bash(npm test:*)", "Edit(src/**)"]}}))
    notice = permissions.trust_notice(cli.permission_layers(Path(env["KHAELOR_HOME"]), project))
    assert notice.startswith(f"{settings} would grant 2 permissions;"), notice


def test_rewind_with_a_digit_that_is_no_number_lists_the_steps(project, env, monkeypatch):
    """"/rewind ²": str.isdigit() took the superscript for a step number and int() then raised
    (the UI said "The command failed: invalid literal for int()")."""
    async def rewind(session):
        return await session.run_command("/rewind ²")
    assert in_session(project, env, monkeypatch, rewind) == "no steps that changed the work tree yet"


def test_rewind_to_a_step_in_a_session_with_none_says_it_has_none(project, env, monkeypatch):
    """QA: "/rewind 5" in a session with no steps said "no step 5: the steps are 1 to 0"."""
    async def rewind(session):
        return await session.run_command("/rewind 5")
    assert in_session(project, env, monkeypatch, rewind) == "no step 5 (this session has 0)"


def test_export_to_the_clipboard_counts_in_the_singular(project, env, monkeypatch, capsys):
    """QA: /export clipboard in a new session said "sent the transcript (1 characters)". (A new
    session has nothing to export now; the count is said as every count is.)"""
    import events

    async def export(session):
        session.bus.emit("UserMessageCreated", text="hi")
        return await session.run_command("/export clipboard")
    assert "(11 characters) to the clipboard" in in_session(project, env, monkeypatch, export)
    assert "\x1b]52;c;" in capsys.readouterr().out
    assert events.counted(1, "character") == "1 character"


def test_a_title_typed_over_two_lines_is_one_line_in_every_listing(project, env, monkeypatch):
    """"/rename first\\nsecond" kept the line break: `khaelor sessions` printed the row in two,
    and /sessions' list item broke. The title is one line, as a title taken from the first
    message is."""
    async def rename(session):
        await session.run_command("/rename  parser\n  work\tlog ")
        session.bus.emit("UserMessageCreated", text="fix the parser")
        return session.store.state.title, await session.cmd_sessions("")
    title, listed = in_session(project, env, monkeypatch, rename)
    assert title == "parser work log" and "parser work log ·" in listed
