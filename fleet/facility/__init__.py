"""Where the facility's readings come from, and the pass step that turns them into each
domain's condition (docs/facility.md, "Conditions" and "Sources of readings").

- `config.py`: the sources file (LLMGW_FACILITY_SOURCES, YAML), read and checked into a
  `Config`: thresholds, the Prometheus signals, the simulated replay.
- `agents.py`: the nodes' own sensors (their heartbeats' inlet air and GPUs), per domain.
- `prometheus.py`: configured instant queries, their label naming the domain.
- `simulated.py`: a thermal event replayed from a file of timed readings, for tests and
  rehearsals on a cluster with no facility data.
- `observe.py`: `conditions_observe`, the reconciler's step: every source's samples,
  each domain's condition stepped (fleet/domain/conditions.py) and written when it moved.

It may import the fleet's models, its pure rules and `llmgw.core`; the rules stay in
`fleet/domain/conditions.py`, the holds' writes in `fleet/services.py`, the reads in
`fleet/selectors/conditions.py`.
"""
