"""The canary's evaluation command: exit 0 allows; anything else, a timeout or no start vetoes."""

import asyncio
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from router.canary_eval import EvalContext, evaluate, evaluate_sync

CONTEXT = EvalContext(canary_version="v2", baseline_version="v1", canary_percent=25,
                      next_percent=50)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_exit_zero_allows_promotion():
    result = evaluate_sync(python("print('all evals pass')"), CONTEXT, timeout_s=30)
    assert result.allow and not result.veto and result.returncode == 0
    assert "all evals pass" in result.reason


def test_a_failing_command_vetoes_with_the_end_of_its_stderr():
    code = ("import sys\n"
            "for i in range(20): print(f'progress {i}', file=sys.stderr)\n"
            "print('accuracy 0.71 < 0.80', file=sys.stderr)\n"
            "sys.exit(1)")
    result = evaluate_sync(python(code), CONTEXT, timeout_s=30)
    assert result.veto and result.returncode == 1
    assert "exit status 1" in result.reason and "accuracy 0.71 < 0.80" in result.reason
    assert "progress 0" not in result.reason          # only the last lines


def test_the_reason_is_truncated_but_keeps_the_last_words():
    code = "import sys; sys.stderr.write('x' * 5000 + ' the end'); sys.exit(3)"
    result = evaluate_sync(python(code), CONTEXT, timeout_s=30, max_reason_chars=200)
    assert result.veto and len(result.reason) <= 200
    assert result.reason.endswith("the end") and "exit status 3" in result.reason


def test_a_command_past_its_timeout_is_killed_and_vetoes(tmp_path: Path):
    # Through a shell, so the sleeper is the shell's child: the whole group must be killed.
    marker = tmp_path / "pid"
    code = (f"import os, sys, time; open({str(marker)!r}, 'w').write(str(os.getpid())); "
            "print('started', file=sys.stderr, flush=True); time.sleep(120)")
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    started = time.monotonic()
    result = evaluate_sync(command, CONTEXT, timeout_s=3)
    assert time.monotonic() - started < 60            # not the sleeper's 120 s
    assert result.veto and result.returncode is None
    assert "timed out after 3s" in result.reason and "started" in result.reason
    assert_gone(int(marker.read_text()))


def assert_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:
            if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return                                 # killed, awaiting its reaper
        except FileNotFoundError:
            return                                     # reaped since os.kill
        time.sleep(0.05)
    pytest.fail(f"process {pid} survived the timeout")


@pytest.mark.parametrize("command", [["/nonexistent/eval-tool", "--x"], [], "   "])
def test_a_command_that_cannot_start_vetoes(command):
    result = evaluate_sync(command, CONTEXT, timeout_s=30)
    assert result.veto and result.returncode is None
    assert "could not start" in result.reason


def test_a_missing_program_in_a_shell_string_vetoes():
    result = evaluate_sync("/nonexistent/eval-tool --x", CONTEXT, timeout_s=30)
    assert result.veto and result.returncode == 127 and "nonexistent" in result.reason


def test_the_context_reaches_the_command_in_its_environment():
    code = ("import os, sys\n"
            "want = {'PDSERVE_CANARY_VERSION': 'v2', 'PDSERVE_BASELINE_VERSION': 'v1',\n"
            "        'PDSERVE_CANARY_PERCENT': '25', 'PDSERVE_NEXT_PERCENT': '50',\n"
            "        'EXTRA': 'kept'}\n"
            "got = {k: os.environ.get(k) for k in want}\n"
            "sys.exit(0 if got == want else f'wrong environment: {got}')")
    result = evaluate_sync(python(code), CONTEXT, timeout_s=30, env={"EXTRA": "kept"})
    assert result.allow, result.reason
    other = EvalContext("v3", "v1", 50, 100)
    assert evaluate_sync(python(code), other, timeout_s=30, env={"EXTRA": "kept"}).veto


def test_a_command_killed_by_a_signal_vetoes():
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    result = evaluate_sync(python(code), CONTEXT, timeout_s=30)
    assert result.veto and "killed by signal 15" in result.reason


def test_cancelling_the_evaluation_kills_the_command(tmp_path: Path):
    marker = tmp_path / "pid"
    code = (f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); "
            "time.sleep(120)")

    async def cancel_midway():
        task = asyncio.ensure_future(evaluate(python(code), CONTEXT, timeout_s=120))
        while not marker.exists() or not marker.read_text():
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(cancel_midway(), 60))
    assert_gone(int(marker.read_text()))


def test_a_verdict_does_not_wait_for_background_children_holding_the_output(tmp_path: Path):
    marker = tmp_path / "pid"
    sleeper = (f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); "
               "time.sleep(120)")
    command = (f"{shlex.quote(sys.executable)} -c {shlex.quote(sleeper)} & "
               "echo 'verdict: ok' >&2; exit 0")
    started = time.monotonic()
    try:
        result = evaluate_sync(command, CONTEXT, timeout_s=60)
        assert time.monotonic() - started < 30    # neither the timeout nor the sleeper
        assert result.allow and "verdict: ok" in result.reason
    finally:
        while not marker.exists() or not marker.read_text():
            time.sleep(0.05)
        os.kill(int(marker.read_text()), 9)       # the test's own straggler
