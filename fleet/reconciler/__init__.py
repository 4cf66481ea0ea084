"""The reconciler's shell around the pure rules (fleet.domain): take the pass lock, read the
snapshot (`snapshot`, with the slower inputs `inputs` keeps by revision), decide, apply and
record (`run`), tell agents (`dispatch`), and wake the next pass early (`wake`).

May import: fleet.domain, fleet.models, fleet.selectors, fleet.event_log, the kernel, and
other apps' front doors. Nothing outside this package takes the pass lock.
"""
