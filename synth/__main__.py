"""``python -m synth`` runs the CLI."""

from .cli import main

main()
