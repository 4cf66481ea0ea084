"""The fleet's reads, by who reads them: the views every reader shares (`state`, kept
cheap by row revisions, `rows`); the reconciler's (`snapshot`, and the slower `inputs` it
keeps by revision); the gateway's (`routing`); the API's and ctl's (`listings`, `passes`,
`status`, `dry_runs`, `facility`, `installs`, `fabric`, `events`: the event log beside
the audit log); the catalog's model page (`charts`). Other apps read the fleet here.

May import: fleet.domain, fleet.models, fleet.protocol (its types), the kernel, and other
apps' front doors. Reads only: nothing here writes a row.
"""
