"""Fitting alpha and bandwidth from nccl-tests output (synth/profile.py) and `synth profile fit`."""

import json
import random

import pytest
from hypothesis import example, given, settings
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


# nccl-tests' factors, written out here independently of the module under test:
# (latency steps of NCCL's algorithm, busbw / algbw, size / (count x 4 bytes), redop)
FACTORS = {"sendrecv": lambda n: (1, 1.0, 1, "sum"),
           "all_reduce": lambda n: (2 * (n - 1), 2 * (n - 1) / n, 1, "sum"),
           "all_gather": lambda n: (n - 1, (n - 1) / n, n, "none"),
           "reduce_scatter": lambda n: (n - 1, (n - 1) / n, n, "sum"),
           "alltoall": lambda n: (1, (n - 1) / n, n, "none")}


def nccl_tests_output(test: str, n: int, alpha_us: float, bw_GBps: float, noise: float, seed: int,
                      rank_lines: bool = True, wrong_rows: int = 0, announce: bool = True, nodes: int = 1,
                      header: bool = True, prefix: str = "", min_size: int = 8) -> str:
    """What nccl-tests' binaries print for a machine following the fitted model, with noise.

    ``nodes`` spreads the '#  Rank' lines over that many host names; ``header=False`` leaves out every '#'
    line (a header-less table); ``prefix`` is put before every line ("{rank}" is replaced by 0), as
    launchers do.
    """
    rng = random.Random(seed)
    steps, busf, per_count, redop = FACTORS[test](n)
    gpn = n // nodes
    ranks = "".join(f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on {f'node-{r // gpn}':>10s} device {r % gpn:2d} "
                    f"[0x{r:02x}] NVIDIA A100-SXM4-80GB\n" for r in range(n)) if rank_lines else ""
    lines = [f"# Collective test starting: {test}_perf\n"] if announce else []
    lines.append(HEADER.format(ranks=ranks))
    size = min_size
    k = 0
    while size <= 1 << 30:
        row = [f"{size:12d}", f"{size // (4 * per_count):12d}", f"{'float':>8s}", f"{redop:>6s}", f"{-1:6d}"]
        for _ in range(2):  # out-of-place, in-place
            t = (steps * alpha_us + busf * size / (bw_GBps * 1e3)) * (1 + rng.gauss(0, noise))
            algbw = size / t / 1e3
            wrong = 1 if k < wrong_rows else 0
            row += [f"{t:8.2f}", f"{algbw:6.2f}", f"{algbw * busf:6.2f}", f"{wrong:6d}"]
        lines.append("  ".join(row) + "\n")
        size *= 2
        k += 1
    lines.append(FOOTER)
    text = "".join(lines)
    if not header:
        text = "".join(l for l in text.splitlines(keepends=True) if not l.startswith("#"))
    if prefix:
        text = "".join(prefix + l for l in text.splitlines(keepends=True))
    return text


def _errors(fit, alpha, bw):
    return abs(fit.alpha_us / alpha - 1), abs(fit.bw_GBps / bw - 1)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("test,n,alpha,bw", [("sendrecv", 2, 4.5, 22.0), ("all_reduce", 8, 1.2, 180.0),
                                             ("sendrecv", 16, 9.0, 11.5), ("all_reduce", 16, 6.0, 12.5),
                                             ("all_gather", 8, 1.5, 150.0), ("reduce_scatter", 8, 2.0, 140.0),
                                             ("alltoall", 16, 12.0, 40.0)])
def test_fit_recovers_alpha_and_bandwidth_within_5_percent(tmp_path, seed, test, n, alpha, bw):
    f = tmp_path / "out.txt"
    f.write_text(nccl_tests_output(test, n, alpha, bw, noise=0.03, seed=seed))
    (fit,) = fit_nccl_tests([f])
    assert fit.test == test and fit.num_ranks == n and fit.samples == 2 * 28
    err_alpha, err_bw = _errors(fit, alpha, bw)
    assert err_alpha < 0.05 and err_bw < 0.05, (fit, err_alpha, err_bw)
    assert fit.rel_rms_error < 0.05
    steps, busf, _, _ = FACTORS[test](n)
    assert fit.predict_us(1 << 20) == pytest.approx(fit.alpha_us * steps + busf * (1 << 20) / (fit.bw_GBps * 1e3))
    assert not fit.warnings, fit.warnings


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
    with pytest.raises(InputError, match="--ranks: is 4 but the table's size/count and busbw/algbw columns say 8"):
        fit_nccl_tests([f], num_ranks=4)  # --ranks is checked against the table
    assert fit_nccl_tests([f], num_ranks=8)[0].num_ranks == 8


