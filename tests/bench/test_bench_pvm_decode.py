"""``keepsight bench pvm-decode`` on a tiny shape: it runs the three arms from one prefill, the two PVM arms (memory
projected once, and every step as released) choose the same tokens, and its table fields are there. The timings
themselves are the benchmark's to print, never asserted."""

from keepsight.bench.pvm_decode import decode_flops, run

TINY = {"layers": 36, "hidden": 128, "intermediate": 384, "heads": 4, "kv_heads": 2, "head_dim": 32, "vocab": 300}


def test_pvm_decode_bench_runs_and_its_pvm_arms_agree(tmp_path):
    result = run(tmp_path, batches=(1, 2), new_tokens=3, repeats=1, shape=TINY, visual=24, layers=4)
    assert (tmp_path / "pvm_decode.json").is_file() and result["pvm_layers"] == [1, 2, 3]
    for row in result["rows"]:
        assert row["same_tokens"] is True
        assert {"base_ms", "pvm_once_ms", "pvm_every_step_ms", "projected_36_layers_overhead_once"} <= set(row)
        # the time inside the blocks is measured (a part of the PVM step, so less than the whole step)
        assert 0 < row["blocks_ms"] < row["pvm_once_ms"] and row["blocks_share"] > 0
    # the FLOPs at the timed shape, counted at its full depth (36 layers) with the prompt and new tokens as keys
    assert result["flops_per_token_timed_shape"] == decode_flops(TINY, 24, 24 + 16 + 3, result["pvm_hidden_size"], 3)


def test_the_flop_count_is_what_torch_counts():
    """decode_flops (counted from the shapes) against torch's own FlopCounterMode on one cached decode step of a
    36-layer tiny model: the base, PVM with the memory projected once, and the release's every-step way."""
    import dataclasses

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from keepsight.bench.pvm_decode import IMAGE_TOKEN, shaped_model
    from keepsight.pvm import PVMConfig, attach_pvm, pvm_disabled

    model = shaped_model(TINY["layers"], TINY)
    model.set_attn_implementation("eager")  # attention as matmuls, which the counter sees (its sdpa on CPU it does not)
    attach_pvm(model, PVMConfig(layers=[33, 34, 35]))
    visual, text = 24, 8
    ids = torch.cat([torch.full((1, visual), IMAGE_TOKEN), torch.randint(10, 200, (1, text))], 1)
    st = model._keepsight_pvm
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        prefix = cache.get_seq_length()
        counted = {}
        for arm in ("base", "pvm_once", "pvm_every_step"):
            if cache.get_seq_length() > prefix:
                cache.crop(prefix - cache.get_seq_length())
            st.config = dataclasses.replace(st.config, cache_visual=arm != "pvm_every_step")
            with FlopCounterMode(display=False) as counter:
                if arm == "base":
                    with pvm_disabled(model):
                        model(input_ids=ids[:, -1:], cache=cache, use_cache=True)
                else:
                    model(input_ids=ids[:, -1:], cache=cache, use_cache=True)
            counted[arm] = counter.get_total_flops()
    want = decode_flops(TINY, visual, prefix + 1, model.pvm["33"].pvm_hidden_size, 3)
    assert counted["base"] == want["base"]
    assert counted["pvm_once"] - counted["base"] == want["pvm_once"]
    assert counted["pvm_every_step"] - counted["base"] == want["pvm_every_step"]
