"""The fleet's reads, by who reads them: the views every reader shares (`state`, kept
cheap by row revisions, `rows`), the API's and ctl's (`listings`, `dry_runs`, `status`,
`facility`), the gateway's (`routing`). Other apps read the fleet here.

May import: fleet.domain, fleet.models, the kernel, and other apps' front doors. Reads only:
nothing here writes a row.
"""
