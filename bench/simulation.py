"""How fast the simulator explores: schedules and store-and-owner requests per second, on one core.

    .venv/bin/python -m bench.simulation [--seconds 20]

Two workloads, in the library's own environment (the simulator needs greenlet, the ``simulate``
extra, which the benchmark's peers' environment does not have):

- ``order``: the reference — one run of ``sim.order`` (eleven steps, two effects) per schedule,
  two workers, and a person who acts about once a schedule, on SQLite in memory, faults at their
  configured rates (no swarm), each schedule checked;
- ``default``: what ``make simulate`` explores — three runs of the whole catalog, the person,
  every fault, each schedule drawing its own rates (swarm).

Figures are per core: the simulator is single-threaded, ``make simulate`` runs one process per
core. Run it on an idle machine; each workload alternates with the other in rounds, so a
disturbance hits both.
"""

from __future__ import annotations

import argparse
import time

from safepoint.testing.simulation import Config, run_schedule

WORKLOADS = {
    "order": Config(runs=1, workflows=("sim.order",), person_every_ms=1500, swarm=False),
    "default": Config(),
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.simulation")
    parser.add_argument("--seconds", type=float, default=20.0, help="per workload, in rounds of 2 s")
    args = parser.parse_args()
    totals = {name: [0, 0, 0, 0.0] for name in WORKLOADS}  # schedules, requests, actions, seconds
    seed = 1
    while min(t[3] for t in totals.values()) < args.seconds:
        for name, config in WORKLOADS.items():
            began = time.perf_counter()
            while time.perf_counter() - began < 2.0:
                done = run_schedule(config, seed=seed)
                seed += 1
                assert not done.violations, done.violations
                totals[name][0] += 1
                totals[name][1] += done.requests
                totals[name][2] += sum(1 for e in done.events if e.who == "person")
            totals[name][3] += time.perf_counter() - began
    for name, (schedules, requests, actions, seconds) in totals.items():
        print(
            f"{name:8} {schedules / seconds:7.0f} schedules/s  {requests / seconds:8.0f} requests/s"
            f"  ({requests / schedules:.0f} requests and {actions / schedules:.1f} person actions a schedule)"
        )


if __name__ == "__main__":
    main()
