"""Command-line interface (click). Thin: parse options, call one library function, write output.

Every command lives in its own module of this package and is registered in :data:`COMMANDS`.
"""

from __future__ import annotations

import importlib

import click

from synth import __version__
from synth.cli._common import SynthGroup

# name -> (module in synth.cli, attribute, one-line help). ``synth --help`` lists commands from this table
# without importing them (so it never loads numpy, networkx or the solver).
COMMANDS = {
    "topo": ("topo", "topo", "List, inspect and import topologies."),
    "solve": ("solve", "solve", "Synthesize COLLECTIVE on a topology, verify it, and write MSCCL XML."),
    "check": ("check", "check", "Check that an MSCCL XML file loads in the runtimes and implements its collective."),
    "simulate": ("simulate", "simulate", "Time an MSCCL XML file or a schedule JSON on a topology."),
    "bounds": ("bounds", "bounds", "Lower bounds on COLLECTIVE's time: bandwidth and latency."),
    "baseline": ("bounds", "baseline", "Build, verify and time an NCCL-style baseline for COLLECTIVE."),
    "profile": ("profile", "profile", "Fit or measure link latency (us) and bandwidth (GB/s)."),
    "export": ("export", "export", "Export schedules for other runtimes."),
    "run": ("run", "run", "Run an MSCCL XML file on real processes and compare with torch."),
    "pareto": ("pareto", "pareto", "Explore the latency/bandwidth frontier and bundle the best per size."),
}


class LazyGroup(SynthGroup):
    """Imports a command's module only when it runs, so ``synth --help`` stays fast."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr, short_help = COMMANDS[name]
        command = getattr(importlib.import_module(f"synth.cli.{module}"), attr)
        command.short_help = short_help      # one source for the one-line help
        return command

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="synth")
def main():
    """Synthesize, verify and time collective-communication algorithms (MSCCL XML) for GPU clusters."""
