"""ModelClient through the real anthropic SDK against the fake API: taxonomy, retries, usage."""
import asyncio
import threading
import time

import pytest

import events
import model
from fake_api import FakeAnthropic, error, reply, text, thinking

REQUEST = {"model": "claude-sonnet-5-5", "max_tokens": 1024,
           "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}


@pytest.fixture(autouse=True)
def isolated_sdk_config(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))


def collect(client, request=REQUEST):
    async def run():
        try:
            return [event async for event in client.stream(request)]
        finally:
            await client.close()
    return asyncio.run(run())


def client_for(fake, **options):
    return model.ModelClient(api_key="sk-test", base_url=fake.base_url, **options)


def test_stream_yields_plain_wire_dicts_and_usage_comes_from_the_api():
    with FakeAnthropic([reply(thinking("hmm", "sig-9"), text("hello"), usage={"output_tokens": 42})]) as fake:
        events = collect(client_for(fake))
    assert all(type(e) is dict for e in events)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    usage = {}
    for e in events:
        if e["type"] in ("message_start", "message_delta"):
            usage = model.merge_usage(usage, e)
    assert usage["output_tokens"] == 42
    assert set(usage) == {"input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                          "thinking_tokens"}
    assert 0 < usage["thinking_tokens"] <= usage["output_tokens"], "part of the output, never on top"


def test_an_event_whose_data_spans_several_lines_is_joined_as_sse_has_it():
    content = (thinking("hmm", "sig-9"), text("hello\nworld"))
    with FakeAnthropic([reply(*content), reply(*content, split_data=True)]) as fake:
        one_line = collect(client_for(fake))
        split = collect(client_for(fake))
    one_line[0]["message"]["id"] = split[0]["message"]["id"]    # each reply has its own id
    assert split == one_line
    assert [e["type"] for e in split][-1] == "message_stop"


def test_retry_after_is_honoured_and_each_retry_is_reported():
    statuses = []
    script = [error("rate_limit_error", "slow", status=429, **{"retry-after": "0.3"}), reply(text("ok"))]
    with FakeAnthropic(script) as fake:
        start = time.perf_counter()
        collect(client_for(fake, on_status=statuses.append))
        elapsed = time.perf_counter() - start
        assert len(fake.requests) == 2
    assert elapsed >= 0.3
    assert len(statuses) == 1 and "429" in statuses[0] and "attempt 2" in statuses[0]


def test_backoff_without_retry_after_is_jittered_exponential():
    class NoHeaders(Exception):
        pass
    delays = [model._retry_delay(NoHeaders(), attempt) for attempt in (1, 2, 3) for _ in range(50)]
    assert all(0.375 <= d <= 0.5 for d in delays[:50])
    assert all(0.75 <= d <= 1.0 for d in delays[50:100])
    assert len(set(delays)) > 100   # jittered, not fixed


def test_attempts_are_bounded():
    with FakeAnthropic([error("api_error", "boom", status=500, **{"retry-after": "0.01"})] * 3) as fake:
        with pytest.raises(model.ModelError, match="gave up after 3 attempts") as caught:
            collect(client_for(fake, max_attempts=3))
        assert len(fake.requests) == 3
    assert caught.value.kind == "retryable" and caught.value.status == 500


def test_context_overflow_is_classified_and_never_retried():
    with FakeAnthropic([reply(text("unused"))], max_context_tokens=5) as fake:
        with pytest.raises(model.ModelError) as caught:
            collect(client_for(fake))
        assert len(fake.requests) == 1
    assert caught.value.kind == "context_overflow" and "prompt is too long" in str(caught.value)


def test_a_bad_key_is_an_auth_error_that_does_not_echo_the_key():
    with FakeAnthropic([reply(text("unused"))]) as fake:
        client = model.ModelClient(api_key="bad-key", base_url=fake.base_url)
        with pytest.raises(model.ModelError) as caught:
            collect(client)
        assert len(fake.requests) == 1
    assert caught.value.kind == "auth" and "bad-key" not in str(caught.value)


def test_an_invalid_request_is_loud_and_not_retried():
    with FakeAnthropic([reply(text("unused"))]) as fake:
        with pytest.raises(model.ModelError) as caught:
            collect(client_for(fake), {**REQUEST, "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]})
        assert len(fake.requests) == 1
    assert caught.value.kind == "invalid_request" and "400" in str(caught.value)


def test_a_mid_stream_failure_yields_restart_then_the_full_retry():
    script = [{"content": [text("lost " * 30)], "drop_after_events": 5}, reply(text("whole"))]
    with FakeAnthropic(script) as fake:
        events = collect(client_for(fake))
    restarts = [i for i, e in enumerate(events) if e["type"] == "restart"]
    assert len(restarts) == 1
    after = events[restarts[0] + 1:]
    assert "".join(e["delta"]["text"] for e in after if e["type"] == "content_block_delta") == "whole"


def test_cancelling_a_stream_propagates_cancelled_error():
    async def run(fake):
        client = client_for(fake)
        task = asyncio.create_task(anext(aiter(client.stream(REQUEST))))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.close()
    with FakeAnthropic([reply(text("slow " * 50), delay=0.05)]) as fake:
        asyncio.run(run(fake))


def test_price_comes_from_the_table_and_unknown_models_have_no_price():
    """events.cost, the one cost function (the price table moved there from model.py)."""
    usage = {"input_tokens": 1_000_000, "output_tokens": 0, "cache_read_tokens": 1_000_000, "cache_write_tokens": 0}
    assert events.cost({"claude-sonnet-5-5": usage}) == pytest.approx(2.20)
    assert events.cost({"claude-sonnet-5-5-20261001": usage}) == pytest.approx(2.20)
    assert events.cost({"mystery-model": usage}) is None
    assert events.cost({"mystery-model": usage}, {"mystery-model": [1, 1, 1, 1]}) == pytest.approx(2.0)
    # a session's models add up; one without a price makes the whole unknown, never a guess
    assert events.cost({"claude-sonnet-5-5": usage, "claude-haiku-5-5": usage}) == pytest.approx(2.31)
    assert events.cost({"claude-sonnet-5-5": usage, "mystery-model": usage}) is None
    assert events.cost({}) == 0


def test_x_should_retry_false_is_not_retried():
    with FakeAnthropic([]) as fake:   # an exhausted script answers 500 with x-should-retry: false
        with pytest.raises(model.ModelError, match="script exhausted") as caught:
            collect(client_for(fake))
        assert len(fake.requests) == 1
    assert caught.value.status == 500


def test_the_loop_stays_live_while_the_sdk_import_is_still_running():
    """The first request sent while the background import runs must not block the loop on it."""
    model._sdk()                                            # loaded: only the wait is measured
    importing = model._import_lock
    importing.acquire()                                     # an import in progress, for 0.8 s

    async def run(fake):
        client = client_for(fake)
        # released by another thread, as the import's own thread would
        threading.Timer(0.8, importing.release).start()
        gaps, last = [], time.monotonic()

        async def ticker():
            nonlocal last
            while True:
                await asyncio.sleep(0.02)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()
        ticking = asyncio.ensure_future(ticker())
        try:
            events = [e async for e in client.stream(REQUEST)]
        finally:
            ticking.cancel()
            await client.close()
        return events, max(gaps)

    with FakeAnthropic([reply(text("hello"))]) as fake:
        events, longest = asyncio.run(run(fake))
    assert events[-1]["type"] == "message_stop"
    assert longest < 0.3, f"the loop stalled {longest:.2f} s"


def test_retry_after_zero_backs_off_and_an_http_date_is_waited_for(monkeypatch):
    """retry-after: 0 retried at once (a hot loop against an overloaded API) and an HTTP-date
    retry-after was ignored; as the SDK has it (ANTHROPIC_API.md §4.3), a value that is not > 0
    falls back to the jittered backoff, and a date is waited for until it comes (capped)."""
    import email.utils
    # the backoff at 0.2 s (its own figures: the test above), so that a date stands out sooner
    monkeypatch.setattr(model, "BASE_DELAY_S", 0.2)
    model._sdk()        # imported first (≈2 s, once per process): the date is counted from now
    # dates have whole seconds: the first whole one at least 1.5 s away
    when = int(time.time() + 2.5)
    script = [error("overloaded_error", "busy", status=529, retry_after="0"),
              error("overloaded_error", "busy", status=529,
                    retry_after=email.utils.formatdate(when, usegmt=True)), reply(text("ok"))]
    statuses = []
    with FakeAnthropic(script) as fake:
        collect(client_for(fake, on_status=lambda status: statuses.append((time.time(), status))))
        assert len(fake.requests) == 3
    delays = [float(status.split("retrying in ")[1].split("s")[0]) for _, status in statuses]
    assert 0.1 <= delays[0] <= 0.2, statuses                  # 0.15 to 0.2, printed to 0.1 s
    # the time left until the date, where the backoff would be 0.4 s at most
    assert abs(delays[1] - (when - statuses[1][0])) <= 0.15 and delays[1] > 0.5, statuses


def test_x_should_retry_true_is_retried_whatever_the_status():
    """As the SDK has it (ANTHROPIC_API.md §4.3), `x-should-retry` alone decides: a 400 the
    server marks as worth retrying was said as a failure at once."""
    script = [error("invalid_request_error", "try again", status=400, retry_after_ms="10",
                    x_should_retry="true"), reply(text("ok"))]
    with FakeAnthropic(script) as fake:
        collect(client_for(fake))
        assert len(fake.requests) == 2


def test_a_400_that_only_mentions_the_context_window_is_not_an_overflow():
    """An invalid request whose message names the context window (not "prompt is too long", the
    API's overflow message) was taken for an overflow and compacted instead of said."""
    message = "max_tokens: 300000 > 128000, the maximum for this model's context window"
    with FakeAnthropic([error("invalid_request_error", message, status=400)]) as fake:
        with pytest.raises(model.ModelError) as caught:
            collect(client_for(fake))
    assert caught.value.kind == "invalid_request", caught.value
    overflow = "input length and `max_tokens` exceed context limit: 190000 + 32000 > 200000"
    with FakeAnthropic([error("invalid_request_error", overflow, status=400)]) as fake:
        with pytest.raises(model.ModelError) as caught:
            collect(client_for(fake))
    assert caught.value.kind == "context_overflow", caught.value
