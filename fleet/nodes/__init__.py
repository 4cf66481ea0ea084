"""A node's side of the control plane: its websocket (`consumers`), who it is (`identity`,
`connections`), what its heartbeats and reports say (`heard`, `live`, `reports`, `failures`),
what it is asked for (`logs`, `upgrades`, `engine_installs`), the weights it may drop
(`reclaim`), and the figures the nodes page sorts by, written as they change (`figures`).

May import: fleet.protocol, fleet.models, fleet.domain, fleet.event_log, fleet.selectors,
fleet.reconciler.wake, the kernel, and other apps' front doors. Not the console, the
metrics or the reconciler's pass.
"""
