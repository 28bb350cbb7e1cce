"""Protocol guarantees of the SDK beyond the transcripts."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import HERE, start_worker
from gpuhost_worker.runner import write_result


def test_c_level_stdout_writes_go_to_stderr(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(
        textwrap.dedent(
            """
        import os, sys
        sys.path.insert(0, %r)
        from gpuhost_worker import Worker, serve
        class W(Worker):
            def load(self):
                os.write(1, b"C-level noise while loading\\n")
            def run(self, task, progress):
                os.write(1, b"C-level noise during the task\\n")
                print("python noise")
                return {"ok": True}
        sys.exit(serve(W()))
    """
            % str(HERE.parent / "src")
        )
    )
    proc = start_worker(script)
    out = tmp_path / "r.json"
    stdout, stderr = proc.communicate(json.dumps({"_output_path": str(out)}) + "\n", timeout=30)
    assert stdout.splitlines() == ['ready {"protocol":1,"cancel":true}', "done"]
    assert "C-level noise while loading" in stderr
    assert "C-level noise during the task" in stderr
    assert "python noise" in stderr
    assert json.loads(out.read_text()) == {"ok": True}


def test_bad_task_line_is_an_error_and_worker_survives(tmp_path, echo_worker):
    proc = echo_worker()
    out = tmp_path / "r.json"
    stdout, _ = proc.communicate(
        "not json\n" + json.dumps({"text": "ok", "_output_path": str(out)}) + "\n", timeout=30
    )
    lines = stdout.splitlines()
    assert lines[1].startswith("error ") and json.loads(lines[1][6:])["kind"] == "ProtocolError"
    assert lines[2] == "done"
    assert json.loads(out.read_text())["echo"] == "ok"


def test_oneshot_mode_exits_after_one_job(tmp_path, echo_worker):
    proc = echo_worker("--oneshot")
    out = tmp_path / "r.json"
    proc.stdin.write(json.dumps({"text": "one", "_output_path": str(out)}) + "\n")
    proc.stdin.flush()  # stdin stays open: the worker must exit by itself
    assert proc.wait(timeout=30) == 0
    assert proc.stdout.read().splitlines()[-1] == "done"
    assert json.loads(out.read_text())["echo"] == "one"


def test_write_result_is_atomic(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    write_result(str(target), {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_results_and_events_are_strict_json(tmp_path, capsys):
    # A model's NaN score must not make the result unreadable (Python writes `NaN`, not JSON).
    target = tmp_path / "r.json"
    write_result(str(target), {"words": [{"score": float("nan"), "end": float("inf")}], "ok": 1.5})
    text = target.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"words": [{"score": None, "end": None}], "ok": 1.5}
    from gpuhost_worker.channels import finite

    assert finite((1.0, float("-inf"), {"x": [float("nan")]})) == [1.0, None, {"x": [None]}]


def test_worker_exits_when_parent_dies(tmp_path):
    # A middle process starts the worker and is SIGKILLed; the worker must notice and exit.
    middle = tmp_path / "middle.py"
    middle.write_text(
        textwrap.dedent(
            """
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, %r], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        print(p.pid, flush=True)
        time.sleep(60)
    """
            % str(HERE / "echo_worker.py")
        )
    )
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    proc = subprocess.Popen(
        [sys.executable, str(middle)], stdout=subprocess.PIPE, text=True, env=env
    )
    worker_pid = int(proc.stdout.readline())
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 3
    while time.time() < deadline:
        try:
            os.kill(worker_pid, 0)
        except ProcessLookupError:
            return
        # A zombie of ours? It is not: its parent was `middle`, now reaped by init.
        time.sleep(0.05)
    os.kill(worker_pid, signal.SIGKILL)
    raise AssertionError("worker outlived its parent by more than 3 s")


def test_load_failure_exits_nonzero(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(
        textwrap.dedent(
            """
        import sys
        sys.path.insert(0, %r)
        from gpuhost_worker import Worker, serve
        class W(Worker):
            def load(self):
                raise RuntimeError("weights not found at /models/x")
        sys.exit(serve(W()))
    """
            % str(HERE.parent / "src")
        )
    )
    proc = start_worker(script)
    stdout, stderr = proc.communicate("", timeout=30)
    assert proc.returncode == 2
    assert stdout == ""
    assert "weights not found" in stderr


def _read_until(stream, text, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = stream.readline()
        if text in line:
            return line
        assert line, f"stream closed before {text!r}"
    raise AssertionError(f"no {text!r} within {timeout} s")


def test_sigint_cancels_the_running_task_and_the_model_stays(tmp_path, echo_worker):
    proc = echo_worker()
    assert json.loads(proc.stdout.readline()[len("ready ") :])["cancel"] is True
    out = tmp_path / "r.json"
    proc.stdin.write(json.dumps({"sleep": 60, "_output_path": str(out)}) + "\n")
    proc.stdin.flush()
    _read_until(proc.stderr, "working")
    started = time.time()
    proc.send_signal(signal.SIGINT)
    line = proc.stdout.readline()
    assert time.time() - started < 5
    assert line.startswith("error ") and json.loads(line[6:]) == {
        "message": "cancelled",
        "kind": "cancelled",
    }
    assert not out.exists(), "no result for a cancelled task"
    proc.stdin.write(json.dumps({"text": "next", "_output_path": str(out)}) + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"
    assert json.loads(out.read_text())["echo"] == "next"
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    assert "swallowed" not in proc.stderr.read()


def test_sigint_between_jobs_is_ignored(tmp_path, echo_worker):
    proc = echo_worker()
    assert proc.stdout.readline().startswith("ready")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)  # let the signal land while the worker waits for a task
    assert proc.poll() is None, "the idle worker survived SIGINT"
    out = tmp_path / "r.json"
    proc.stdin.write(json.dumps({"text": "after", "_output_path": str(out)}) + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


def test_a_task_cancelled_before_it_was_read_is_given_up_at_once(tmp_path, echo_worker):
    # The host cancelled while the task line was still in the pipe: its marker file exists.
    proc = echo_worker()
    assert proc.stdout.readline().startswith("ready")
    marker, out = tmp_path / "task.cancel", tmp_path / "r.json"
    marker.touch()
    tasks = [
        {"sleep": 60, "_output_path": str(out), "_cancel_path": str(marker)},
        {"text": "next", "_output_path": str(out), "_cancel_path": str(tmp_path / "next.cancel")},
    ]
    stdout, _ = proc.communicate("\n".join(json.dumps(j) for j in tasks) + "\n", timeout=20)
    lines = stdout.splitlines()
    assert json.loads(lines[0][len("error ") :])["kind"] == "cancelled"
    assert lines[1] == "done" and json.loads(out.read_text())["echo"] == "next"


WARMING_WORKER = """
import os, sys
sys.path.insert(0, %r)
from gpuhost_worker import Worker, serve
class W(Worker):
    def warmup(self):
        sys.stderr.write("warming up\\n")
        if os.environ.get("FAIL_WARMUP"):
            raise RuntimeError("no synthetic input today")
    def run(self, task, progress):
        return {}
