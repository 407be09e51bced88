"""``keepsight bench pvm-decode`` on a tiny shape: it runs the three arms from one prefill, the two PVM arms (memory
projected once, and every step as released) choose the same tokens, and its table fields are there. The timings
themselves are the benchmark's to print, never asserted."""

from keepsight.bench.pvm_decode import run

TINY = {"layers": 36, "hidden": 128, "intermediate": 384, "heads": 4, "kv_heads": 2, "head_dim": 32, "vocab": 300}


def test_pvm_decode_bench_runs_and_its_pvm_arms_agree(tmp_path):
    result = run(tmp_path, batches=(1, 2), new_tokens=3, repeats=1, visual=24, layers=4, shape=TINY)
    assert (tmp_path / "pvm_decode.json").is_file() and result["pvm_layers"] == [1, 2, 3]
    for row in result["rows"]:
        assert row["same_tokens"] is True
        assert {"base_ms", "pvm_once_ms", "pvm_every_step_ms", "projected_36_layers_overhead_once"} <= set(row)
