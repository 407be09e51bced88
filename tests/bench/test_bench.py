"""The LIA-MTR benchmarks run end to end at toy sizes (their real numbers come from `keepsight bench`)."""

import json


def test_bridge_memory_runs_each_configuration_in_a_subprocess(tmp_path):
    from keepsight.bench.bridge_memory import run

    res = run(tmp_path, width=32, sizes=(256, 512), kinds=("lia_mtr", "attention"), mem_limit_gib=1e-5)
    rows = {(r["kind"], r["n"]): r for r in res["rows"]}
    assert rows[("lia_mtr", 256)]["skipped"] is True  # predicted above the (tiny) limit: recorded, not run
    res = run(tmp_path, width=32, sizes=(256, 512), kinds=("lia_mtr", "mlp"))
    assert all(not r["skipped"] and r["time_s"] > 0 and r["peak_bytes"] >= 0 for r in res["rows"])
    assert json.loads((tmp_path / "bridge_memory.json").read_text())["width"] == 32


def test_needle_and_scan_write_their_results(tmp_path):
    from keepsight.bench.needle import run as needle
    from keepsight.bench.scan import run as scan

    res = needle(tmp_path, kinds=("lia_mtr", "mlp"), lengths=(64,), depths=(0.0, 1.0), width=8, steps=3,
                 train_len=32, samples=4)
    assert len(res["bridges"]["lia_mtr"]["accuracy"]) == 1 and (tmp_path / "needle.png").stat().st_size > 1000
    from keepsight.bench.needle import run_model

    res = run_model(tmp_path, kinds=("lia_mtr:half_life+token", "mlp"), lengths=(32, 64), depths=(0.5,), steps=2,
                    train_len=16, samples=4, batch=4)
    assert set(res["bridges"]) == {"lia_mtr:half_life+token", "mlp"} and (tmp_path / "needle_model.json").is_file()
    assert all(0 <= a <= 1 for row in res["bridges"]["mlp"]["accuracy"] for a in row)
    res = scan(tmp_path, n=300, widths=(8,), chunks=(16, 64), repeats=1)
    assert all(r["max_abs_err"] < 1e-4 for r in res["rows"]) and (tmp_path / "scan.json").is_file()


def test_data_bench_builds_checks_and_collates_a_fixture(tmp_path):
    from keepsight.bench import data

    result = data.run(tmp_path, rows=40, batch=4, batches=2)
    assert result["rows"] == 40 and "40 rows" in result["preflight"] and "0 bad rows" in result["preflight"]
    assert result["collate_rows_per_s"] > 0 and result["build_peak_mib"] > 0
    assert (tmp_path / "data.json").is_file() and (tmp_path / "data-fixture" / "data.json").is_file()


def test_diffusion_bench_counts_forwards_of_each_sampler(tmp_path):
    from keepsight.bench import diffusion

    res = diffusion.run(tmp_path, steps_grid=(4,), batch=1, gen_length=8, pairs=1, block_length=4)
    rows = {r["sampler"]: r for r in res["rows"]}
    assert set(rows) == {"plain", "prefix", "dual", "dual+threshold", "dual+threshold (schedule)"}
    assert rows["plain"]["forwards"] == 4 and rows["plain"]["flops_saving"] == 1.0
    assert rows["prefix"]["positions"] < rows["plain"]["positions"] and rows["dual"]["flops_saving"] > 1
    assert 0 < res["extra_flops_share"] < 0.01


def test_mps_mrs_bench_gives_each_overhead_an_interval(tmp_path):
    from keepsight.bench import diffusion

    res = diffusion.run_overhead(tmp_path, steps_grid=(2,), samplers=("plain", "dual"), batch=1, gen_length=8,
                                 pairs=7, block_length=8)
    assert [(r["steps"], r["sampler"]) for r in res["rows"]] == [(2, "plain"), (2, "dual")]
    for r in res["rows"]:
        assert r["low"] <= r["overhead"] <= r["high"] and r["coverage"] >= 0.95 and r["pairs"] == 7
        assert r["goal"] == ("met" if r["high"] <= 0.03 else "missed" if r["low"] > 0.03 else "open")
    assert (tmp_path / "mps_mrs.json").is_file()


def test_baselines_bench_times_every_method(tmp_path):
    from keepsight.bench import baselines

    res = baselines.run(tmp_path, batch=1, new_tokens=2, pairs=1)
    assert {(r["size"], r["method"]) for r in res["rows"]} == {(s, m) for s in baselines.SIZES for m in baselines.METHODS}
    assert all(r["ratio"] > 0 and r["stats"]["forwards"] > 0 for r in res["rows"])


def test_threads_bench_times_each_count_beside_each_neighbour(tmp_path, monkeypatch):
    from keepsight.bench import threads
    from keepsight.cores import usable_cores
    from keepsight.openmp import SPINCOUNT

    monkeypatch.setattr(threads, "NEIGHBOURS", {"none": None, "python loop": ("python",)})
    monkeypatch.setattr(threads, "SETTINGS", (("1", "keepsight"), ("auto", "keepsight"), ("1", "libgomp")))
    monkeypatch.setattr(threads, "REFERENCE", ("1", "libgomp"))
    res = threads.run(tmp_path, steps=2, repeats=1)
    rows = {(r["neighbour"], r["threads"], r["wait"]): r for r in res["rows"]}
    assert set(rows) == {(n, *s) for n in ("none", "python loop") for s in threads.SETTINGS}
    assert all(r["steps_per_s"] > 0 and r["threads_used"][0] >= 1 for r in rows.values())
    assert rows[("none", "1", "keepsight")]["slowdown"] == 1.0 and rows[("none", "1", "libgomp")]["vs_reference"] == 1.0
    assert rows[("python loop", "1", "keepsight")]["threads_used"] == [1] and res["spincount"] == SPINCOUNT
    # the neighbour's own speed over each timing, against its speed alone (none where there is no neighbour)
    assert all(r["neighbour_speed"] is None for k, r in rows.items() if k[0] == "none")
    assert all(0 < r["neighbour_speed"] < 2 for k, r in rows.items() if k[0] == "python loop")
    assert res["neighbours_alone"]["python loop"] > 0
    if usable_cores() >= 2:  # auto leaves the neighbour's core alone
        assert (rows[("python loop", "auto", "keepsight")]["threads_used"][0]
                < rows[("none", "auto", "keepsight")]["threads_used"][0])
    assert threads.wait_env("keepsight")["GOMP_SPINCOUNT"] == SPINCOUNT and "GOMP_SPINCOUNT" not in threads.wait_env("libgomp")
    # each timing says what it ran under: keepsight's choice at its start (the brief spin where the cores suffice)
    assert rows[("none", "1", "keepsight")]["ran_under"] == [f"spin{SPINCOUNT}"]
    assert rows[("none", "1", "libgomp")]["ran_under"] == ["spin"]
    assert threads.wait_env("keepsight", str(10**6))["OMP_WAIT_POLICY"] == "PASSIVE"  # more threads than cores free
    assert threads.wait_env("spin", str(10**6))["GOMP_SPINCOUNT"] == SPINCOUNT
    assert json.loads((tmp_path / "threads.json").read_text())["benchmark"] == "threads"
