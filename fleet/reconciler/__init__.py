"""The reconciler's shell around the pure rules (fleet.domain): take the pass lock, read
the snapshot (fleet.selectors.snapshot), decide, apply and record, and tell agents
(`run`); wake the next pass early (`wake`, which anything may ring).

May import: fleet.domain, fleet.models, fleet.selectors, fleet.nodes (to tell agents and
reclaim weights), fleet.services (to apply a plan), fleet.event_log, the kernel, and
other apps' front doors. Nothing outside this package takes the pass lock.
"""