sys.exit(serve(W()))
"""


@pytest.mark.parametrize("fail", [False, True])
def test_warmup_runs_before_ready_and_never_blocks_it(tmp_path, fail):
    script = tmp_path / "w.py"
    script.write_text(WARMING_WORKER % str(HERE.parent / "src"))
    env = {"FAIL_WARMUP": "1"} if fail else {}
    proc = start_worker(script, env=env)
    stdout, stderr = proc.communicate("", timeout=30)
    assert proc.returncode == 0, stderr
    assert stderr.index("warming up") >= 0
    ready = json.loads(stdout.split("ready ", 1)[1].splitlines()[0])
    if fail:
        assert "warm-up failed (serving anyway)" in stderr and "warmup_s" not in ready
    else:
        assert ready["warmup_s"] >= 0


def test_oneshot_skips_the_warmup(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(WARMING_WORKER % str(HERE.parent / "src"))
    proc = start_worker(script, env={"GPUHOST_MODE": "oneshot"})
    stdout, stderr = proc.communicate("", timeout=30)
    assert "warming up" not in stderr and "warmup_s" not in stdout


class _Recorder:
    def __init__(self):
        self.events = []

    def event(self, payload):
        self.events.append(payload)


def test_progress_holds_back_the_newest_report_and_sends_it_after_the_interval():
    from gpuhost_worker.progress import Progress

    channels = _Recorder()
    progress = Progress(channels, min_interval=0.2)
    progress(0.1, "window 4/1439")
    for w in range(8, 1440, 4):  # a tight loop: held back, only the newest kept
        progress(0.1 + 0.8 * w / 1439, f"window {w}/1439")
    progress(0.9, "5 local speakers in 1439 windows")
    assert [e["message"] for e in channels.events] == ["window 4/1439"]
    deadline = time.monotonic() + 5
    while len(channels.events) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    # The last thing said before a quiet step goes out once the interval is over.
    assert channels.events[1] == {
        "event": "progress",
        "fraction": 0.9,
        "message": "5 local speakers in 1439 windows",
    }
    # A report held back when the task ends is dropped: nothing follows a task's end. The next
    # task's first report goes out at once.
    progress.finish()
    progress(0.5, "first")
    progress(0.6, "held")
    progress.finish()
    time.sleep(0.3)
    assert [e.get("message") for e in channels.events[2:]] == ["first"]
    # Final reports and partial results are never held back.
    progress(1.0)
    progress(0.7, partial={"text": "so far"})
    assert [e.get("fraction") for e in channels.events[3:]] == [1.0, 0.7]


def test_a_failure_says_whether_it_is_a_refusal_or_a_full_disk():
    import errno

    from gpuhost_worker import TaskRefused
    from gpuhost_worker.runner import failure

    assert failure(TaskRefused("only 0.4 s of speech")) == {
        "message": "only 0.4 s of speech",
        "kind": "refused",
    }
    full = failure(OSError(errno.ENOSPC, "No space left on device"))
    assert full["kind"] == "no_space" and "No space left" in full["message"]
    assert failure(OSError(errno.EDQUOT, "Disk quota exceeded"))["kind"] == "no_space"
    assert failure(OSError(errno.EACCES, "Permission denied"))["kind"] == "PermissionError"
    assert failure(ValueError("bad")) == {"message": "ValueError: bad", "kind": "ValueError"}


def test_a_huge_failure_message_is_cut_so_its_line_keeps_the_kind():
    # The host cuts lines at 64 KiB: an exception quoting its whole input (here 100 000
    # characters, each 6 bytes as JSON escapes) lost its kind, and a refusal became a 500.
    from gpuhost_worker import TaskRefused
    from gpuhost_worker.runner import failure

    refused = failure(TaskRefused("\u0007" * 100_000))
    assert refused["kind"] == "refused"
    assert refused["message"].endswith("(96000 characters left out)")
    line = "error " + json.dumps(refused, separators=(",", ":"))
    assert len(line.encode()) < 64 * 1024
