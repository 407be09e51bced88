"""The baselines experiment's arms: registry names, and our earlier readings as entries kept outside the registry."""

import json

from keepsight.baselines.readings import VCD_LINEAR
from keepsight.experiments.baselines import ARMS, BaselinesExperiment, _arm


def test_a_readings_arm_is_applied_like_a_registered_method_and_recorded_by_name():
    exp = BaselinesExperiment(pvm=None)
    assert exp.arms["vcd (linear schedule)"] == (VCD_LINEAR, {})
    saved = json.loads(json.dumps(exp.to_dict()))  # what results.json records
    assert saved["arms"]["vcd (linear schedule)"] == ["vcd_linear", {}] and saved["arms"]["vcd"] == ["vcd", {}]
    decoders = _arm(*ARMS["vcd (linear schedule)"])
    assert decoders.names() == ["vcd_linear"] and decoders.get("vcd_linear").alpha_bar() < 0.1  # abar_500 = 0.078
    assert _arm(*ARMS["vcd"]).get("vcd").alpha_bar() > 0.7  # the release's sigmoid schedule: 0.745
