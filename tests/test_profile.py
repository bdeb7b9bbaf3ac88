"""Fitting alpha and bandwidth from nccl-tests output (synth/profile.py) and `synth profile fit`."""

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from click.testing import CliRunner

from synth.cli import main
from synth.errors import InputError
from backends.nccl.nccl_tests import fit_line, fit_nccl_tests, parse_nccl_tests

HEADER = """# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
{ranks}#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""
FOOTER = """# Out of bounds values : 0 OK
# Avg bus bandwidth    : 12.3456
#
"""


def nccl_tests_output(test: str, n: int, alpha_us: float, bw_GBps: float, noise: float, seed: int,
                      rank_lines: bool = True, wrong_rows: int = 0, announce: bool = True) -> str:
    """What sendrecv_perf / all_reduce_perf print for a machine following the fitted model, with noise."""
    rng = random.Random(seed)
    if test == "sendrecv":
        steps, volume, busf = 1, 1.0, 1.0
    else:
        steps, volume, busf = 2 * (n - 1), 2 * (n - 1) / n, 2 * (n - 1) / n
    ranks = "".join(f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on  node-{r // 8} device {r % 8:2d} [0x{r:02x}] "
                    f"NVIDIA A100-SXM4-80GB\n" for r in range(n)) if rank_lines else ""
    lines = [f"# Collective test starting: {test}_perf\n"] if announce else []
    lines.append(HEADER.format(ranks=ranks))
    size = 8
    k = 0
    while size <= 1 << 30:
        row = [f"{size:12d}", f"{size // 4:12d}", f"{'float':>8s}", f"{'sum':>6s}", f"{-1:6d}"]
        for _ in range(2):  # out-of-place, in-place
            t = (steps * alpha_us + volume * size / (bw_GBps * 1e3)) * (1 + rng.gauss(0, noise))
            algbw = size / t / 1e3
            wrong = 1 if k < wrong_rows else 0
            row += [f"{t:8.2f}", f"{algbw:6.2f}", f"{algbw * busf:6.2f}", f"{wrong:6d}"]
        lines.append("  ".join(row) + "\n")
        size *= 2
        k += 1
    lines.append(FOOTER)
    return "".join(lines)


def _errors(fit, alpha, bw):
    return abs(fit.alpha_us / alpha - 1), abs(fit.bw_GBps / bw - 1)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("test,n,alpha,bw", [("sendrecv", 2, 4.5, 22.0), ("all_reduce", 8, 1.2, 180.0),
                                             ("sendrecv", 16, 9.0, 11.5), ("all_reduce", 16, 6.0, 12.5)])
def test_fit_recovers_alpha_and_bandwidth_within_5_percent(tmp_path, seed, test, n, alpha, bw):
    f = tmp_path / "out.txt"
    f.write_text(nccl_tests_output(test, n, alpha, bw, noise=0.03, seed=seed))
    (fit,) = fit_nccl_tests([f])
    assert fit.test == test and fit.num_ranks == n and fit.samples == 2 * 28
    err_alpha, err_bw = _errors(fit, alpha, bw)
    assert err_alpha < 0.05 and err_bw < 0.05, (fit, err_alpha, err_bw)
    assert fit.rel_rms_error < 0.05
    assert fit.predict_us(1 << 20) == pytest.approx(fit.alpha_us * (1 if test == "sendrecv" else 2 * (n - 1))
                                                    + (1 if test == "sendrecv" else 2 * (n - 1) / n)
                                                    * (1 << 20) / (fit.bw_GBps * 1e3))


def test_exact_data_is_fitted_exactly():
    sizes = [8 << k for k in range(20)]
    fit = fit_line(sizes, [3.0 + s / 2.5e4 for s in sizes])
    assert fit.intercept_us == pytest.approx(3.0) and 1 / fit.slope_us_per_byte / 1e3 == pytest.approx(25.0)
    assert fit.rel_rms_error < 1e-9


def test_negative_intercept_is_clamped_to_zero():
    sizes = [1e3, 1e6, 1e9]
    fit = fit_line(sizes, [s / 1e4 - 0.05 for s in sizes])
    assert fit.intercept_us == 0.0 and fit.slope_us_per_byte > 0


def test_rows_with_wrong_results_are_skipped(tmp_path):
    f = tmp_path / "nvlink_sendrecv.txt"
    f.write_text(nccl_tests_output("sendrecv", 2, 5.0, 20.0, 0.0, 0, wrong_rows=3, announce=False))
    table = parse_nccl_tests(f.read_text(), str(f))
    assert table.test == "sendrecv" and table.skipped_rows == 3 and len(table.samples) == 2 * 25


def test_rank_count_falls_back_to_the_bus_bandwidth_factor(tmp_path):
    f = tmp_path / "ar.txt"
    f.write_text(nccl_tests_output("all_reduce", 8, 2.0, 100.0, 0.0, 0, rank_lines=False))
    (fit,) = fit_nccl_tests([f])
    assert fit.num_ranks == 8 and fit.alpha_us == pytest.approx(2.0, rel=1e-2)
    (fit,) = fit_nccl_tests([f], num_ranks=4)  # an explicit rank count wins
    assert fit.num_ranks == 4


@pytest.mark.parametrize("text,match", [
    ("hello\n", "cannot tell which nccl-tests binary"),
    ("# Collective test starting: alltoall_perf\n", "is not supported"),
    ("# Collective test starting: sendrecv_perf\n# nothing\n", "no nccl-tests result table"),
    ("# Collective test starting: sendrecv_perf\n# size count type redop root time algbw busbw #wrong\n",
     "no usable rows"),
    ("# Collective test starting: sendrecv_perf\n# size count type redop root time algbw busbw #wrong\n"
     "1024 256 float sum -1 3.0 0 0 0\n", "need at least two distinct sizes"),
])
def test_bad_output_is_an_input_error(tmp_path, text, match):
    f = tmp_path / "x.txt"
    f.write_text(text)
    with pytest.raises(InputError, match=match):
        fit_nccl_tests([f])


def test_cli_fit_prints_one_line_per_file_and_json(tmp_path):
    a, b = tmp_path / "nvlink.txt", tmp_path / "ib.txt"
    a.write_text(nccl_tests_output("sendrecv", 2, 3.0, 20.0, 0.01, 1))
    b.write_text(nccl_tests_output("all_reduce", 16, 8.0, 12.5, 0.01, 2))
    runner = CliRunner()
    result = runner.invoke(main, ["profile", "fit", str(a), str(b)])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("nvlink: sendrecv, 2 ranks, 56 samples: alpha 3") and "GB/s" in lines[0]
    assert lines[1].startswith("ib: all_reduce, 16 ranks")
    result = runner.invoke(main, ["profile", "fit", str(a), "--json", "--min-bytes", "1KB"])
    data = json.loads(result.output)
    assert data[0]["label"] == "nvlink" and data[0]["samples"] == 2 * 21
    assert abs(data[0]["bw_GBps"] / 20.0 - 1) < 0.05


def test_cli_fit_bad_file_is_one_error_line(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("nothing here")
    result = CliRunner().invoke(main, ["profile", "fit", str(f)])
    assert result.exit_code == 1 and result.output.startswith("Error: ") and result.output.count("\n") == 1


def test_profile_run_measures_pairs_and_writes_a_loadable_topology(tmp_path):
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        pytest.fail("PyTorch is not installed, so synth profile run cannot be tested: install the extra with "
                    "pip install -e '.[torch]'")
    from synth.model.topology import load_topology
    out = tmp_path / "measured.json"
    result = CliRunner().invoke(main, ["profile", "run", "--nprocs", "3", "--backend", "gloo", "--sizes",
                                       "256KB,4MB,16MB", "--iters", "3", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    t = load_topology(str(out))
    assert t.num_ranks == 3 and len(t.links) == 6
    assert all(l.alpha_us >= 0 and l.bw_GBps > 0 for l in t.links)
    data = json.loads(result.output[result.output.index("{"):])
    assert data["backend"] == "gloo" and [(p["a"], p["b"]) for p in data["pairs"]] == [(0, 1), (0, 2), (1, 2)]


@pytest.mark.parametrize("args", [["profile", "fit"], ["profile", "run"], ["export", "nccl-graph"], ["run"],
                                  ["topo", "import-nccl"]])
def test_new_commands_have_help(args):
    result = CliRunner().invoke(main, args + ["--help"])
    assert result.exit_code == 0 and len(result.output.split("\n\n")[1].strip()) > 20


_ROWS = nccl_tests_output("sendrecv", 2, 3.0, 20.0, 0.02, 7).splitlines(keepends=True)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(_ROWS) | st.text(max_size=80), max_size=40), st.sampled_from([None, "all_reduce"]))
def test_any_text_ends_in_a_fit_or_an_input_error(lines, test):
    try:
        table = parse_nccl_tests("".join(lines), "fuzz.txt", test or "sendrecv")
        from backends.nccl.nccl_tests import fit_table
        fit = fit_table(table)
    except InputError:
        return
    assert fit.bw_GBps > 0 and fit.alpha_us >= 0
