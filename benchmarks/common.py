"""What every benchmark does first: a database of its own, Django set up, tables made."""

from __future__ import annotations

import os
import tempfile


def django_ready() -> None:
    """Set Django up on DATABASE_URL's server when set, else SQLite in a fresh temporary
    LLMGW_HOME (or BENCH_HOME), and migrate it. Benchmarks empty the tables they fill:
    give them a database of their own."""
    if not os.environ.get("DATABASE_URL"):
        os.environ["LLMGW_HOME"] = os.environ.get("BENCH_HOME") or tempfile.mkdtemp(
            prefix="llmgw-bench-"
        )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
