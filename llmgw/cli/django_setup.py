"""Django set up for the ``llmgw`` commands that use the database: ``createtoken``,
``migrate`` and ``engines build --add``.

Its own module so that those commands' modules and the package's dispatcher
(``llmgw/cli/__init__.py``) import it, and not one another.
"""

from __future__ import annotations

import os


def setup_django() -> None:
    """Set Django up with llmgw's settings, unless the process already has."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django
    from django.apps import apps

    # Once a process: a second setup configures logging again, onto whatever
    # sys.stderr is then (in a test, a capture that is closed after it).
    if not apps.ready:
        django.setup()
