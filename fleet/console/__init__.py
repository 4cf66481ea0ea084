"""The cluster's, nodes' and NVLink pages: the views (`views`), their reads (`reads`,
`fabric`), forms (`forms`), and the samples the charts are drawn from (`samples`, for the
kernel's history).

May import: fleet.selectors, fleet.services, fleet.domain, fleet.models (to read),
fleet.protocol (its limits and names), the nodes' own operations as the API does (approve,
forget, logs, dispatch), the kernel, and other apps' front doors. Writes go through
fleet.services or those operations.
"""
