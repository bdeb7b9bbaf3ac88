"""``--json`` output is the only thing on standard output, whatever the solver prints (highspy >= 1.16 prints a
banner from C++ when its first model is made): a user pipes it straight into ``jq`` or ``json.load``."""

from __future__ import annotations

import json
import subprocess
import sys


def test_a_command_that_runs_highs_prints_only_json_on_stdout():
    # the Alltoall bound solves the concurrent-flow LP with HiGHS: a fresh process makes its first Highs() here
    done = subprocess.run([sys.executable, "-m", "synth", "bounds", "alltoall", "--topology", "dgx1", "--size", "1MB",
                           "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["collective"] == "alltoall" and report["limit_us"] > 0


def test_the_banner_goes_to_stderr_at_the_file_descriptor_level():
    code = ("import highspy, sys; from synth.solver.highs import new_highs; h = new_highs(highspy); "
            "h.setOptionValue('output_flag', False); print('only this')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "only this\n"
