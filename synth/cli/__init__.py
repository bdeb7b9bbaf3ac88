"""Command-line interface (click). Thin: parse options, call one library function, write output.

Every command lives in its own module of this package and is registered in :data:`COMMANDS`.
"""

from __future__ import annotations

import importlib

import click

from synth import __version__
from synth.cli._common import SynthGroup

# (module in synth.cli, attribute) for each top-level command or group, imported lazily by the group.
COMMANDS = {
    "topo": ("topo", "topo"),
    "solve": ("solve", "solve"),
    "check": ("check", "check"),
    "simulate": ("simulate", "simulate"),
    "bounds": ("bounds", "bounds"),
    "baseline": ("bounds", "baseline"),
    "profile": ("profile", "profile"),
    "export": ("export", "export"),
    "run": ("run", "run"),
    "pareto": ("pareto", "pareto"),
}


class LazyGroup(SynthGroup):
    """Imports a command's module only when it runs, so ``synth --help`` stays fast."""

    def list_commands(self, ctx):
        return sorted(n for n in COMMANDS if self._load(n) is not None)

    def get_command(self, ctx, name):
        return self._load(name)

    @staticmethod
    def _load(name):
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name]
        try:
            mod = importlib.import_module(f"synth.cli.{module}")
        except ModuleNotFoundError as exc:
            if exc.name == f"synth.cli.{module}":
                return None  # command not built yet
            raise
        return getattr(mod, attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="synth")
def main():
    """Synthesize, verify and time collective-communication algorithms (MSCCL XML) for GPU clusters."""
