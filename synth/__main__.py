"""``python -m synth`` runs the CLI."""

from synth.cli import main

main()
