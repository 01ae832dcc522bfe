"""Context-parallel sparse decode (mla_ext.parallel): page sharding, the merge math in one process,
and real torch.distributed runs (gloo on the CPU always; NCCL with 2 GPUs when present)."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import mla_ext
from mla_ext import formats
from mla_ext.builders import build_decode_inputs
from mla_ext.parallel import SHARDING_MODES, ContextParallelDecode, PageSharding, compact_indices
from conftest import assert_close_rel, poison_

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- sharding ----

@pytest.mark.parametrize("mode", SHARDING_MODES)
@pytest.mark.parametrize("world,num_pages", [(1, 5), (2, 7), (3, 10), (4, 3), (5, 2)])
def test_localize_indices_partition(mode, world, num_pages):
    """Every valid slot is owned by exactly one rank and maps back to itself; invalid ones are -1."""
    ps = 4
    g = torch.Generator().manual_seed(world * 10 + num_pages)
    idx = torch.randint(-3, num_pages * ps + 5, (6, 23), generator=g, dtype=torch.int32)
    valid = (idx >= 0) & (idx < num_pages * ps)
    hits = torch.zeros_like(idx)
    back = torch.full_like(idx, -1)
    total = 0
    for r in range(world):
        sh = PageSharding(world, r, mode)
        owned = sh.owned_pages(num_pages)
        total += owned.numel()
        assert owned.numel() == sh.num_local_pages(num_pages)
        loc = sh.localize_indices(idx, page_size=ps, num_pages=num_pages)
        assert loc.dtype == torch.int32 and loc.shape == idx.shape
        assert ((loc == -1) | ((loc >= 0) & (loc < owned.numel() * ps))).all()
        m = loc >= 0
        hits += m.int()
        lp = loc[m].long() // ps
        back[m] = (owned[lp] * ps + loc[m].long() % ps).int()
    assert total == num_pages
    assert torch.equal(hits, valid.int())
    assert torch.equal(back[valid], idx[valid])
    # out= variant
    sh = PageSharding(world, 0, mode)
    out = torch.empty_like(idx)
    assert sh.localize_indices(idx, page_size=ps, num_pages=num_pages, out=out) is out
    assert torch.equal(out, sh.localize_indices(idx, page_size=ps, num_pages=num_pages))


def test_compact_indices():
    """Usable entries (>= 0 and at a position < lengths) first in their order, then -1; counts."""
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(-4, 50, (7, 19), generator=g, dtype=torch.int32)
    lengths = torch.tensor([0, 19, 25, 5, -2, 12, 1], dtype=torch.int32)
    for lens in (None, lengths):
        packed, count = compact_indices(idx, lens)
        assert packed.dtype == torch.int32 and count.dtype == torch.int32 and packed.shape == idx.shape
        for t in range(idx.shape[0]):
            n = idx.shape[1] if lens is None else max(0, min(int(lens[t]), idx.shape[1]))
            want = [int(x) for x in idx[t, :n] if x >= 0]
            assert int(count[t]) == len(want)
            assert packed[t, :len(want)].tolist() == want
            assert (packed[t, len(want):] == -1).all()


def test_compact_indices_int64_beyond_int32_are_unusable():
    """int64 entries above 2^31 - 1 (an engine's padding value such as 2^32) are dropped like
    negative ones, not narrowed onto a real slot (2^32 + 7 must not become slot 7)."""
    idx = torch.tensor([[2**32 + 7, 2**31 + 5, 3, 2**31 - 1], [-1, 2**40, 9, 2**32]], dtype=torch.int64)
    packed, count = compact_indices(idx)
    assert packed.tolist() == [[3, 2**31 - 1, -1, -1], [9, -1, -1, -1]]
    assert count.tolist() == [2, 1]


def test_compact_indices_rejects_bad_shapes():
    idx = torch.arange(12, dtype=torch.int32).view(3, 4)
    for lengths in (torch.tensor([2]), torch.tensor([[1], [2], [3]]), torch.tensor([1, 2, 3, 4])):
        with pytest.raises(ValueError, match=r"compact_indices: expected lengths of shape \[3\]"):
            compact_indices(idx, lengths)
    with pytest.raises(ValueError, match=r"compact_indices: expected lengths of shape \[3\] on cpu"):
        compact_indices(idx, torch.tensor([1, 2, 3], device="meta"))
    with pytest.raises(ValueError, match=r"compact_indices: expected indices of shape \[num_tokens, W\]"):
        compact_indices(torch.arange(4))


def test_sharding_rejects_bad_args():
    with pytest.raises(ValueError, match="rank"):
        PageSharding(2, 2)
    with pytest.raises(ValueError, match="mode"):
        PageSharding(2, 0, "random")
    with pytest.raises(TypeError, match="expected world_size to be an integer, got 2.0"):
        PageSharding(2.0, 1)
    with pytest.raises(TypeError, match="expected rank to be an integer, got a tensor"):
        PageSharding(2, torch.tensor(1))
    with pytest.raises(TypeError, match="shard_kv_cache: expected kv_cache to be a tensor, got list"):
        PageSharding(2, 1).shard_kv_cache([torch.zeros(2, 64, 584, dtype=torch.uint8)])
    with pytest.raises(ValueError, match=r"shard_kv_cache: expected kv_cache of shape \[num_pages, page_size, \.\.\.\]"):
        PageSharding(2, 1).shard_kv_cache(torch.zeros(584, dtype=torch.uint8))
    assert PageSharding(2, 1).rank == 1


@pytest.mark.parametrize("mode", SHARDING_MODES)
@pytest.mark.parametrize("kv_format,d_qk,ps", [("bf16", 512, 16), ("fp8_ds_mla", 576, 8), ("fp8_ds_mla_v4", 512, 4),
                                               ("fp8_ds_mla_v4", 512, 2)])
def test_shard_kv_cache_keeps_rows_and_layout(mode, kv_format, d_qk, ps):
    num_pages, world = 7, 3
    cache = formats.alloc_kv_cache(kv_format, num_pages, ps, d_qk)
    slots = torch.arange(num_pages * ps)
    kv = torch.randn(slots.numel(), d_qk)
    formats.write_kv_rows(cache, kv_format, slots, kv)
    want = formats.gather_kv_rows(cache, kv_format, slots, torch.float64)
    for r in range(world):
        sh = PageSharding(world, r, mode)
        local = sh.shard_kv_cache(cache)
        owned = sh.owned_pages(num_pages)
        assert local.stride() == cache.stride() and local.dtype == cache.dtype
        assert local.shape[0] == max(1, owned.numel()) and local.shape[1:] == cache.shape[1:]
        if owned.numel() == 0:
            continue
        lslots = torch.arange(owned.numel() * ps)
        got = formats.gather_kv_rows(local, kv_format, lslots, torch.float64)
        gslots = owned.repeat_interleave(ps) * ps + torch.arange(ps).repeat(owned.numel())
        assert torch.equal(got, want[gslots])


def test_localize_indices_arguments():
    """Bad sizes, index dtypes and out buffers are refused naming the argument (out untouched);
    a cache of no pages maps everything to -1 in both modes; out gets the result."""
    idx = torch.tensor([[0, 5, -1, 9]], dtype=torch.int32)
    sh = PageSharding(2, 0, "contiguous")
    fn = "PageSharding.localize_indices: "
    for kw, exc, words in [(dict(page_size=0, num_pages=4), ValueError, "expected page_size >= 1 and num_pages >= 0"),
                           (dict(page_size=2.5, num_pages=4), TypeError, "expected page_size to be an integer"),
                           (dict(page_size=2, num_pages=-1), ValueError, "got page_size=2, num_pages=-1")]:
        with pytest.raises(exc, match=re.escape(fn) + ".*" + re.escape(words)):
            sh.localize_indices(idx, **kw)
    with pytest.raises(TypeError, match=re.escape(fn + "expected indices to be an integer tensor, got torch.float32")):
        sh.localize_indices(idx.float(), page_size=2, num_pages=4)
    for out in (torch.full((1, 4), 7, dtype=torch.int64), torch.full((2, 4), 7, dtype=torch.int32)):
        with pytest.raises(ValueError, match=re.escape(fn + "expected out to be int32 of indices' shape [1, 4]")):
            sh.localize_indices(idx, page_size=2, num_pages=4, out=out)
        assert (out == 7).all()
    for mode in SHARDING_MODES:
        assert (PageSharding(2, 1, mode).localize_indices(idx, page_size=2, num_pages=0) == -1).all()
    out = torch.full((1, 4), 7, dtype=torch.int32)
    assert sh.localize_indices(idx, page_size=2, num_pages=8, out=out) is out
    assert out.tolist() == [[0, 5, -1, -1]]  # pages 0..3 (slots 0..7) are rank 0's; slot 9 is rank 1's


@pytest.mark.parametrize("kv_format,d_qk", [("fp8_ds_mla", 576), ("fp8_ds_mla_v4", 512)])
@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_shard_kv_cache_byte_dtypes(kv_format, d_qk, dtype):
    """FP8 caches held as int8 or float8 tensors (the op takes both) shard like the uint8 ones:
    the same dtype back, the owned pages' bytes equal to the uint8 cache's shard, a rank
    without pages gets a page of 0xFF (int8) / NaN (float8) garbage."""
    cache = formats.alloc_kv_cache(kv_format, 5, 4, d_qk)
    formats.write_kv_rows(cache, kv_format, torch.arange(20), torch.randn(20, d_qk))
    for r in range(2):
        sh = PageSharding(2, r)
        want = sh.shard_kv_cache(cache)
        got = sh.shard_kv_cache(cache.view(dtype))
        assert got.dtype == dtype and got.stride() == want.stride() and got.shape == want.shape
        assert torch.equal(got.view(torch.uint8), want)
    empty = PageSharding(8, 7).shard_kv_cache(cache.view(dtype))
    assert empty.shape[0] == 1
    if dtype == torch.int8:
        assert (empty.view(torch.uint8) == 0xFF).all()
    else:
        assert empty.float().isnan().all()


def test_shard_kv_cache_rank_without_pages():
    cache = formats.alloc_kv_cache("bf16", 2, 4, 512)
    local = PageSharding(4, 3).shard_kv_cache(cache)  # round-robin: pages 0, 1 go to ranks 0, 1
    assert local.shape[0] == 1 and local.isnan().all()


# ---- the math of context-parallel decode, ranks simulated in one process ----

CASES = [("v4_c4", "fp8_ds_mla_v4", 64), ("v4_c128", "fp8_ds_mla_v4", None), ("v4_swa", "bf16", None),
         ("v32", "fp8_ds_mla", 128)]


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("mode", SHARDING_MODES)
@pytest.mark.parametrize("layer,kv_format,topk", CASES)
def test_cp_equals_single_device_simulated(device, world, mode, layer, kv_format, topk, compact):
    """Shards decoded without the sink, merged with it (merge_attn_states_n), equal single-device
    decode with the sink over the full cache, and the float64 reference."""
    inp = build_decode_inputs(layer, batch=3, num_heads=8, context_len=(300, 900), mtp=1, kv_format=kv_format,
                              topk=topk, device=device, seed=world)
    T, H = inp.num_tokens, inp.num_heads
    if inp.attn_sink is not None:  # a sink that matters next to the scores' mass
        inp.attn_sink = inp.attn_sink + 4.0
    ws = mla_ext.DecodeWorkspace(T, H, device=device)
    parts_o, parts_l = [], []
    for r in range(world):
        sh = PageSharding(world, r, mode)
        kw = dict(kv_format=inp.kv_format, softmax_scale=inp.softmax_scale, lengths=inp.lengths,
                  extra_lengths=inp.extra_lengths, attn_sink=None)
        cache = sh.shard_kv_cache(inp.kv_cache)
        idx = sh.localize_indices(inp.indices, page_size=inp.kv_cache.shape[1], num_pages=inp.kv_cache.shape[0])
        if inp.extra_kv_cache is not None:
            kw["extra_kv_cache"] = sh.shard_kv_cache(inp.extra_kv_cache)
            kw["extra_indices"] = sh.localize_indices(inp.extra_indices, page_size=inp.extra_kv_cache.shape[1],
                                                      num_pages=inp.extra_kv_cache.shape[0])
        if compact:
            idx, kw["lengths"] = compact_indices(idx, inp.lengths)
            if inp.extra_kv_cache is not None:
                kw["extra_indices"], kw["extra_lengths"] = compact_indices(kw["extra_indices"], inp.extra_lengths)
        o = poison_(torch.empty(T, H, 512, dtype=torch.bfloat16, device=device))
        l = poison_(torch.empty(T, H, device=device))
        mla_ext.sparse_mla_decode(inp.q, cache, idx, output=o, workspace=ws.tensor, lse=l, **kw)
        parts_o.append(o)
        parts_l.append(l)
    out = poison_(torch.empty(T, H, 512, dtype=torch.bfloat16, device=device))
    lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states_n(out, lse, torch.stack(parts_o), torch.stack(parts_l), inp.attn_sink)

    single = poison_(torch.empty(T, H, 512, dtype=torch.bfloat16, device=device))
    single_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.sparse_mla_decode(inp.q, inp.kv_cache, inp.indices, output=single, workspace=ws.tensor, lse=single_lse,
                              **inp.op_kwargs())
    ref_o, ref_l = inp.reference()
    assert_close_rel(out, single, torch.bfloat16, "cp vs single-device")
    assert_close_rel(out, ref_o, torch.bfloat16, "cp vs float64 reference")
    assert torch.allclose(lse.double().cpu(), single_lse.double().cpu(), rtol=0, atol=1e-3)
    lse_tol = 1e-4 if device == "cpu" else 1e-2  # GPU: probabilities are bf16 on the tensor cores
    assert torch.allclose(lse.double().cpu(), ref_l.cpu(), rtol=1e-5, atol=lse_tol)


# ---- real process groups ----

def _run_module(args, timeout=300, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    env = {k: v for k, v in env.items() if v is not None}  # None in env_extra: unset
    return subprocess.run([sys.executable, "-m", "mla_ext.parallel", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("argv,words", [
    (["--cp", "2", "--heads", "0"], "--batch and --heads must be >= 1"),
    (["--cp", "2", "--kv-format", "fp8_ds_mla"], "--kv-format for --layer v4_c4 must be one of"),
    (["--cp", "2", "--context", "64", "32"], "--context LO HI must satisfy"),
    (["--cp", "2", "--mtp", "3", "--context", "3", "8"], "--context LO HI must satisfy"),
    (["--cp", "2", "--layer", "v4_swa", "--topk", "5"], "--topk is not a parameter of --layer v4_swa"),
    (["--cp", "2", "--topk", "0"], "--topk must be >= 1"),
    (["--cp", "2", "--num-splits", "300"], "expected num_splits to be 0 \\(automatic\\) or 1..256, got 300"),
    (["--cp", "2", "--device", "cpu", "--backend", "nccl"], "--backend nccl needs --device cuda"),
    (["--cp", "2", "--warmup", "-5"], "--warmup >= 0"),
    (["--cp", "2", "--steps", "0"], "--steps must be >= 1"),
    (["--cp", "2", "--json", "/nonexistent-folder-mla/x.json"], "folder /nonexistent-folder-mla does not exist"),
    (["--cp", "0"], "--cp must be >= 1, got 0"),
])
def test_runner_bad_arguments_exit_2_before_any_rank(argv, words, capsys, monkeypatch):
    """python -m mla_ext.parallel refuses bad values with a usage error (exit 2) before spawning
    any rank: spawning is replaced by a failure here, so a check that came too late would show."""
    from mla_ext.parallel import runner

    monkeypatch.setattr(runner.mp, "spawn", lambda *a, **k: pytest.fail("ranks spawned for bad arguments"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(SystemExit) as e:
        runner.main(argv + ["--device", "cpu"] if "--device" not in argv else argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.search(words, err), err


def test_runner_cpu_baseline_sized_for_all_cores(tmp_path):
    """On a CPU the ranks split the cores and the single-device baseline gets them all; a CPU
    call's split count follows its thread count, so the baseline needs a workspace of its own
    (found on a 16-core machine: this build machine's 2 cores give the same counts). The
    processes here are told there are 16 cores. An OMP_NUM_THREADS the user set is the budget
    instead of the core count (it was ignored)."""
    (tmp_path / "sitecustomize.py").write_text("import os\nos.cpu_count = lambda: 16\n")
    for omp, single, ranks in ((None, 16, [8, 8]), ("6", 6, [3, 3]), ("1", 1, [1, 1])):
        js = tmp_path / f"cp{omp}.json"
        r = _run_module(["--cp", "2", "--device", "cpu", "--layer", "v4_c4", "--batch", "2", "--heads", "8",
                         "--context", "300", "600", "--topk", "64", "--mtp", "1", "--steps", "1", "--warmup", "0",
                         "--json", str(js)],
                        env_extra={"PYTHONPATH": str(tmp_path) + os.pathsep + ROOT, "OMP_NUM_THREADS": omp})
        assert r.returncode == 0, r.stdout + r.stderr
        s = json.loads(js.read_text())
        assert s["ok"] and s["single_threads"] == single and [x["threads"] for x in s["ranks"]] == ranks, omp


def test_runner_under_torchrun_splits_the_cores(tmp_path):
    """Under torchrun (two workers, this test's launch of torch.distributed.run) the ranks split
    the cores and the baseline gets them all, as in the runner's own launch: torchrun sets
    OMP_NUM_THREADS=1 in its workers, which must not read as the user's thread budget (every
    rank and the baseline ran on one thread). 16 cores faked as above."""
    from mla_ext.parallel.runner import _free_port

    (tmp_path / "sitecustomize.py").write_text("import os\nos.cpu_count = lambda: 16\n")
    js = tmp_path / "cp.json"
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + ROOT)
    env.pop("OMP_NUM_THREADS", None)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(_free_port()), "-m", "mla_ext.parallel", "--cp", "2",
                        "--device", "cpu", "--layer", "v4_c4", "--batch", "2", "--heads", "8",
                        "--context", "300", "600", "--topk", "64", "--steps", "1", "--warmup", "0",
                        "--json", str(js)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(js.read_text())
    assert s["ok"] and s["single_threads"] == 16 and [x["threads"] for x in s["ranks"]] == [8, 8]


def test_runner_gloo_two_ranks(tmp_path):
    """python -m mla_ext.parallel --cp 2 on the CPU (gloo): verifies against single-device decode."""
    js = tmp_path / "cp.json"
    r = _run_module(["--cp", "2", "--device", "cpu", "--layer", "v4_c4", "--batch", "2", "--heads", "8",
                     "--context", "300", "600", "--topk", "64", "--mtp", "1", "--steps", "2", "--warmup", "1",
                     "--reference", "--json", str(js)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verify against single-device decode" in r.stdout and ": ok" in r.stdout
    s = json.loads(js.read_text())
    assert s["ok"] and s["world"] == 2 and s["backend"] == "gloo" and len(s["ranks"]) == 2
    assert sum(x["rows"] for x in s["ranks"]) == s["num_selected"]  # the shards partition the rows
    for x in s["ranks"]:
        assert x["out_err"] <= 2e-2 and x["lse_err"] <= 1e-3 and x["ref_out_err"] <= 2e-2
        assert x["comm_us"] > 0 and x["decode_us"] > 0 and x["merge_us"] > 0


def _gloo_worker(rank, world, port, result_dir):
    """Spawned rank: ContextParallelDecode made for more tokens than used, two step sizes, the
    contiguous sharding, strided output views."""
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        inp = build_decode_inputs("v4_c128", batch=3, num_heads=4, context_len=(2000, 4000), device="cpu", seed=9)
        T, H = inp.num_tokens, inp.num_heads
        sh = PageSharding(world, rank, "contiguous")
        cache = sh.shard_kv_cache(inp.kv_cache)
        xcache = sh.shard_kv_cache(inp.extra_kv_cache)
        idx = sh.localize_indices(inp.indices, page_size=inp.kv_cache.shape[1], num_pages=inp.kv_cache.shape[0])
        xidx = sh.localize_indices(inp.extra_indices, page_size=inp.extra_kv_cache.shape[1],
                                   num_pages=inp.extra_kv_cache.shape[0])
        cp = ContextParallelDecode(T + 5, H, device="cpu")
        ws = mla_ext.DecodeWorkspace(T, H, device="cpu")
        errs = []
        for n in (T, T - 1):
            buf = poison_(torch.empty(n + 2, H, 600, dtype=torch.bfloat16))
            out = buf[1:n + 1, :, 8:520]
            lse = poison_(torch.empty(H, n)).T
            cp(inp.q[:n], cache, idx[:n], kv_format=inp.kv_format, softmax_scale=inp.softmax_scale, output=out,
               lse=lse, lengths=inp.lengths[:n], extra_kv_cache=xcache, extra_indices=xidx[:n],
               extra_lengths=inp.extra_lengths[:n], attn_sink=inp.attn_sink)
            single = torch.empty(n, H, 512, dtype=torch.bfloat16)
            sl = torch.empty(n, H)
            kw = inp.op_kwargs()
            kw.update(lengths=inp.lengths[:n], extra_indices=inp.extra_indices[:n], extra_lengths=inp.extra_lengths[:n])
            mla_ext.sparse_mla_decode(inp.q[:n], inp.kv_cache, inp.indices[:n], output=single, workspace=ws.tensor,
                                      lse=sl, **kw)
            assert not out.isnan().any() and buf[0].isnan().all() and buf[n + 1].isnan().all()
            assert buf[1:n + 1, :, :8].isnan().all() and buf[1:n + 1, :, 520:].isnan().all()
            errs.append(((out.double() - single.double()).abs().max() / single.double().abs().max()).item())
            errs.append((lse - sl).abs().max().item())
        # a padded output buffer (more rows than q) is refused before any collective
        padded = poison_(torch.empty(T + 2, H, 512, dtype=torch.bfloat16))
        try:
            cp(inp.q[:T], cache, idx[:T], kv_format=inp.kv_format, softmax_scale=inp.softmax_scale, output=padded,
               lengths=inp.lengths, extra_kv_cache=xcache, extra_indices=xidx, extra_lengths=inp.extra_lengths)
            errs.append(1.0)  # no error: counted as a failure below
        except ValueError as e:
            errs.append(0.0 if "slice a padded buffer to output[:" in str(e) and padded.isnan().all() else 1.0)
        # a float32 output or a wrong-sized sink: refused before the local decode and the collective,
        # naming the caller's argument (not the merge's internal ones)
        # a q of other heads than the object's (with an output to match it) blames q, not output
        q5 = torch.cat([inp.q[:T], inp.q[:T, :1]], dim=1)
        bad = [dict(output=poison_(torch.empty(T, H, 512))),
               dict(output=poison_(torch.empty(T, H, 512, dtype=torch.bfloat16)), attn_sink=torch.zeros(H + 1)),
               dict(output=poison_(torch.empty(T, H + 1, 512, dtype=torch.bfloat16)), q=q5)]
        for kw, want in zip(bad, ["expected output to be torch.bfloat16", "expected attn_sink of shape [4]",
                                  "q must be [num_tokens, 4, d_qk] (the heads it was made for), got [3, 5, 512]"]):
            cp._send.fill_(7)
            q = kw.pop("q", inp.q[:T])
            try:
                cp(q, cache, idx[:T], kv_format=inp.kv_format, softmax_scale=inp.softmax_scale,
                   lengths=inp.lengths, extra_kv_cache=xcache, extra_indices=xidx, extra_lengths=inp.extra_lengths,
                   **kw)
                errs.append(1.0)
            except ValueError as e:
                untouched = kw["output"].isnan().all() and (cp._send == 7).all()
                errs.append(0.0 if want in str(e) and untouched else 1.0)
        with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
            json.dump(errs, f)
    finally:
        dist.destroy_process_group()


def test_context_parallel_decode_gloo_spawn(tmp_path):
    import torch.multiprocessing as mp
    from mla_ext.parallel.runner import _free_port
    world = 3
    mp.spawn(_gloo_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    for r in range(world):
        e = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert e[0] <= 2e-2 and e[2] <= 2e-2 and e[1] <= 1e-3 and e[3] <= 1e-3, e
        assert e[4] == 0.0, "a padded output was not refused with a clear error"
        assert e[5:] == [0.0, 0.0, 0.0], "a wrong output dtype / sink shape / q heads not refused before the decode"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("layer,extra", [("v4_c4", ["--topk", "512"]), ("v32", ["--topk", "2048"]),
                                         ("v4_c128", [])])
def test_runner_nccl_two_gpus(tmp_path, layer, extra):
    """python -m mla_ext.parallel --cp 2 on two GPUs (NCCL)."""
    js = tmp_path / "cp.json"
    r = _run_module(["--cp", "2", "--device", "cuda", "--backend", "nccl", "--layer", layer, "--batch", "8",
                     "--heads", "16", "--context", "4096", "16384", "--steps", "5", "--reference", "--json", str(js),
                     *extra], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(js.read_text())
    assert s["ok"] and s["backend"] == "nccl" and sum(x["rows"] for x in s["ranks"]) == s["num_selected"]
