"""The cluster's and nodes' pages: the views (`views`), their reads (`reads`),
forms (`forms`), and the samples the charts are drawn from (`samples`, for the kernel's
history).

May import: fleet.selectors, fleet.services, fleet.domain, fleet.models (to read), the
kernel, and other apps' front doors. Writes go through fleet.services.
"""
