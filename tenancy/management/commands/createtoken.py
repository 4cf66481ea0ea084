"""`llmgw createtoken [--agent] NAME`: a new admin (or agent join) token, printed once."""

from django.core.management.base import BaseCommand, CommandError

from tenancy.models import Token
from tenancy.services import token_create


class Command(BaseCommand):
    help = "Create an admin token for the REST API (or, with --agent, a join token for agents)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="who or what uses the token; recorded beside its changes")
        parser.add_argument("--agent", action="store_true", help="a join token for llmgw agent")

    def handle(self, *args, name, agent, **options):
        kind = Token.AGENT if agent else Token.ADMIN
        try:
            _, secret = token_create(name=name, kind=kind)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Created {kind} token {name!r}. It is shown once; keep it now:")
        self.stdout.write(secret)
