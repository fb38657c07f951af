"""A Claude Code user's files and scripts, unchanged: CLAUDE.md's @path imports (cycles, missing files
and symlinks out reported, never fatal), ~/.claude/CLAUDE.md and CLAUDE.local.md, custom slash commands
(.claude/commands/ and friends, headless and interactive), the headless flags (--allowedTools,
--disallowedTools, --permission-mode, --append-system-prompt) and the result JSON a CI script reads.
The examples are Claude Code's own documentation examples (memory and slash-command pages)."""
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import context
import khaelor as cli
import permissions
import sandbox
from fake_api import reply, text, tool_use

ROOT = Path(__file__).resolve().parent.parent


def load(tmp_path, project, cwd=None):
    """(system prompt's project tier, /context notes) for a project, with HOME and KHAELOR_HOME in tmp."""
    ctx = context.Context(project_root=project, cwd=cwd or project, home=tmp_path / "khaelor-home",
                          model="claude-sonnet-5-5", tool_schemas=[], user_home=tmp_path / "user-home",
                          is_secret=sandbox.is_secret_name)
    return ctx.system[2]["text"], ctx.instruction_notes, ctx


def write(path: Path, content: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return path


# ---------------------------------------------------------------- instruction files and @imports

def test_the_documented_imports_are_read_relative_to_the_file_and_from_home(tmp_path, project):
    # Claude Code's memory docs, verbatim examples
    write(project / "CLAUDE.md", "See @README for project overview and @package.json for available npm commands "
                                 "for this project.\n\n# Additional Instructions\n- git workflow "
                                 "@docs/git-instructions.md\n\n# Individual Preferences\n"
                                 "- @~/.claude/my-project-instructions.md\n")
    write(project / "README", "README-TEXT: the overview\n")
    write(project / "package.json", '{"scripts": {"test": "NPM-TEST-SCRIPT"}, "devDependencies": {"@types/node": "1"}}')
    write(project / "docs" / "git-instructions.md", "GIT-RULES: rebase, never merge. See @../README again.\n")
    write(tmp_path / "user-home" / ".claude" / "my-project-instructions.md", "MY-PREFS: tabs\n")
    tier, notes, ctx = load(tmp_path, project)
    for marker in ("README-TEXT", "NPM-TEST-SCRIPT", "GIT-RULES", "MY-PREFS"):
        assert tier.count(marker) == 1, marker
    assert tier.index("See @README") < tier.index("README-TEXT") < tier.index("MY-PREFS")
    assert f"imported by {project / 'CLAUDE.md'}" in tier
    assert notes == []       # README imported twice is read once; @types/node in JSON is not an import
    assert [item.imported_by for item in ctx.instructions][:2] == [None, project / "CLAUDE.md"]


def test_imports_go_five_hops_deep_and_no_further(tmp_path, project):
    write(project / "CLAUDE.md", "start @d1.md\n")
    for depth in range(1, 8):
        write(project / f"d{depth}.md", f"DEPTH-{depth} next @d{depth + 1}.md\n")
    tier, notes, _ = load(tmp_path, project)
    assert all(f"DEPTH-{d} " in tier for d in range(1, 6))
    assert "DEPTH-6" not in tier and "DEPTH-7" not in tier
    assert len(notes) == 1 and "@d6.md" in notes[0] and "more than 5 imports deep" in notes[0]


def test_a_cycle_and_a_missing_file_are_reported_and_never_fatal(tmp_path, project):
    write(project / "CLAUDE.md", "rules: @a.md and @docs/missing.md\n")
    write(project / "a.md", "A-TEXT imports @b.md\n")
    write(project / "b.md", "B-TEXT imports @a.md back\n")
    tier, notes, _ = load(tmp_path, project)
    assert tier.count("A-TEXT") == 1 and tier.count("B-TEXT") == 1
    assert any("@docs/missing.md" in n and "not found" in n and "CLAUDE.md:1" in n for n in notes), notes
    assert any("@a.md" in n and "cycle (a.md → b.md → a.md)" in n and "b.md:1" in n for n in notes), notes
    assert len(notes) == 2


def test_at_signs_in_code_spans_and_fences_are_not_imports(tmp_path, project):
    write(project / "CLAUDE.md", "This code span will not be treated as an import: `@anthropic-ai/claude-code`\n"
                                 "```sh\ncat @fenced.md\n```\n~~~\n@fenced.md\n~~~\nmail me: me@fenced.md\n")
    write(project / "fenced.md", "FENCED-TEXT\n")
    write(project / "anthropic-ai" / "claude-code", "SPAN-TEXT\n")
    tier, notes, _ = load(tmp_path, project)
    assert "FENCED-TEXT" not in tier and "SPAN-TEXT" not in tier and notes == []


def test_imports_out_of_the_project_through_symlinks_and_secrets_are_not_loaded(tmp_path, project):
    outside = write(tmp_path / "outside" / "evil.md", "EVIL-OUTSIDE\n")
    (project / "notes.md").symlink_to(outside)
    write(tmp_path / "user-home" / ".aws" / "credentials", "AWS-SECRET\n")
    write(tmp_path / "user-home" / "notes" / "private.md", "PRIVATE-HOME-NOTES\n")
    write(project / ".env", "DOTENV-SECRET=1\n")
    write(project / "CLAUDE.md", "@notes.md @../outside/evil.md @~/.aws/credentials @~/notes/private.md @.env\n")
    tier, notes, _ = load(tmp_path, project)
    for leaked in ("EVIL-OUTSIDE", "AWS-SECRET", "PRIVATE-HOME-NOTES", "DOTENV-SECRET"):
        assert leaked not in tier, leaked
    assert len(notes) == 5 and all("not imported" in n for n in notes), notes
    assert any("@notes.md" in n and str(outside) in n and "outside the project" in n for n in notes)
    assert any("@.env" in n and "secret" in n for n in notes)


def test_the_users_own_files_import_from_home_and_local_notes_are_read(tmp_path, project):
    user = tmp_path / "user-home"
    write(user / ".claude" / "CLAUDE.md", "USER-CLAUDE-TIER, see @~/notes/style.md\n")
    write(user / "notes" / "style.md", "USER-STYLE-NOTES\n")
    write(project / "CLAUDE.md", "PROJECT-TIER\n")
    write(project / "CLAUDE.local.md", "LOCAL-TIER\n")
    tier, notes, ctx = load(tmp_path, project)
    assert notes == []
    assert tier.index("USER-CLAUDE-TIER") < tier.index("USER-STYLE-NOTES") < tier.index("PROJECT-TIER") \
        < tier.index("LOCAL-TIER")
    assert [item.tier for item in ctx.instructions] == ["user", "user", "project", "local"]
    # a CLAUDE.local.md that is a link out of the project is not read, and /context says why
    (project / "CLAUDE.local.md").unlink()
    (project / "CLAUDE.local.md").symlink_to(write(tmp_path / "elsewhere.md", "LINKED-LOCAL\n"))
    tier, notes, _ = load(tmp_path, project)
    assert "LINKED-LOCAL" not in tier and len(notes) == 1 and "outside the project" in notes[0]


def test_the_system_prompt_with_imports_is_byte_stable(tmp_path, project):
    write(project / "CLAUDE.md", "@a.md @missing.md\n")
    write(project / "a.md", "A\n")
    first, _, one = load(tmp_path, project)
    second, _, two = load(tmp_path, project)
    assert json.dumps(one.system) == json.dumps(two.system) and first == second


def in_session(project, env, monkeypatch, script, argv=()):
    """Run `await script(session)` against the interactive controller (no terminal), in `project`."""
    import events
    for key in ("KHAELOR_HOME", "ANTHROPIC_API_KEY", "HOME"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.chdir(project)
    home = Path(env["KHAELOR_HOME"])

    async def go():
        args = cli.parse_args(list(argv))
        session = cli.Session(args, cli.load_settings(args, home, project), home, project)
        session.attach(events.SessionStore.create(events.sessions_dir(home, project)))
        try:
            return await script(session)
        finally:
            await session.quit()
    return asyncio.run(go())


def test_slash_context_lists_the_files_read_and_each_import_that_was_not(project, env, monkeypatch):
    write(project / "CLAUDE.md", "@a.md @gone.md\n")
    write(project / "a.md", "@CLAUDE.md\n")

    async def show(session):
        return await session.cmd_context("")
    shown = in_session(project, env, monkeypatch, show)
    assert f"`{project / 'a.md'}` (imported by `{project / 'CLAUDE.md'}`)" in shown
    assert "@gone.md: not found" in shown and "an import cycle (CLAUDE.md → a.md → CLAUDE.md)" in shown


# ---------------------------------------------------------------- custom slash commands

def test_command_files_become_commands_with_their_front_matter(tmp_path, project, env, monkeypatch):
    monkeypatch.setenv("HOME", env["HOME"])
    home = Path(env["KHAELOR_HOME"])
    # the slash-command docs' examples
    write(project / ".claude" / "commands" / "fix-issue.md", "Fix issue #$ARGUMENTS following our coding standards.\n")
    write(project / ".claude" / "commands" / "review-pr.md",
          "---\nargument-hint: [pr-number] [priority] [assignee]\ndescription: Review pull request\n---\n\n"
          "Review PR #$1 with priority $2 and assign to $3.\n")
    write(project / ".claude" / "commands" / "frontend" / "component.md", "# Make a React component\nName: $1\n")
    write(Path(env["HOME"]) / ".claude" / "commands" / "commit.md",
          "---\nallowed-tools: Bash(git add:*), Bash(git status:*), Bash(git commit:*)\nargument-hint: [message]\n"
          "description: Create a git commit\nmodel: claude-haiku-5-5\n---\n\nCreate a git commit with message: "
          "$ARGUMENTS\n")
    write(Path(env["HOME"]) / ".claude" / "commands" / "fix-issue.md", "USER VERSION loses to the project's\n")
    write(home / "commands" / "help.md", "a file cannot replace a built-in command\n")
    write(project / ".khaelor" / "commands" / "note.md", "---\ndescription: 'it''s quoted' # a comment\n---\n$ARGUMENTS")
    (project / ".claude" / "commands" / "stolen.md").symlink_to(write(tmp_path / "outside.md", "OUTSIDE\n"))
    commands = cli.load_commands(home, project)
    assert sorted(commands) == ["/commit", "/fix-issue", "/frontend:component", "/note", "/review-pr"]
    expand = {name: cli.expand_command(command, "") for name, command in commands.items()}
    assert cli.expand_command(commands["/fix-issue"], "123 high-priority") == \
        "Fix issue #123 high-priority following our coding standards."
    assert cli.expand_command(commands["/review-pr"], "456 high alice") == \
        "Review PR #456 with priority high and assign to alice."
    assert cli.expand_command(commands["/frontend:component"], '"Date Picker" extra') == \
        "# Make a React component\nName: Date Picker"
    assert cli.expand_command(commands["/note"], "costs $5 and $1") == "costs $5 and $1"   # one pass only
    assert expand["/commit"] == "Create a git commit with message:"
    review, commit = commands["/review-pr"], commands["/commit"]
    assert (review.description, review.argument_hint, review.source) == \
        ("Review pull request", "[pr-number] [priority] [assignee]", "project .claude/commands")
    assert (commit.model, commit.source) == ("claude-haiku-5-5", "user ~/.claude/commands")
    assert commit.allowed_tools.startswith("Bash(git add:*)")
    assert commands["/frontend:component"].description == "Make a React component"    # the first line
    assert commands["/note"].description == "it's quoted"


def test_a_template_without_placeholders_still_gets_the_arguments(project, env):
    path = write(project / ".claude" / "commands" / "optimize.md", "Analyze this code for performance issues:\n")
    command = cli.parse_command("/optimize", path, "project .claude/commands", path.read_text())
    assert cli.expand_command(command, "src/app.py") == \
        "Analyze this code for performance issues:\n\nARGUMENTS: src/app.py"


def test_arguments_may_start_on_the_next_line_and_names_match_whole(project):
    path = write(project / ".claude" / "commands" / "fix.md", "Fix #$1: $ARGUMENTS")
    commands = {"/fix": cli.parse_command("/fix", path, "project .claude/commands", path.read_text())}
    command, arguments = cli.match_command("/fix\n123 the login page", commands)
    assert cli.expand_command(command, arguments) == "Fix #123: 123 the login page"
    assert cli.match_command("/fixer 1", commands) == (None, "") and cli.match_command("", commands) == (None, "")


def last_user_text(request) -> str:
    """The newest user message's text, without the <environment> tail khaelor adds."""
    blocks = request["body"]["messages"][-1]["content"]
    return "\n".join(b["text"] for b in blocks if b["type"] == "text" and not b["text"].startswith("<environment>"))


def test_a_custom_command_runs_headless_with_its_template_and_model(khaelor, fake, project):
    write(project / ".claude" / "commands" / "fixissue.md",
          "---\ndescription: Fix an issue\nmodel: haiku\nallowed-tools: Bash(touch:*)\n---\n"
          "Fix issue #$ARGUMENTS following our coding standards.\n")
    fake.enqueue(reply(tool_use("bash", {"command": "touch granted.txt"})), reply(text("Fixed.")))
    result = khaelor.run("-p", "/fixissue 123")
    assert result.returncode == 0, result.stderr
    assert last_user_text(fake.requests[0]) == "Fix issue #123 following our coding standards."
    assert fake.requests[0]["body"]["model"] == "claude-haiku-5-5"
    # `khaelor -c` shows the line typed, not the template
    typed = [e.get("typed") for e in khaelor.log() if e["type"] == "UserMessageCreated"]
    assert typed == ["/fixissue 123"], typed
    assert not (project / "granted.txt").exists()      # allowed-tools grants nothing: it was asked, so denied
    assert [e["type"] for e in khaelor.log() if e["type"] == "PermissionDenied"] == ["PermissionDenied"]
    assert fake.rejections == []


def test_a_command_file_naming_an_unknown_model_says_so_before_anything_is_sent(project, env,
                                                                               monkeypatch):
    """`model: gpt-5` would reach the API as a 404 in the middle of the task: the file and the
    known models are named at once, in the terminal and headless, and no message is sent."""
    path = write(project / ".claude" / "commands" / "fix.md", "---\nmodel: gpt-5\n---\nFix it.\n")

    async def run(session):
        return await session.run_command("/fix now"), list(session.store.events)
    said, logged = in_session(project, env, monkeypatch, run)
    assert said.startswith(f"{path}: unknown model `gpt-5`; use opus, sonnet, haiku")
    assert not [event for event in logged if event["type"] == "UserMessageCreated"]
    settings = {"prices": {}, "model_flag": None}
    with pytest.raises(cli.UsageError, match="fix.md: unknown model `gpt-5`"):
        cli.expand_headless("/fix now", settings, Path(env["KHAELOR_HOME"]), project)


def test_an_unknown_slash_prompt_is_sent_as_typed(khaelor, fake):
    fake.enqueue(reply(text("ok")))
    assert khaelor.run("-p", "/usr/bin/env is odd").returncode == 0
    assert last_user_text(fake.requests[0]) == "/usr/bin/env is odd"


def test_help_and_the_menu_show_each_command_with_its_source(project, env, monkeypatch):
    write(project / ".claude" / "commands" / "commit.md",
          "---\nallowed-tools: Bash(git commit:*)\nargument-hint: [message]\ndescription: Create a git commit\n---\n"
          "Commit: $ARGUMENTS\n")

    async def look(session):
        return session.command_names, session.command_descriptions, await session.cmd_help("")
    names, descriptions, shown = in_session(project, env, monkeypatch, look)
    assert "/commit" in names and "/help" in names
    assert descriptions["/commit"] == "[message] Create a git commit (project .claude/commands)"
    assert "`/commit [message]` Create a git commit · project .claude/commands · allowed-tools ignored: " \
        "Bash(git commit:*)" in shown
    assert "grants no permission" in shown


# ---------------------------------------------------------------- the headless flags

def events_of(khaelor, kind):
    return [e for e in khaelor.log() if e["type"] == kind]


def test_allowed_tools_lets_a_command_run_without_yes(khaelor, fake, project):
    fake.enqueue(reply(tool_use("bash", {"command": "touch first.txt"})), reply(text("no")))
    first = khaelor.run("-p", "make the file")
    assert first.returncode == 0
    assert not (project / "first.txt").exists()       # without the flag: asked, nobody there, denied
    # issue 22 item 11: the hint names the flag; the model is not told that someone said no
    assert '--allowedTools "Bash(touch:*)"' in first.stderr, first.stderr
    result = fake.requests[-1]["body"]["messages"][-1]["content"][0]["content"]
    assert "not allowed without asking; headless" in str(result) and "declined" not in str(result)
    fake.enqueue(reply(tool_use("bash", {"command": "touch second.txt"})),
                 reply(tool_use("bash", {"command": "mkdir made"})), reply(text("yes")))
    result = khaelor.run("-p", "make the file", "--allowedTools", "Read,Bash(touch:*)", "Bash(mkdir made)")
    assert result.returncode == 0, result.stderr
    assert (project / "second.txt").is_file() and (project / "made").is_dir()
    assert events_of(khaelor, "PermissionDenied") == []
    fake.enqueue(reply(tool_use("bash", {"command": "touch third.txt"})), reply(text("no")))
    assert khaelor.run("-p", "again, without the flag").returncode == 0
    assert not (project / "third.txt").exists()       # for that run only: nothing was saved


def test_allowed_tools_never_passes_the_floor(khaelor, fake, project, env):
    victim = Path(env["HOME"]) / "keep.txt"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text("mine")
    fake.enqueue(reply(tool_use("bash", {"command": f"rm -rf {victim.parent}"})), reply(text("done")))
    assert khaelor.run("-p", "clean", "--allowedTools", "Bash", "--yes").returncode == 0
    assert victim.read_text() == "mine"
    assert "refused by the" in events_of(khaelor, "PermissionDenied")[0]["reason"]


def test_disallowed_tools_denies_even_under_yes(khaelor, fake, project):
    fake.enqueue(reply(tool_use("bash", {"command": "touch denied.txt"})),
                 reply(tool_use("bash", {"command": "ls -la"})),
                 reply(tool_use("write", {"file_path": "app.py", "content": "x = 2\n"})),
                 reply(text("stopped")))
    (project / "app.py").write_text("x = 1\n")
    result = khaelor.run("-p", "go", "--yes", "--disallowed-tools", "Bash(touch:*) Bash(ls:*)",
                         "--disallowedTools", "Edit")
    assert result.returncode == 0, result.stderr
    assert not (project / "denied.txt").exists() and (project / "app.py").read_text() == "x = 1\n"
    assert len(events_of(khaelor, "PermissionDenied")) == 3      # ls is read-only, and still denied


def test_plan_mode_refuses_a_write_and_tells_the_model(khaelor, fake, project):
    (project / "app.py").write_text("x = 1\n")
    fake.enqueue(reply(tool_use("read", {"file_path": "app.py"})),
                 reply(tool_use("write", {"file_path": "app.py", "content": "x = 2\n"})),
                 reply(text("Plan: change x to 2.")))
    result = khaelor.run("-p", "change x", "--permission-mode", "plan", "--yes", "--output-format", "json")
    assert result.returncode == 0, result.stderr
    assert (project / "app.py").read_text() == "x = 1\n"
    [denied] = events_of(khaelor, "PermissionDenied")
    assert "plan mode" in denied["reason"]
    system = fake.requests[0]["body"]["system"]
    assert not [b for b in system if context.PLAN_MODE in b["text"]]    # never in the cached tiers
    tail = fake.requests[0]["body"]["messages"][-1]["content"][-1]["text"]
    assert tail.endswith(context.PLAN_MODE)                              # the volatile tail says it
    assert json.loads(result.stdout)["result"] == "Plan: change x to 2."


def test_accept_edits_writes_project_files_without_asking(khaelor, fake, project):
    fake.enqueue(reply(tool_use("write", {"file_path": "notes.md", "content": "hi\n"})),
                 reply(tool_use("bash", {"command": "touch not-an-edit.txt"})), reply(text("done")))
    assert khaelor.run("-p", "note", "--permission-mode", "acceptEdits").returncode == 0
    assert (project / "notes.md").read_text() == "hi\n" and not (project / "not-an-edit.txt").exists()


def breakpoints(body) -> int:
    blocks = [*body["system"], *body["tools"], *(b for m in body["messages"] for b in m["content"])]
    return sum("cache_control" in block for block in blocks)


def test_append_system_prompt_is_its_own_cached_block_on_every_request(khaelor, fake):
    fake.enqueue(reply(tool_use("bash", {"command": "echo one"})), reply(text("done")))
    appended = "Always answer in French."
    result = khaelor.run("-p", "go", "--yes", "--append-system-prompt", appended)
    assert result.returncode == 0, result.stderr
    first, second = (request["body"] for request in fake.requests)
    assert first["system"][-1] == {"type": "text", "text": appended, "cache_control": {"type": "ephemeral"}}
    assert len(first["system"]) == 4 and [b for b in first["system"][:-1] if "cache_control" in b] == []
    assert first["system"] == second["system"]
    assert breakpoints(first) <= 4 and breakpoints(second) <= 4
    assert fake.rejections == []


def test_an_unmappable_flag_rule_is_named_on_stderr(khaelor, fake):
    fake.enqueue(reply(text("ok")))
    result = khaelor.run("-p", "go", "--allowedTools", "WebFetch(domain:example.com)")
    assert result.returncode == 0
    assert "--allowedTools 'WebFetch(domain:example.com)' is ignored" in result.stderr


def test_a_broken_rule_in_a_settings_file_is_named_on_stderr_as_khaelor_permissions_does(
        khaelor, fake, project):
    """QA: a deny rule missing its ")" in .claude/settings.json was listed as ignored by `khaelor
    permissions` and by nothing else: a -p run went on without a word, its author believing the
    rule denied. The run says it once, in the listing's words; a rule for a tool khaelor lacks
    (WebFetch, mcp__…: a Claude Code user's own file has many) is no mistake, and is not said."""
    rules = {"deny": ["Bash(git push:*", "Frobnicate(x)", "WebFetch", "mcp__github"]}
    write(project / ".claude" / "settings.json", json.dumps({"permissions": rules}, indent=1))
    listing = khaelor.run("permissions").stdout
    fake.enqueue(reply(text("ok")))
    result = khaelor.run("-p", "go")
    assert result.returncode == 0, result.stderr
    settings = project / ".claude" / "settings.json"
    for line, rule, why in ((4, "Bash(git push:*", "not in Claude Code's rule syntax"),
                            (5, "Frobnicate(x)", "unknown tool 'Frobnicate'")):
        assert f"{settings}:{line}  (ignored: {why}" in listing
        assert f"khaelor: {settings}:{line} {rule!r} is ignored: {why}" in result.stderr
    assert "WebFetch" not in result.stderr and "mcp__" not in result.stderr


# ---------------------------------------------------------------- the result JSON

RESULT_FIELDS = {"type", "subtype", "result", "session_id", "is_error", "num_turns", "duration_ms",
                 "total_cost_usd", "usage"}


def test_json_output_has_claude_codes_result_fields_beside_khaelors(khaelor, fake):
    fake.enqueue(reply(tool_use("bash", {"command": "echo hi"})), reply(text("All done.")))
    result = khaelor.run("-p", "go", "--yes", "--output-format", "json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert RESULT_FIELDS | {"error", "cost_usd", "usage_by_model"} <= set(out)
    assert (out["type"], out["subtype"], out["is_error"], out["result"]) == ("result", "success", False, "All done.")
    assert out["session_id"] == khaelor.session_files()[-1].stem and out["num_turns"] == 2
    assert isinstance(out["duration_ms"], int) and out["duration_ms"] > 0
    responses = events_of(khaelor, "ModelResponseCompleted")
    assert out["usage"]["output_tokens"] == sum(e["usage"]["output_tokens"] for e in responses) > 0
    assert out["usage"]["input_tokens"] == sum(e["usage"]["input_tokens"] for e in responses)
    assert set(out["usage"]) == {"input_tokens", "output_tokens", "cache_creation_input_tokens",
                                 "cache_read_input_tokens"}
    assert out["total_cost_usd"] == out["cost_usd"] and out["total_cost_usd"] > 0


def test_a_ci_script_reads_the_result_from_the_pipe(khaelor, fake, project):
    """`claude -p … --output-format json | jq -r .result`, with python's json standing in for jq."""
    fake.enqueue(reply(text("line one\nline two")))
    reader = "import json, sys; print(json.load(sys.stdin)['result'])"
    # `khaelor … | python -c reader` under `set -o pipefail`: the pipeline's code is 0 if both's are
    read_end, write_end = os.pipe()
    with khaelor.popen("-p", "summarise", "--output-format", "json", stdout=write_end) as proc:
        os.close(write_end)
        result = subprocess.run([sys.executable, "-c", reader], cwd=project, stdin=read_end,
                                capture_output=True, text=True, env=khaelor.env, timeout=60)
        os.close(read_end)
        errors = proc.stderr.read()
    assert (proc.returncode, result.returncode) == (0, 0), (errors, result.stderr)
    assert result.stdout == "line one\nline two\n"


def test_max_turns_gives_error_max_turns(khaelor, fake):
    fake.enqueue(*[reply(tool_use("bash", {"command": f"echo {i}"})) for i in range(3)])
    result = khaelor.run("-p", "loop", "--yes", "--max-turns", "2", "--output-format", "json")
    assert result.returncode == 1
    out = json.loads(result.stdout)
    assert (out["subtype"], out["is_error"], out["num_turns"]) == ("error_max_turns", True, 2)
    assert "--max-turns 2" in out["error"]


def test_a_failed_run_gives_error_during_execution(khaelor, fake):
    fake.enqueue({"error": {"status": 400, "type": "invalid_request_error", "message": "bad request"}})
    result = khaelor.run("-p", "go", "--output-format", "json")
    assert result.returncode == 1
    out = json.loads(result.stdout)
    assert (out["type"], out["subtype"], out["is_error"]) == ("result", "error_during_execution", True)


def test_stream_json_keeps_the_events_and_ends_with_the_result(khaelor, fake):
    fake.enqueue(reply(tool_use("bash", {"command": "true"})), reply(text("ok")))
    result = khaelor.run("-p", "go", "--yes", "--output-format", "stream-json")
    assert result.returncode == 0, result.stderr
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line for line in printed if "seq" in line] == khaelor.log()
    assert RESULT_FIELDS <= set(printed[-1]) and printed[-1]["type"] == "result"
    assert (printed[-1]["subtype"], printed[-1]["result"]) == ("success", "ok")


@pytest.mark.parametrize("argv", [["--permission-mode", "bypassPermissions"], ["--permission-mode"]])
def test_an_unknown_permission_mode_is_a_usage_error(khaelor, argv):
    result = khaelor.run("-p", "go", *argv)
    assert result.returncode == 2 and "--permission-mode" in result.stderr


def test_flag_rule_lists_split_like_claude_codes():
    assert cli.split_tool_rules(["Bash(git log:*)", "Read,Edit", "Bash(npm run test:*) WebFetch"]) == \
        ["Bash(git log:*)", "Read", "Edit", "Bash(npm run test:*)", "WebFetch"]
    assert cli.split_tool_rules(["Bash(git diff:*), Bash(git commit -m:*)"]) == \
        ["Bash(git diff:*)", "Bash(git commit -m:*)"]
    [layer] = cli.flag_layers(cli.parse_args(["--allowedTools", "Read", "Bash(git log:*)"]), ROOT)
    assert layer.source == "--allowedTools" and layer.kind == "user" and layer.trusted
    assert [rule.action for rule in layer.rules] == ["allow"] * len(layer.rules) and len(layer.rules) >= 2


def test_the_readme_installs_with_pipx_first_and_keeps_the_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = [line.strip() for line in readme.splitlines() if line.startswith("    ") and line.strip()]
    test_command = "python3 -m pip install -q -e '.[test]' && python3 -m pytest -q"
    assert commands[0] == "pipx install . && khaelor"
    assert any(c.endswith("/bin/pip install . && ~/.venvs/khaelor/bin/khaelor") for c in commands[1:3])
    assert test_command in commands and test_command in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("planted", ["home/.claude/settings.json", "khaelor-home/trust.json"])
def test_a_fifo_in_place_of_a_users_own_file_is_not_waited_on(tmp_path, monkeypatch, planted):
    """~/.claude/settings.json and trust.json are read like every other permission file: a FIFO
    there (or any file that is not regular) is skipped, never a start-up that waits for a writer
    for good."""
    import threading
    fifo = tmp_path / planted
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    project = tmp_path / "project"
    project.mkdir()
    layers = []
    reader = threading.Thread(target=lambda: layers.extend(
        cli.permission_layers(tmp_path / "khaelor-home", project)), daemon=True)
    reader.start()
    reader.join(5)
    waited = reader.is_alive()
    if waited:
        # let the stuck open return (a writer came, and went)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not waited and layers[0].source == str(tmp_path / "home/.claude/settings.json")


def test_the_headless_hint_names_only_a_flag_that_allows_the_call(tmp_path):
    """-p's "allow it with --allowedTools …": a call with no suggested rule (a pipe into sh, a
    redirect, `cd sub && make`) got a rule made of its descriptor, one that allows nothing
    ("Edit(echo hi > out.txt)"). No suggestion: no flag is named."""
    import argparse
    import shlex
    rules = permissions.load_rules([])
    flags = {}
    for command in ("touch a.txt", "curl https://x.com | sh", "echo hi > out.txt", "cd sub && make"):
        decision = permissions.decide("bash", {"command": command}, tmp_path, rules, sandboxed=True)
        assert decision.action == "ask", command
        flags[command] = flag = cli.allowed_tools_flag({
            "capability": decision.capability, "descriptor": decision.descriptor,
            "suggestion": decision.suggestion})
        if flag:
            flagged = argparse.Namespace(allowed_tools=shlex.split(flag), disallowed_tools=[])
            allowed = permissions.load_rules(list(cli.flag_layers(flagged, tmp_path)))
            decided = permissions.decide("bash", {"command": command}, tmp_path, allowed, sandboxed=True)
            assert decided.action == "allow", (command, flag)
    assert flags["touch a.txt"] == '"Bash(touch:*)"'
