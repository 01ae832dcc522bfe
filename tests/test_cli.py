"""The ``mla-ext`` command on the CPU with tiny sizes: ``decode`` (every model preset, JSON report,
verification recorded per layer kind, a deliberately wrong row caught, the roofline PNG, argument
errors) and ``merge``."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from mla_ext import cli
from mla_ext.models import MODELS, get_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--device", "cpu", "--batch", "2", "--context", "600", "--steps", "1", "--sets", "2", "--no-progress"]


def run_decode(tmp_path, *extra):
    path = tmp_path / "decode.json"
    rc = cli.main(["decode", *TINY, "--json", str(path), *extra])
    return rc, (json.loads(path.read_text()) if path.exists() else None)


def check_report(rep, model, kinds, batches, T_per_batch):
    assert rep["model"] == model.name and rep["heads_per_gpu"] == model.num_heads // rep["tp"]
    assert rep["kinds"] == kinds
    assert rep["verification"]["ok"] and rep["failures"] == []
    assert set(rep["verification"]["per_kind"]) == set(kinds)
    for kind in kinds:
        assert rep["verification"]["per_kind"][kind]["verified_rows"] >= 3
        assert rep["verification"]["per_kind"][kind]["ok"]
    assert [b["batch"] for b in rep["batches"]] == batches
    assert rep["ceilings"]["copy_GBps"] > 0 and rep["ceilings"]["matmul_TFLOPs"] > 0
    for b in rep["batches"]:
        assert [r["kind"] for r in b["rows"]] == kinds
        assert b["step_layers"] == sum(len(model.layers_of(k)) for k in kinds)
        for r in b["rows"]:
            assert r["T"] == T_per_batch(b["batch"]) and r["H"] == rep["heads_per_gpu"]
            assert r["layers"] == len(model.layers_of(r["kind"]))
            assert r["verify_ok"] and r["verified_rows"] >= 3
            assert 0 <= r["max_out_err"] <= r["out_tol"] and 0 <= r["max_lse_err"] <= r["lse_tol"]
            assert r["us"] > 0 and r["rows"] > 0 and r["kv_MB"] > 0 and r["GBps"] > 0 and r["TFLOPs"] > 0
            assert r["pct_roofline"] > 0 and r["bound"] in ("memory", "compute")
            assert r["step_us"] == pytest.approx(r["us"] * r["layers"])
        assert b["step_sum_us"] == pytest.approx(sum(r["step_us"] for r in b["rows"]))
        assert b["step_measured_us"] > 0 and b["cache_bytes"] > 0


def test_model_presets():
    flash, pro, v32 = (get_model(n) for n in ("deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v3.2"))
    assert flash.kind_counts() == {"v4_swa": 2, "v4_c4": 21, "v4_c128": 20} and flash.num_heads == 64
    assert flash.layers_of("v4_swa") == [0, 1] and flash.layers_of("v4_c4")[:3] == [2, 4, 6]
    assert pro.kind_counts() == {"v4_c128": 31, "v4_c4": 30} and pro.num_heads == 128
    assert pro.layers_of("v4_c128")[:3] == [0, 1, 3] and pro.layers_of("v4_c4")[-1] == 60
    assert v32.kind_counts() == {"v32": 61} and v32.topk == {"v32": 2048}
    assert flash.topk == {"v4_c4": 512} and pro.topk == {"v4_c4": 1024}
    assert [m.heads_per_gpu(8) for m in MODELS.values()] == [8, 16, 16]
    with pytest.raises(ValueError, match="divide"):
        flash.heads_per_gpu(3)
    with pytest.raises(ValueError, match="no such layers"):
        pro.select("swa")
    assert flash.select("all") == ["v4_swa", "v4_c4", "v4_c128"] and flash.select("c128") == ["v4_c128"]


@pytest.mark.parametrize("model", list(MODELS))
def test_decode_every_model(tmp_path, capsys, model):
    rc, rep = run_decode(tmp_path, "--model", model)
    out = capsys.readouterr().out
    assert rc == 0, out
    m = get_model(model)
    check_report(rep, m, m.kinds, [2], lambda b: b)
    assert "attention per decode step" in out and "ok (" in out


def test_decode_mtp_bf16_layer_subset(tmp_path, capsys):
    rc, rep = run_decode(tmp_path, "--model", "deepseek-v4-pro", "--layers", "c4", "--mtp", "1",
                         "--kv-format", "bf16", "--batch", "1,2")
    assert rc == 0, capsys.readouterr()
    check_report(rep, get_model("deepseek-v4-pro"), ["v4_c4"], [1, 2], lambda b: 2 * b)
    assert rep["kv_format"] == "bf16" and all(r["kv_format"] == "bf16" for b in rep["batches"] for r in b["rows"])


@pytest.mark.parametrize("model,fmt", [("deepseek-v4-flash", "fp8_ds_mla_v4_fnuz"),
                                       ("deepseek-v3.2", "fp8_ds_mla_fnuz")])
def test_decode_fnuz_caches(tmp_path, capsys, model, fmt):
    layers = "c4" if "v4" in model else "all"
    rc, rep = run_decode(tmp_path, "--model", model, "--layers", layers, "--kv-format", fmt)
    assert rc == 0, capsys.readouterr()
    m = get_model(model)
    check_report(rep, m, m.select(layers), [2], lambda b: b)
    assert rep["kv_format"] == fmt and all(r["kv_format"] == fmt for b in rep["batches"] for r in b["rows"])


def test_decode_catches_a_wrong_row(tmp_path, capsys):
    # --test-perturb KIND:TOKEN corrupts that token of the first input set after the op ran
    rc, rep = run_decode(tmp_path, "--test-perturb", "v4_c4:1")
    err = capsys.readouterr().err
    assert rc == 1
    assert "FAILED verification" in err and "v4_c4" in err and "token 1 " in err and "layers 2, 6" in err
    assert not rep["verification"]["ok"] and not rep["verification"]["per_kind"]["v4_c4"]["ok"]
    assert rep["verification"]["per_kind"]["v4_c128"]["ok"]
    [f] = rep["failures"]
    assert (f["kind"], f["set"], f["token"], f["batch"]) == ("v4_c4", 0, 1, 2)
    assert "output error" in f["problem"]


def test_decode_context_parallel_gloo(tmp_path, capsys):
    # --cp 2 on the CPU: two gloo processes per layer kind, checked against single-device decode
    path = tmp_path / "cp.json"
    rc = cli.main(["decode", "--device", "cpu", "--cp", "2", "--layers", "c4", "--model", "deepseek-v4-pro",
                   "--batch", "2", "--context", "1024", "--steps", "1", "--no-progress", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    rep = json.loads(path.read_text())
    assert rep["cp"] == 2 and [r["kind"] for r in rep["runs"]] == ["C4"]
    [run] = rep["runs"]
    assert run["ok"] and run["world"] == 2 and run["layers"] == 30 and len(run["ranks"]) == 2
    assert all(r["out_err"] <= 2e-2 and r["lse_err"] <= 1e-3 for r in run["ranks"])
    # the ranks split the run's threads (OMP_NUM_THREADS where set, else the cores); the
    # single-process baseline gets them all
    from mla_ext.parallel.runner import cpu_threads
    threads = cpu_threads()
    assert [r["threads"] for r in run["ranks"]] == [max(1, threads // 2)] * 2 and run["single_threads"] == threads
    assert "context parallel over 2 ranks" in out


def test_decode_context_parallel_longest_context(capsys):
    """--cp at the longest --context the command takes: the per-request lengths drawn around it
    (up to 5/4 of it) are capped at that length, as the runner requires (the runner refused them:
    another program's usage text and exit 1 for any --context above 4/5 of the limit)."""
    rc = cli.main(["decode", "--device", "cpu", "--cp", "2", "--layers", "swa", "--batch", "1",
                   "--context", str(cli.MAX_CONTEXT), "--steps", "1", "--no-progress"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert f"--context {cli.MAX_CONTEXT * 3 // 4} {cli.MAX_CONTEXT} " in cap.out
    assert "context parallel over 2 ranks" in cap.out


def test_decode_context_parallel_needs_a_gpu_per_rank(monkeypatch, capsys):
    """--cp N on a GPU with fewer than N visible GPUs: exit 2 before any run (each run used to
    fail in the runner, exit 1). The GPU and its count are faked."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    rc = cli.main(["decode", "--device", "cuda", "--cp", "4", "--layers", "swa", "--batch", "1", "--no-progress"])
    assert rc == 2
    assert "--cp 4 on cuda needs 4 visible GPUs (one per rank), found 2" in capsys.readouterr().err


def test_decode_context_parallel_runner_refusal_is_a_usage_error(monkeypatch, capsys):
    """Arguments the runner refuses are found before any run starts: exit 2 naming the run and
    the refusal, not exit 1 (a failed verification) after other runs."""
    from mla_ext.parallel import runner

    started = []
    monkeypatch.setattr(runner, "_usage_error", lambda a: "refused" if a.layer == "v4_c128" else None)
    monkeypatch.setattr(runner, "main", lambda argv: started.append(argv))
    rc = cli.main(["decode", "--device", "cpu", "--cp", "2", "--layers", "all", "--batch", "1",
                   "--context", "1024", "--steps", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and started == []
    assert "mla-ext decode --cp: error: C128 batch 1: refused" in err


@pytest.mark.parametrize("argv", [
    ["decode", "--context", "0"], ["decode", "--steps", "0"], ["decode", "--sets", "0"], ["decode", "--cp", "0"],
    ["decode", "--device", "meta"], ["decode", "--plot", "/nonexistent-dir/x.png"],
    ["decode", "--json", "/nonexistent-dir/x.json"], ["decode", "--json", "/"], ["decode", "--plot", "/"],
    ["decode", "--plot", "/x.txt"], ["decode", "--context", "2097153"], ["decode", "--batch", "100000000000000"],
    ["decode", "--json", "/tmp/mla-ext-same.png", "--plot", "/tmp/mla-ext-same.png"],
    ["decode", "--cp", "2", "--plot", "/tmp/mla-ext-cp.png"], ["decode", "--cp", "2", "--sets", "2"],
    ["merge", "--json", "/"], ["merge", "--num-tokens", "0"], ["merge", "--num-heads", "-3"],
    ["merge", "--head-size", "0"], ["merge", "--device", "meta"], ["merge", "--json", "/nonexistent-dir/x.json"]])
def test_bad_arguments_exit_2_before_any_work(argv, capsys):
    assert cli.main(argv + ["--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and argv[1] in err


def _overcommit_policy() -> int:
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return int(f.read())
    except (OSError, ValueError):
        return -1


@pytest.mark.parametrize("argv", [["merge", "--device", "cpu", "--num-tokens", "99999999999999"],
                                  ["decode", "--device", "cpu", "--batch", "100000000000", "--context", "256",
                                   "--layers", "swa", "--steps", "1"]])
def test_out_of_memory_exits_4(argv, capsys):
    """A shape the host cannot hold: exit 4 with a one-line hint (not a traceback and exit 1,
    the code for a failed verification). The merge's first allocation passes the 2^47-byte
    address space, refused whatever the overcommit policy; the decode's (1.6 TB of per-request
    context lengths: the op's num_tokens x num_heads limit keeps it below 2^47) is refused by
    the kernel's default heuristic, but a host with vm.overcommit_memory = 1 grants it and then
    kills the process that fills it (a 16-core GPU host's test worker died so)."""
    if argv[0] == "decode" and _overcommit_policy() == 1:
        pytest.skip("vm.overcommit_memory = 1: the allocation would be granted, then the process killed")
    assert cli.main(argv + ["--no-progress"]) == 4
    err = capsys.readouterr().err
    assert f"mla-ext {argv[0]}: out of memory on cpu" in err and "can't allocate memory" in err


@pytest.mark.parametrize("value", ["4,,8", "4,", "", "4,x"])
def test_int_lists_refuse_empty_and_non_integer_entries(value, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["decode", "--batch", value, "--no-progress"])
    assert e.value.code == 2
    assert "expected a comma list of integers" in capsys.readouterr().err


def test_decode_bad_arguments(tmp_path, capsys):
    assert run_decode(tmp_path, "--tp", "3")[0] == 2
    assert "must divide the 64 heads" in capsys.readouterr().err
    # each bad size named with its own bound and value (they shared one message)
    for argv, words in ((("--tp", "0"), "--tp must be >= 1 (GPUs the heads are split over), got 0"),
                        (("--batch", "2,-1"), "--batch must be >= 1, got -1"),
                        (("--context", "0"), "--context must be >= 1, got 0"),
                        (("--steps", "0"), "--steps must be >= 1, got 0"),
                        (("--mtp", "-1"), "--mtp must be >= 0, got -1")):
        assert run_decode(tmp_path, *argv)[0] == 2
        assert words in capsys.readouterr().err
    assert run_decode(tmp_path, "--model", "deepseek-v4-pro", "--layers", "swa")[0] == 2
    assert "has no such layers" in capsys.readouterr().err
    assert run_decode(tmp_path, "--kv-format", "fp8_ds_mla")[0] == 2
    assert "--kv-format" in capsys.readouterr().err
    assert run_decode(tmp_path, "--test-perturb", "v32:0")[0] == 2


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_decode_plot(tmp_path, capsys):
    png = tmp_path / "roofline.png"
    rc, _ = run_decode(tmp_path, "--batch", "1,2", "--plot", str(png))
    assert rc == 0, capsys.readouterr()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_decode_plot_suffix(tmp_path, capsys):
    """--plot without a suffix writes (and reports) NAME.png; .svg writes an SVG."""
    rc, _ = run_decode(tmp_path, "--plot", str(tmp_path / "chart"))
    out = capsys.readouterr().out
    assert rc == 0 and f"roofline chart written to {tmp_path / 'chart.png'}" in out
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "chart").exists()
    rc, _ = run_decode(tmp_path, "--plot", str(tmp_path / "chart.svg"))
    assert rc == 0 and b"<svg" in (tmp_path / "chart.svg").read_bytes()[:2000]


def test_out_paths_probe_leaves_no_file(tmp_path):
    """The up-front write probe of --json / --plot: a new file is removed again, an existing one
    keeps its bytes; an unwritable path is refused with the reason."""
    assert cli._check_out_paths(json=str(tmp_path / "new.json")) is None and not (tmp_path / "new.json").exists()
    old = tmp_path / "old.json"
    old.write_text("keep")
    assert cli._check_out_paths(json=str(old)) is None and old.read_text() == "keep"
    if sys.platform.startswith("linux"):  # a folder nobody can create files in, root included
        msg = cli._check_out_paths(json="/proc/self/x.json")
        assert msg is not None and msg.startswith("--json /proc/self/x.json: cannot write it")


def test_out_paths_probe_keeps_symlinks(tmp_path, capsys):
    """A --json that is a dangling symbolic link: the probe leaves the link (and no target)
    behind, and the report is written through it."""
    link, target = tmp_path / "link.json", tmp_path / "out" / "report.json"
    target.parent.mkdir()
    link.symlink_to(target)
    assert cli._check_out_paths(json=str(link)) is None
    assert link.is_symlink() and not target.exists()
    rc, rep = run_decode(tmp_path, "--json", str(link))
    assert rc == 0 and link.is_symlink() and json.loads(target.read_text())["verification"]["ok"]


def test_decode_plot_failure_exits_3(tmp_path, capsys, monkeypatch):
    """A chart that cannot be saved (e.g. a backend's missing tool) costs the chart only: one line,
    exit 3, the report written; pgf (needs TeX) is not offered as a suffix."""
    from mla_ext import bench

    def fail(report, path):
        raise RuntimeError("no such backend tool\nsecond line")

    monkeypatch.setattr(bench, "plot_decode_roofline", fail)
    rc, rep = run_decode(tmp_path, "--plot", str(tmp_path / "c.png"))
    err = capsys.readouterr().err
    assert rc == 3 and rep["verification"]["ok"]
    assert f"--plot {tmp_path / 'c.png'} not written: no such backend tool" in err and "second line" not in err
    assert cli._plot_path("x.pgf")[1] is not None and cli._plot_path("x.PNG") == ("x.PNG", None)


def test_decode_context_below_query_tokens_is_said(tmp_path, capsys):
    rc, rep = run_decode(tmp_path, "--context", "1", "--mtp", "2")
    assert rc == 0 and rep["verification"]["ok"]
    assert "--context 1 is below 1 + --mtp = 3 query tokens per request" in capsys.readouterr().err


def test_decode_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    png = tmp_path / "roofline.png"
    rc, rep = run_decode(tmp_path, "--plot", str(png))
    cap = capsys.readouterr()
    assert rc == 3 and not png.exists()
    assert "matplotlib is not installed" in cap.err
    assert rep["verification"]["ok"] and "attention per decode step" in cap.out  # the rest ran


def test_decode_command_line_defaults(tmp_path):
    # `python3 -m mla_ext.cli decode` with its CPU defaults (what `make run` runs on a CPU machine)
    path = tmp_path / "d.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "mla_ext.cli", "decode", "--device", "cpu", "--json", str(path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(path.read_text())
    assert rep["model"] == "deepseek-v4-flash" and rep["tp"] == 8 and rep["verification"]["ok"]
    assert [b["batch"] for b in rep["batches"]] == [4] and rep["context"] == 4096
    assert "DeepSeek-V4-Flash: 43 layers (2 SWA, 21 C4, 20 C128)" in p.stdout


def test_merge(tmp_path, capsys):
    path = tmp_path / "merge.json"
    rc = cli.main(["merge", "--device", "cpu", "--num-tokens", "8,33", "--num-heads", "4", "--no-progress",
                   "--json", str(path)])
    assert rc == 0, capsys.readouterr()
    rep = json.loads(path.read_text())
    assert rep["command"] == "merge" and [(r["T"], r["H"]) for r in rep["rows"]] == [(8, 4), (33, 4)]
    assert all(r["max_rel_err"] <= 2e-2 and r["max_lse_err"] <= 1e-5 and r["us"] > 0 for r in rep["rows"])


def test_merge_fails_on_a_wrong_lse(monkeypatch, capsys):
    """The merged LSE is verified on its own tolerance (1e-3 nats): an op whose outputs are right
    and whose LSE is 0.01 off fails the command (exit 1). The LSE error used to be folded into
    the output's relative error x 1e-3, so any LSE error below 20 nats passed."""
    import mla_ext._ops as ops

    real = ops.merge_attn_states

    def off(output, output_lse, *a, **k):
        real(output, output_lse, *a, **k)
        output_lse.add_(0.01)

    monkeypatch.setattr(ops, "merge_attn_states", off)
    assert cli.main(["merge", "--device", "cpu", "--num-tokens", "8", "--num-heads", "4", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "FAILED verification" in err and "lse error 0.01 (tolerance 0.001)" in err


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.parametrize("model", list(MODELS))
def test_decode_gpu(tmp_path, capsys, model):
    # the GPU path: L2-cold rotations, CUDA-graph timing of each kind and of the whole step, the
    # GPU tolerances, measured copy / bf16 matmul ceilings
    path = tmp_path / "gpu.json"
    rc = cli.main(["decode", "--device", "cuda", "--model", model, "--batch", "1,16", "--context", "8192",
                   "--mtp", "1", "--steps", "3", "--no-progress", "--json", str(path)])
    assert rc == 0, capsys.readouterr()
    rep = json.loads(path.read_text())
    m = get_model(model)
    check_report(rep, m, m.kinds, [1, 16], lambda b: 2 * b)
    assert rep["ceilings"]["matmul_dtype"] == "bfloat16" and rep["ceilings"]["copy_GBps"] > 500
    assert all(r["sets"] >= 2 for b in rep["batches"] for r in b["rows"])
    rc = cli.main(["decode", "--device", "cuda", "--model", model, "--batch", "4", "--context", "4096", "--steps", "2",
                   "--no-progress", "--test-perturb", f"{m.kinds[-1]}:3"])
    assert rc == 1 and f"{m.kinds[-1]}) input set 0" in capsys.readouterr().err


@pytest.mark.parametrize("layer", ["v4_swa", "v4_c128_mixed"])
def test_measure_decode_cpu(layer):
    """benchmarks/bench_decode.py's per-shape measurement (build, verify, time) on the CPU: the
    row it returns has the verified error and the metrics, and no gather ceiling off the GPU."""
    from mla_ext.bench import measure_decode

    row = measure_decode(layer, 8, 2, copy_gbs=10.0, mm_tflops=1.0, device="cpu")
    assert row["layer"] == layer and row["H"] == 8 and row["T"] == 2
    assert 0.0 <= row["max_rel_err"] < 2e-2
    assert row["us"] > 0 and row["rows"] > 0 and row["kv_MB"] > 0
    assert "gather_us" not in row


def test_compare_to_baseline():
    """bench_decode.py --baseline: rows measured in two runs (here on the CPU, through the JSON
    round trip the script does) get us_base and vs_base = us / us_base where (layer, H, T)
    match; unmatched shapes and shapes without a positive time (out of memory: NaN) get
    neither."""
    import json
    import math

    from mla_ext.bench import compare_to_baseline, measure_decode

    kw = dict(copy_gbs=10.0, mm_tflops=1.0, device="cpu")
    base = json.loads(json.dumps({"rows": [measure_decode("v4_swa", 8, 2, **kw),
                                           dict(layer="v32", H=8, T=2, us=float("nan"))]}))["rows"]
    rows = [measure_decode("v4_swa", 8, 2, **kw), measure_decode("v4_swa", 16, 2, **kw),
            dict(layer="v32", H=8, T=2, us=7.0)]
    assert compare_to_baseline(rows, base) == 1
    assert rows[0]["us_base"] == base[0]["us"] > 0
    assert math.isclose(rows[0]["vs_base"], rows[0]["us"] / base[0]["us"])
    assert all("us_base" not in r and "vs_base" not in r for r in rows[1:])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without a GPU gets")
@pytest.mark.parametrize("folder,script", [("benchmarks", "bench_merge.py"), ("benchmarks", "bench_merge_n.py"),
                                           ("benchmarks", "bench_decode.py"),
                                           ("tests/gpu_dev", "kernel_durations.py"),
                                           ("tests/gpu_dev", "splits_sweep.py"), ("tests/gpu_dev", "head_tile_sweep.py")])
def test_benchmarks_stop_cleanly_without_a_gpu(folder, script):
    """The GPU benchmarks and sweeps exit with status 1 and one line naming the script, not a
    traceback."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, os.path.join(root, folder, script)], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"{script}: this benchmark needs a CUDA/ROCm GPU; torch {torch.__version__} sees "
                                "none (on the CPU, `mla-ext decode` and `mla-ext merge` verify and time small sizes)")


def test_parse_decode_shapes():
    """The sweeps' --shapes: layer:num_heads:num_tokens items of DECODE_LAYERS, a ValueError
    naming the first bad item."""
    from mla_ext.bench import parse_decode_shapes

    assert parse_decode_shapes("v4_c128:8:1,v32:128:64") == [("v4_c128", 8, 1), ("v32", 128, 64)]
    for bad in ("v4_c4:8:1", "v4_c128:8", "v4_c128:x:1", "v4_c128:8:1,v32:-1:1", ""):
        with pytest.raises(ValueError, match="layer:num_heads:num_tokens"):
            parse_decode_shapes(bad)


def test_decode_sets_pass_num_splits_cpu():
    """DecodeSets.calls(workspace, num_splits) reaches the op: one split needs no workspace,
    four refuse an empty one; the one-split results match the float64 reference."""
    from mla_ext.bench import build_layer_sets, verify_decode_sets

    ds = build_layer_sets("v4_c4_flash", num_tokens=2, num_heads=8, device="cpu")
    empty = torch.empty(0, dtype=torch.uint8)
    ds.poison()
    for fn in ds.calls(empty, 1):
        fn()
    assert max(v["out_err"] for v in verify_decode_sets(ds, {0: [0, 1]})) < 2e-2
    with pytest.raises(RuntimeError, match="workspace"):
        ds.calls(empty, 4)[0]()


def test_benchmark_rotations_span_256_mib():
    """Every decode benchmark shape (and the merge benchmark's smallest call) rotates through input
    sets whose selected rows (bytes moved) span at least 256 MiB, so no timed call finds its
    inputs in the L2 (50 MB on the H200): the caps of 64 (merge) and 16 (decode) sets had kept calls
    under 4 MiB L2-resident. And the sets a one-token call needs stay within a few GB of caches."""
    from mla_ext.bench import (DECODE_LAYERS, L2_FLUSH_BYTES, decode_num_sets, decode_rows_per_token,
                               merge_bytes, num_rotations)
    from mla_ext.builders import LAYER_KINDS
    from mla_ext.formats import kv_bytes_per_row

    for layer, (kind, topk, ctx) in DECODE_LAYERS.items():
        k = LAYER_KINDS[kind]
        per_token = decode_rows_per_token(kind, ctx[1], topk) * kv_bytes_per_row(k.default_format, k.d_qk)
        for T in (1, 4, 16, 64, 128, 512):
            sets = decode_num_sets(kind, T, ctx[1], topk)
            assert sets * T * per_token >= L2_FLUSH_BYTES, (layer, T, sets)
            assert sets == 2 or (sets - 1) * T * per_token < L2_FLUSH_BYTES, (layer, T, sets)  # no more than needed
    assert decode_num_sets("v4_swa", 1, 65536) == 3592 and decode_num_sets("v32", 1, 65536, 2048) == 200
    nbytes = merge_bytes(1, 128, 512, torch.bfloat16)
    assert num_rotations(nbytes) * nbytes >= L2_FLUSH_BYTES and num_rotations(nbytes) == 681


def test_decode_request_cache_estimate_bounds_the_builders():
    """decode_request_cache_bytes, which bounds the timing sets' memory (decode_num_sets'
    max_cache_bytes), is an upper bound of what the builders allocate per request, within 2x; and
    the bounded set count keeps to the budget (a V3.2 layer at 1M tokens: 83 MB per request, so a
    6 GiB budget allows 74 of the 200 sets that would span 256 MiB of rows)."""
    from mla_ext.bench import decode_num_sets, decode_request_cache_bytes
    from mla_ext.builders import build_decode_inputs

    for kind, ctx in (("v4_swa", 65536), ("v4_c4", 65536), ("v4_c4", 1 << 20), ("v4_c128", 1 << 20),
                      ("v32", 65536), ("v32", 1 << 20)):
        inp = build_decode_inputs(kind, batch=2, num_heads=8, context_len=ctx, device="cpu", seed=5)
        got = sum(c.numel() * c.element_size() for c in (inp.kv_cache, inp.extra_kv_cache) if c is not None) / 2
        est = decode_request_cache_bytes(kind, ctx)
        assert got <= est <= 2 * got, (kind, ctx, got, est)
    per_request = decode_request_cache_bytes("v32", 1 << 20, topk=2048)
    assert decode_num_sets("v32", 1, 1 << 20, 2048) == 200
    sets = decode_num_sets("v32", 1, 1 << 20, 2048, max_cache_bytes=6 << 30)
    assert sets == 74 and sets * per_request <= 6 << 30
    assert decode_num_sets("v32", 64, 1 << 20, 2048, max_cache_bytes=1 << 20) == 2  # never below two sets
