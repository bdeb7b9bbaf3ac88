"""MSCCL: the program IR, lowering from a Schedule, rendering, the parser, and the analysis (lint, interpreter,
simulator) that judges any MSCCL XML file."""
