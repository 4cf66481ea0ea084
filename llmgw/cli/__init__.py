"""`llmgw`: the one command an operator runs, dispatching to its subcommands."""

from __future__ import annotations

import sys

from .django_setup import setup_django

USAGE = """usage: llmgw COMMAND [ARGS]

commands:
  serve         run the control plane (pages, REST API, agents' websocket, reconciler when embedded)
  agent         run a node's agent: register the machine, start and stop engines
  sim-engine    run the simulated OpenAI-compatible engine
  demo          run a whole simulated cluster on this machine
  doctor        check what llmgw needs on this machine (server, credential, clock, GPUs, engines, disk)
  createtoken   create an admin token (or with --agent, an agent join token)
  createsuperuser  create a console login with every permission (Django's createsuperuser)
  changepassword   set a console login's password (Django's changepassword)
  migrate       create or update the database tables
  engines       build an engine once on this machine (llmgw engines build llamacpp)
  ctl           talk to a running control plane's REST API (llmgw ctl --help)
  upgrade       upgrade this machine's llmgw by hand and restart its service (the nodes: ctl upgrade)
  version       print llmgw's version
"""


def _manage(args: list[str]) -> int:
    setup_django()
    from django.core.management import call_command
    from django.core.management.base import CommandError

    try:
        call_command(*args)
    except CommandError as exc:
        sys.stderr.write(f"llmgw: {exc}\n")
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        # `llmgw ctl nodes | head`: the reader left; that is not an error worth a traceback.
        sys.stderr.close()
        return 0


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from .serve import main as serve

        return serve(rest)
    if command == "agent":
        from fleet.agent.main import main as agent

        return agent(rest)
    if command == "sim-engine":
        from llmgw.simengine import main as sim

        return sim(rest)
    if command == "demo":
        from .demo import main as demo

        return demo(rest)
    if command == "doctor":
        from .doctor import main as doctor

        return doctor(rest)
    if command == "engines":
        from .engines import main as engines

        return engines(rest)
    if command == "upgrade":
        from .upgrade import main as upgrade

        return upgrade(rest)
    if command == "ctl":
        from .ctl import main as ctl

        return ctl(rest)
    if command == "createtoken":
        return _manage(["createtoken", *rest])
    if command in ("createsuperuser", "changepassword"):
        return _manage([command, *rest])
    if command == "migrate":
        return _manage(["migrate", "--noinput", *rest])
    if command == "version":
        from llmgw import __version__

        print(__version__)
        return 0
    sys.stderr.write(f"llmgw: unknown command {command!r}\n\n{USAGE}")
    return 2
