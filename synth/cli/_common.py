"""Shared CLI plumbing: error conversion, shared options, atomic output files."""

from __future__ import annotations

import sys

import click

from synth.errors import SynthError

EXIT_BAD_INPUT = 1
EXIT_USAGE = 2
EXIT_INFEASIBLE = 3


class SynthGroup(click.Group):
    """A click group that turns library errors into one ``Error: ...`` line and the documented exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SynthError as exc:
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("Error: interrupted", err=True)
            ctx.exit(130)


def echo_err(message: str) -> None:
    """Progress and summaries go to stderr; stdout is kept for --json."""
    click.echo(message, err=True)


def solver_options_for(time_limit_s: float = 60.0, time_limit_help: str | None = None, threads_help: str | None = None):
    """--time-limit, --mip-gap, --threads, --seed for a command that runs the solver (defaults per command)."""
    def decorate(func):
        options = [
            click.option("--time-limit", type=click.FloatRange(min=0.1), default=time_limit_s, show_default=True,
                         help=time_limit_help or "Solver wall-clock limit in seconds; the best schedule found by "
                                                 "then is used."),
            click.option("--mip-gap", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
                         help="Relative MIP gap at which the solver may stop."),
            click.option("--threads", type=click.IntRange(min=1), default=None,
                         help=threads_help or "Solver threads (default: HiGHS' choice)."),
            click.option("--seed", type=int, default=0, show_default=True, help="Solver random seed."),
        ]
        for option in reversed(options):
            func = option(func)
        return func
    return decorate


solver_options = solver_options_for()


def is_tty() -> bool:
    return sys.stderr.isatty()
