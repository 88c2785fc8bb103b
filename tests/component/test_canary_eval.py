"""The canary's evaluation command: exit 0 allows; anything else, a timeout or no start vetoes.

Every wait here has a deadline, and no assertion measures time: what is checked is what
happened to the processes (killed with their whole group, or left running).
"""

import asyncio
import contextlib
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest

from router.canary_eval import EvalContext, EvalResult, evaluate, evaluate_sync

CONTEXT = EvalContext(canary_version="v2", baseline_version="v1", canary_percent=25,
                      next_percent=50)
DEADLINE_S = 60      # the longest any evaluation here may be waited for (its bound, not a measure)
POLL_DEADLINE_S = 10  # for a child to write its ids, or a killed group to be gone


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def evaluate_within_deadline(command, timeout_s: float) -> EvalResult:
    """``evaluate``, failing the test (and killing the command) if it outlasts DEADLINE_S."""
    return asyncio.run(asyncio.wait_for(evaluate(command, CONTEXT, timeout_s), DEADLINE_S))


def sleeper(marker: Path, first: str = "") -> str:
    """Python code that writes "<pid> <process group>" to ``marker``, runs ``first`` and
    sleeps 120 s (so a straggler the test cannot kill still ends by itself)."""
    write = f"open({str(marker)!r}, 'w').write(f'{{os.getpid()}} {{os.getpgrp()}}')"
    return f"import os, sys, time; {write}; {first}time.sleep(120)"


def ids_written(marker: Path) -> tuple[int, int] | None:
    """The (pid, process group) a sleeper wrote to ``marker``; None while it has not."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        pid, group = map(int, marker.read_text().split())
        return pid, group
    return None


def ids_in(marker: Path) -> tuple[int, int] | None:
    """``ids_written``, waiting up to POLL_DEADLINE_S for them; None if they never came."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    while (ids := ids_written(marker)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return ids


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
    code = sleeper(marker, first="print('started', file=sys.stderr, flush=True); ")
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    result = evaluate_within_deadline(command, timeout_s=3)   # not the sleeper's 120 s
    assert result.veto and result.returncode is None
    assert "timed out after 3s" in result.reason and "started" in result.reason
    ids = ids_in(marker)
    assert ids is not None, "the sleeper never wrote its ids"
    assert_group_gone(ids[1])


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, killed and awaiting its reaper, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def group_members(group: int) -> list[int]:
    """The live processes of process group ``group``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue                                   # exited while we looked
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def assert_group_gone(group: int) -> None:
    """The command's whole process group is gone (within POLL_DEADLINE_S)."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    while (members := group_members(group)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not members, f"processes {members} of group {group} survived"


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

    async def cancel_midway():
        task = asyncio.ensure_future(evaluate(python(sleeper(marker)), CONTEXT, timeout_s=120))
        while ids_written(marker) is None:   # bounded by the wait_for below
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(cancel_midway(), DEADLINE_S))
    ids = ids_in(marker)
    assert ids is not None
    assert_group_gone(ids[1])


def test_a_verdict_does_not_wait_for_background_children_holding_the_output(tmp_path: Path):
    marker = tmp_path / "pid"
    command = (f"{shlex.quote(sys.executable)} -c {shlex.quote(sleeper(marker))} & "
               "echo 'verdict: ok' >&2; exit 0")
    try:
        # a timeout beyond the deadline: the verdict must come from the shell's exit
        result = evaluate_within_deadline(command, timeout_s=DEADLINE_S * 2)
        assert result.allow and "verdict: ok" in result.reason
        ids = ids_in(marker)
        assert ids is not None, "the background child never started"
        # the verdict came while the child still ran (and held the pipes): it did not wait
        assert running(ids[0])
    finally:
        ids = ids_in(marker)   # None: it never started, or ends by itself after its 120 s
        if ids is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(ids[0], signal.SIGKILL)   # the test's own straggler