@pytest.mark.parametrize("text,match", [
    ("hello\n", "no nccl-tests result table"),
    ("# Collective test starting: broadcast_perf\n", "is not supported"),
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
    assert lines[1].startswith("  bandwidth means: bandwidth of the link between the pair")
    assert lines[2].startswith("  alpha fed by 8B..") and "relative RMS residual" in lines[2]
    assert lines[3].startswith("ib: all_reduce, 16 ranks")
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
_AG_ROWS = nccl_tests_output("all_gather", 8, 3.0, 20.0, 0.02, 7, header=False).splitlines(keepends=True)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(_ROWS + _AG_ROWS) | st.text(max_size=80), max_size=40),
       st.sampled_from([None, "sendrecv", "all_reduce", "all_gather", "alltoall"]),
       st.sampled_from(["", "[1,0]<stdout>:", " 3: "]))
@example(lines=[_ROWS[8], "\u00b9", "           8             2     float     sum      -1      2.99    0.00    0.00       0"
                "      3.03    0.00    0.00       0\n"], test=None, prefix="")   # a size starting with '¹'

def test_any_text_ends_in_a_fit_or_an_input_error(lines, test, prefix):
    try:
        table = parse_nccl_tests("".join(prefix + l for l in lines), "fuzz.txt", test)
        from backends.nccl.nccl_tests import fit_table
        fit = fit_table(table)
    except InputError:
        return
    assert fit.bw_GBps > 0 and fit.alpha_us >= 0


# ------------------------------------------------------------------ tables as people have them (issue 13)

@pytest.mark.parametrize("prefix", ["[1,0]<stdout>:", " 0: ", "[1,12]<stderr>: "],
                         ids=["tag-output prefix", "srun label prefix", "tag-output stderr prefix"])
def test_launcher_prefixes_are_stripped(tmp_path, prefix):
    """mpirun --tag-output ([1,0]<stdout>:) and srun --label ( 0: ) put a prefix before every line."""
    plain, tagged = tmp_path / "plain.txt", tmp_path / "tagged.txt"
    plain.write_text(nccl_tests_output("all_reduce", 8, 2.0, 100.0, 0.01, 3))
    tagged.write_text(nccl_tests_output("all_reduce", 8, 2.0, 100.0, 0.01, 3, prefix=prefix))
    (a,), (b,) = fit_nccl_tests([plain]), fit_nccl_tests([tagged])
    assert (b.test, b.num_ranks, b.samples) == ("all_reduce", 8, a.samples)
    assert (b.alpha_us, b.bw_GBps) == (a.alpha_us, a.bw_GBps)


@pytest.mark.parametrize("test,n", [("all_reduce", 8), ("reduce_scatter", 8), ("sendrecv", 4)])
def test_without_the_test_line_results_txt_is_told_by_its_table(tmp_path, test, n):
    """No '# Collective test starting' line and a neutral file name: the table's shape says the test."""
    f = tmp_path / "results.txt"
    f.write_text(nccl_tests_output(test, n, 2.0, 50.0, 0.0, 0, announce=False))
    (fit,) = fit_nccl_tests([f])
    assert (fit.test, fit.num_ranks) == (test, n)


@pytest.mark.parametrize("test", ["all_gather", "alltoall"])
def test_all_gather_and_alltoall_look_alike_so_the_error_says_how_to_name_them(tmp_path, test):
    f = tmp_path / "results.txt"
    f.write_text(nccl_tests_output(test, 8, 2.0, 50.0, 0.0, 0, announce=False))
    with pytest.raises(InputError, match="all_gather or alltoall .* pass --test"):
        fit_nccl_tests([f])
    (fit,) = fit_nccl_tests([f], test=test)
    assert fit.test == test and fit.num_ranks == 8 and abs(fit.bw_GBps / 50.0 - 1) < 0.01
    named = tmp_path / f"{test}_perf_8gpu.log"
    named.write_text(f.read_text())
    assert fit_nccl_tests([named])[0].test == test


def test_header_less_table_is_read_in_nccl_tests_column_order(tmp_path):
    """A header-less table (rows only, as pasted in issues): nccl-tests' own column order, ranks from busbw."""
    f = tmp_path / "pasted.txt"
    f.write_text(nccl_tests_output("all_reduce", 16, 5.0, 80.0, 0.0, 0, header=False))
    assert not any(line.startswith("#") for line in f.read_text().splitlines())
    (fit,) = fit_nccl_tests([f])
    assert (fit.test, fit.num_ranks) == ("all_reduce", 16)
    assert fit.alpha_us == pytest.approx(5.0, rel=0.02) and fit.bw_GBps == pytest.approx(80.0, rel=0.02)


def test_single_rank_line_is_an_error_not_a_traceback(tmp_path):
    """A single '#  Rank' line: ZeroDivisionError before; now the table's busbw tells the ranks, and a real
    1-rank run (busbw 0) is an error that says what to do."""
    text = nccl_tests_output("all_reduce", 8, 2.0, 100.0, 0.0, 0)
    lines = [l for l in text.splitlines(keepends=True) if not l.startswith("#  Rank") or "Rank  0" in l]
    f = tmp_path / "one.txt"
    f.write_text("".join(lines))
    (fit,) = fit_nccl_tests([f])          # only rank 0's line survived; the busbw column still says 8 ranks
    assert fit.num_ranks == 8
    f.write_text("".join(l if l.startswith("#") else _zero_busbw(l) for l in lines))
    with pytest.raises(InputError, match="one '#  Rank' line: a 1-rank all_reduce moves nothing"):
        fit_nccl_tests([f])
    result = CliRunner().invoke(main, ["profile", "fit", str(f)])
    assert result.exit_code == 1 and result.output.startswith("Error: ") and result.output.count("\n") == 1


