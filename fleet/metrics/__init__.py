"""`/metrics` for the fleet: the series' names and text (`series`), the nodes' and GPUs'
(`by_node`), the models', replicas', quotas' and the reconciler's (`by_model`), one scrape
of them all (`collector`), the process that renders them (`renderer`) and the view
(`view`).

May import: fleet.selectors, fleet.domain, fleet.models (to read), the kernel, and other
apps' front doors. Reads only.
"""
