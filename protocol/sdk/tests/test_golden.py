"""The SDK must produce exactly the worker side of every SDK golden transcript in protocol/golden
(the Rust host's tests read the same files)."""

import json

import pytest
from conftest import EVENT_PREFIX, GOLDEN, load_transcript

SDK_TRANSCRIPTS = [p for p in sorted(GOLDEN.glob("*.ndjson")) if load_transcript(p)[0]["sdk"]]


def test_there_are_sdk_transcripts():
    assert len(SDK_TRANSCRIPTS) >= 2


@pytest.mark.parametrize("path", SDK_TRANSCRIPTS, ids=lambda p: p.stem)
def test_sdk_speaks_the_transcript(path, tmp_path, echo_worker):
    _, entries = load_transcript(path)
    out = tmp_path / "result.json"
    stdin = [e["line"].replace("OUTPUT", str(out)) for e in entries if e["from"] == "host"]
    proc = echo_worker()
    stdout, stderr = proc.communicate("\n".join(stdin) + "\n", timeout=30)
    assert proc.returncode == 0, stderr

    want_stdout = [e["line"] for e in entries if e["channel"] == "stdout"]
    assert stdout.splitlines() == want_stdout

    got_events = [
        json.loads(x[len(EVENT_PREFIX) :])
        for x in stderr.splitlines()
        if x.startswith(EVENT_PREFIX)
    ]
    want_events = [
        json.loads(e["line"][len(EVENT_PREFIX) :])
        for e in entries
        if e["channel"] == "stderr" and e["line"].startswith(EVENT_PREFIX)
    ]
    assert got_events == want_events

    # Plain log lines of the transcript appear in order among the real ones (tracebacks add more).
    plain = iter(x for x in stderr.splitlines() if not x.startswith(EVENT_PREFIX))
    for e in entries:
        if e["channel"] == "stderr" and not e["line"].startswith(EVENT_PREFIX):
            assert any(line == e["line"] for line in plain), f"missing log line {e['line']!r}"

    results = [e["json"] for e in entries if e["channel"] == "result"]
    assert json.loads(out.read_text()) == results[-1]


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.ndjson")), ids=lambda p: p.stem)
def test_transcripts_are_well_formed(path):
    header, entries = load_transcript(path)
    assert {"transcript", "description", "sdk"} <= header.keys()
    assert entries[0]["channel"] == "stdout" and entries[0]["line"].startswith("ready")
    for e in entries:
        assert e["from"] in ("host", "worker")
        assert e["channel"] in ("stdin", "stdout", "stderr", "result")
        if e["from"] == "worker" and e["channel"] in ("stdout", "stderr"):
            assert "parsed" in e, e
