"""Why a sharded predict failed, in one line: torchrun's failure summary read rank by rank, and a rank killed by
a signal named before the error its peers report because of it (which comes first is a race)."""

from __future__ import annotations

from kronos_core.launch import LaunchResult, LaunchSpec
from kronos_tune.predict.shards import failure_line, torchrun_failures

SUMMARY = """[default0]:RuntimeError: Connection closed by peer
============================================================
kronos_tune.predict.ranks FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_19:40:01
  host      : node
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4242) SIGKILL
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_19:40:01
  host      : node
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4241)
  error_file: /tmp/error.json
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================""".splitlines()


def test_a_rank_killed_by_a_signal_is_named_before_the_peer_error_it_caused() -> None:
    """Which rank's line comes first is a race: the survivor may report gloo's closed connection (and be
    torchrun's root cause) before the agent sees the SIGKILL. The dead rank is the cause either way."""
    failures = torchrun_failures(SUMMARY)
    assert [(f.rank, f.exitcode, f.pid, f.signal) for f in failures] == [("0", 1, "4241", None),
                                                                        ("1", -9, "4242", "SIGKILL")]
    assert failures[1].describe() == "rank 1 was killed by SIGKILL (pid 4242)"
    assert failures[0].describe() == "rank 0 exited with code 1 (pid 4241)"
    stopped = [line.replace("-9 (pid: 4242) SIGKILL", "-15 (pid: 4242) SIGTERM") for line in SUMMARY]
    assert [f.signal for f in torchrun_failures(stopped)] == [None, "SIGTERM"]
    assert torchrun_failures(["no summary here"]) == []


def test_the_failure_line_names_the_killed_rank_even_when_its_peer_reported_first() -> None:
    spec = LaunchSpec(nproc=2)
    peer = {"event": "error", "rank": 0, "message": "RuntimeError: Connection closed by peer"}
    assert failure_line(spec, LaunchResult(1, False, [peer], SUMMARY)) == "rank 1 was killed by SIGKILL (pid 4242)"
    # without a signal death, the rank's own error is the cause
    stopped = [line.replace("-9 (pid: 4242) SIGKILL", "-15 (pid: 4242) SIGTERM") for line in SUMMARY]
    assert failure_line(spec, LaunchResult(1, False, [peer], stopped)) == ("rank 0 failed: RuntimeError: "
                                                                           "Connection closed by peer")
    assert failure_line(spec, LaunchResult(1, False, [], stopped)) == "rank 0 exited with code 1 (pid 4241)"


def test_a_summary_cut_above_its_failures_header_is_still_read() -> None:
    cut = SUMMARY[SUMMARY.index("[1]:"):]
    assert [(f.rank, f.signal) for f in torchrun_failures(cut)] == [("0", None), ("1", "SIGKILL")]
