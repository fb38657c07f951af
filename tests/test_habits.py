"""Issue 22: a Claude Code user's daily habits, through the interactive controller (no terminal)
and, where only the real program proves it, the real program against the fake API."""
import json

from fake_api import reply, text
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
    assert refused.startswith("unknown model `claude-opus-5-5 extra`") and kept == "claude-sonnet-5-5"
    assert now == "claude-opus-5-5" and "claude-opus-5-5" in chosen
    assert choices["/model"][:3] == ["opus", "sonnet", "haiku"]
    haiku = in_session(project, env, monkeypatch, lambda s: _model_of(s), argv=["--model", "haiku"])
    assert haiku == "claude-haiku-5-5"


async def _model_of(session):
    return session.kernel.ctx.model


def test_the_model_flag_takes_a_name_and_refuses_what_slash_model_refuses(khaelor, fake):
    fake.enqueue(reply(text("hi")))
    result = khaelor.run("-p", "hi", "--model", "sonnet", "--output-format", "json")
    assert result.returncode == 0, result.stderr
    assert fake.requests[-1]["body"]["model"] == "claude-sonnet-5-5"
    refused = khaelor.run("-p", "hi", "--model", "claude-opus-5-5-extra")
    assert refused.returncode == 2 and "unknown model `claude-opus-5-5-extra`" in refused.stderr
    assert json.loads(result.stdout)["is_error"] is False
