"""A node's side of the control plane: its websocket (`consumers`), who it is (`identity`,
`connections`), what it registers (`registration`), what its heartbeats and reports say
(`heard`, `live`, `reports`, `failures`, `fabric`), telling it what to do (`dispatch`),
what it is asked for (`logs`, `upgrades`), the weights it may drop (`reclaim`), and the
figures the nodes page sorts by, written as they change (`figures`).

May import: fleet.protocol, fleet.models, fleet.domain, fleet.event_log, fleet.selectors,
fleet.services (a start command), the reconciler's bell (fleet.reconciler.wake) and its
lease's name, the kernel, and other apps' front doors. Not the console or the metrics.
"""
