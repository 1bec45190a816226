"""The benchmark's critical-path accounting (benchmarks/run.py): phases from --json events,
round trips from the same phase at 0 ms and at an added RTT."""

import json
import sys

from repo_paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import run  # noqa: E402


def test_phases_come_from_the_tools_phase_events_and_steps_are_barriers():
    events = [{"event": "phase", "name": "connect", "start": 9.5, "seconds": 0.5, "time": 10.0},
              {"event": "phase", "name": "probe", "start": 10.0, "seconds": 0.3, "time": 10.3},
              {"event": "phase", "name": "reachability", "start": 10.4, "seconds": 0.4, "time": 10.8},
              {"event": "phase", "name": "preflight and plan", "start": 10.3, "seconds": 0.7, "time": 11.0},
              {"event": "step_start", "step": "prepare host", "host": "a", "time": 11.0},
              {"event": "step_start", "step": "prepare host", "host": "b", "time": 11.2},
              {"event": "step_end", "step": "prepare host", "host": "a", "time": 11.5},
              {"event": "step_end", "step": "prepare host", "host": "b", "time": 12.5},
              {"event": "step_start", "step": "join agents", "host": "b", "time": 12.5},
              {"event": "phase", "name": "kubeconfig", "start": 12.5, "seconds": 0.2, "time": 12.7},
              {"event": "step_end", "step": "join agents", "host": "b", "time": 13.0},
              {"event": "message", "text": "not json-able line follows"},
              {"event": "phase", "name": "second probe", "start": 13.0, "seconds": 0.3, "time": 13.3},
              {"event": "phase", "name": "cluster side", "start": 13.0, "seconds": 0.8, "time": 13.8},
              {"event": "command", "host": "a", "what": "run_with_archive", "start": 11.0, "seconds": 0.5,
               "time": 11.5},
              {"event": "exit", "time": 14.0}]
    text = "\n".join(json.dumps(e) for e in events) + "\nnot json\n"
    got = run.phases(text, 9.0)
    assert got["launch"] == 0.5 and got["connect"] == 0.5 and got["step: prepare host"] == 1.5
    assert got["steps"] == 2.0 and got["kubeconfig"] == 0.2 and got["reachability"] == 0.4
    # nested phases (reachability in preflight, the kubeconfig during a step, the second probe
    # during the cluster side) are not counted twice
    assert got["host side"] == 0.5 + 0.5 + 0.3 + 0.7 + 2.0
    assert got["cluster side total"] == 0.8 and got["other"] == round(5.0 - 4.0 - 0.8, 3)
    assert run.phases("", 9.0) == {}
    assert run.command_trace(text, 9.0, ["a"]) == [["a", "run_with_archive", 2.0, 0.5]]


def test_a_step_that_runs_again_later_is_its_own_span():
    """A new cluster used to prepare hosts, start its first server, then prepare the joiners
    again: one "prepare host" span from the first start to the last end held the server's
    start and the CA read too (the 11-14 "round trips" of prepare host in results.md)."""
    events = [{"event": "step_start", "step": "prepare host", "host": "a", "time": 1.0},
              {"event": "step_end", "step": "prepare host", "host": "a", "time": 1.2},
              {"event": "step_start", "step": "start server cp", "host": "cp", "time": 1.2},
              {"event": "step_end", "step": "start server cp", "host": "cp", "time": 3.0},
              {"event": "step_start", "step": "prepare host", "host": "a", "time": 3.5},
              {"event": "step_end", "step": "prepare host", "host": "a", "time": 3.7},
              {"event": "exit", "time": 4.0}]
    got = run.phases("\n".join(json.dumps(e) for e in events), 0.5)
    assert got["step: prepare host"] == 0.2 and got["step: prepare host (2)"] == 0.2
    assert got["step: start server cp"] == 1.8 and got["steps"] == 2.7


def test_round_trips_are_the_added_latency_over_the_rtt():
    direct = {"connect, probe, plan": 1.0, "cluster side": 2.0}
    slow = {"connect, probe, plan": 1.8, "cluster side": 4.0}
    assert run.round_trips(direct, slow, 100) == {"connect, probe, plan": 8.0, "cluster side": 20.0}



def test_repeated_runs_give_their_medians():
    def one(fresh, noop, helm):
        return {"agents": 3, "rtt_ms": 100, "fresh_up": {"seconds": fresh, "phases": {"helm": helm}, "trace": []},
                "noop_up": {"seconds": noop, "phases": {"probe": noop / 10}}}

    row = run.median_run([one(12.0, 2.5, 3.0), one(20.0, 2.0, 9.0), one(11.0, 3.0, 2.8)])
    assert row["fresh_up"]["seconds"] == 12.0 and row["noop_up"]["seconds"] == 2.5
    assert row["fresh_up"]["phases"] == {"helm": 3.0} and row["noop_up"]["phases"] == {"probe": 0.25}
    assert row["repeats"] == {"fresh_up": [12.0, 20.0, 11.0], "noop_up": [2.5, 2.0, 3.0]}
    assert run.median_run([one(1.0, 1.0, 1.0)])["fresh_up"]["seconds"] == 1.0