def _zero_busbw(line: str) -> str:
    """nccl-tests' busbw on one rank is 0 (factor 2(n-1)/n with n = 1)."""
    tokens = line.split()
    if len(tokens) < 13:
        return line
    tokens[7] = tokens[11] = "0.00"
    return "  ".join(tokens) + "\n"


def test_ranks_option_is_checked_against_the_rank_lines(tmp_path):
    f = tmp_path / "ar.txt"
    f.write_text(nccl_tests_output("all_reduce", 8, 2.0, 100.0, 0.0, 0))
    with pytest.raises(InputError, match="--ranks: is 16 but the table's '#  Rank' lines say 8 ranks"):
        fit_nccl_tests([f], num_ranks=16)
    result = CliRunner().invoke(main, ["profile", "fit", str(f), "--ranks", "16"])
    assert result.exit_code == 1 and "'#  Rank' lines say 8 ranks" in result.output


def test_fit_quality_says_which_sizes_fed_alpha_and_which_the_bandwidth(tmp_path):
    f = tmp_path / "nvlink_sendrecv.txt"
    f.write_text(nccl_tests_output("sendrecv", 2, 4.0, 20.0, 0.0, 0))
    (fit,) = fit_nccl_tests([f])
    crossover = 4.0 * 20.0 * 1e3          # alpha x bw: below it the latency term dominates
    assert fit.alpha_sizes and max(fit.alpha_sizes) <= crossover < min(fit.bandwidth_sizes)
    assert set(fit.alpha_sizes) | set(fit.bandwidth_sizes) == {8 << k for k in range(28)}
    data = fit.to_dict()
    assert data["alpha_sizes"][0] == 8 and data["bandwidth_sizes"][-1] == 1 << 30 and data["warnings"] == []


def test_implausible_fits_are_flagged(tmp_path):
    """A sendrecv table that stops before the bandwidth regime with a huge alpha: both are named."""
    f = tmp_path / "sendrecv_small.txt"
    text = nccl_tests_output("sendrecv", 2, 509.0, 30.0, 0.0, 0)
    rows = [l for l in text.splitlines(keepends=True) if l.startswith("#") or int(l.split()[0]) <= 1 << 20]
    f.write_text("".join(rows))
    (fit,) = fit_nccl_tests([f])
    joined = " ".join(fit.warnings)
    assert "alpha 509 us is implausible" in joined
    assert "is above every measured row" in joined and "measure larger sizes" in joined
    noisy = tmp_path / "noisy_sendrecv.txt"
    noisy.write_text(nccl_tests_output("sendrecv", 2, 3.0, 20.0, 0.3, 5))
    (fit,) = fit_nccl_tests([noisy])
    assert any("relative RMS residual" in w and "is large" in w for w in fit.warnings)
    result = CliRunner().invoke(main, ["profile", "fit", str(f)])
    assert result.exit_code == 0 and "Warning: sendrecv_small: alpha 509 us is implausible" in result.output


def test_multi_node_all_reduce_is_a_bus_bandwidth_not_a_link(tmp_path):
    f = tmp_path / "ib_allreduce.txt"
    f.write_text(nccl_tests_output("all_reduce", 16, 8.0, 45.0, 0.0, 0, nodes=2))
    (fit,) = fit_nccl_tests([f])
    assert fit.num_nodes == 2 and "bus bandwidth across 2 nodes" in fit.bandwidth_means
    assert "not the bandwidth of one link" in fit.bandwidth_means
    result = CliRunner().invoke(main, ["profile", "fit", str(f)])
    assert "all_reduce, 16 ranks on 2 nodes" in result.output and "bus bandwidth 45" in result.output


def test_header_less_per_iteration_table_reads_the_in_place_time_column(tmp_path):
    """A header-less table printed with per-iteration timing (21 columns: i_min, i_max, i_p99, i_cv% after each
    #wrong): the in-place time is column 13, not column 9."""
    rows = []
    for k in range(20):
        size = 8 << k
        t = 3.0 + size / 20e3
        rows.append(f"{size} {size // 4} float sum -1 {t:.3f} 0 0 0 {t / 2:.3f} {t * 2:.3f} {t * 2:.3f} 1.0 "
                    f"{t:.3f} 0 0 0 {t / 2:.3f} {t * 2:.3f} {t * 2:.3f} 1.0")
    f = tmp_path / "sendrecv_iter.txt"
    f.write_text("\n".join(rows) + "\n")
    (fit,) = fit_nccl_tests([f])
    assert fit.samples == 40 and fit.rel_rms_error < 1e-3
    assert fit.alpha_us == pytest.approx(3.0, rel=1e-2) and fit.bw_GBps == pytest.approx(20.0, rel=1e-2)
