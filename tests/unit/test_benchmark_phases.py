"""The benchmark's critical-path accounting (benchmarks/run.py): phases from --json events,
round trips from the same phase at 0 ms and at an added RTT."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import run  # noqa: E402


def test_steps_are_barriers_so_a_step_lasts_from_its_first_start_to_its_last_end():
    events = [{"event": "run_start", "time": 10.0},
              {"event": "step_start", "step": "prepare host", "host": "a", "time": 11.0},
              {"event": "step_start", "step": "prepare host", "host": "b", "time": 11.2},
              {"event": "step_end", "step": "prepare host", "host": "a", "time": 11.5},
              {"event": "step_end", "step": "prepare host", "host": "b", "time": 12.5},
              {"event": "message", "text": "not json-able line follows"},
              {"event": "exit", "time": 14.0}]
    text = "\n".join(json.dumps(e) for e in events) + "\nnot json\n"
    assert run.phases(text, 9.0) == {"connect, probe, plan": 2.0, "prepare host": 1.5, "cluster side": 1.5}
    assert run.phases("", 9.0) == {}


def test_round_trips_are_the_added_latency_over_the_rtt():
    direct = {"connect, probe, plan": 1.0, "cluster side": 2.0}
    slow = {"connect, probe, plan": 1.8, "cluster side": 4.0}
    assert run.round_trips(direct, slow, 100) == {"connect, probe, plan": 8.0, "cluster side": 20.0}

