"""`manage.py lumastra <command>`: the operator CLI (docs/operations.md, "The operator CLI").

    runs [--task T] [--state S] [--since WHEN] [--input KEY=VALUE]... [--tag TAG]...
    show RUN | cancel RUN [--kill] | retry RUN [--fresh] | watch RUN
    pause TASK|CLASS --reason WHY [--refuse-starts] | resume TASK|CLASS
    schedules | dead-letters [--requeue] | limits

Every command acts as a named user (`--as`, or LUMASTRA_CLI_USER) with the permission the API
would require, prints a table (or, with `--json`, the API's document) and exits with a code
from `cli.exits`; the sub-commands live in `orchestrator.management.cli`.
"""

from __future__ import annotations

from argparse import RawDescriptionHelpFormatter
from typing import Any

from django.core.management.base import BaseCommand, CommandParser, DjangoHelpFormatter

from orchestrator.management.cli import (
    acting,
    arguments,
    dead_letters,
    exits,
    limits,
    pauses,
    runs,
    schedules,
    watch,
)
from orchestrator.management.cli.output import Output

MODULES = (runs, watch, pauses, schedules, dead_letters, limits)


class _Help(DjangoHelpFormatter, RawDescriptionHelpFormatter):
    """Django's order of options, and the exit-code table as it is written."""


class Command(BaseCommand):
    help = "Operate Lumastra from a terminal, as a named user, with exit codes scripts test."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        return super().create_parser(
            prog_name, subcommand, epilog=exits.TABLE, formatter_class=_Help, **kwargs
        )

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        common = arguments.common()
        for module in MODULES:
            module.register(commands, common)

    def handle(self, *args: Any, **options: Any) -> None:
        out = Output(self.stdout, self.stderr, options["json"])
        try:
            session = acting.session(options["acting_user"], options["needs"], out)
            code = options["handler"](session, options)
        except exits.Failure as failure:
            self.stderr.write(f"lumastra {options['command']}: {failure.message}")
            code = failure.code
        if code != exits.OK:
            raise SystemExit(code)
