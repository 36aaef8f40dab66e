import pytest

from calm_core import CALMConfig, CALMError


@pytest.mark.parametrize(
    "config, anchor_depth, augment_depth, pairs",
    [
        (CALMConfig(every=4), 12, 8, [(5, 3), (11, 7)]),
        (CALMConfig(every=4), 24, 24, [(3, 3), (7, 7), (11, 11), (15, 15), (19, 19), (23, 23)]),
        (CALMConfig(every=3), 4, 8, [(1, 2), (3, 5)]),  # 8 // 3 = 2 layers; the last is not a multiple
        (CALMConfig(every=1), 2, 2, [(0, 0), (1, 1)]),
        (CALMConfig(anchor_layers=[0, -1], augment_layers=[1, 3]), 6, 4, [(0, 1), (5, 3)]),
        (CALMConfig(augment_layers=[1]), 6, 4, [(5, 1)]),
        (CALMConfig(anchor_layers=[2, 5]), 6, 4, [(2, 1), (5, 3)]),
    ],
)
def test_layer_pairs(config, anchor_depth, augment_depth, pairs):
    assert config.layer_pairs(anchor_depth, augment_depth) == pairs


@pytest.mark.parametrize(
    "make, anchor_depth, augment_depth, message",
    [
        (lambda: CALMConfig(gate="sigmoid"), 4, 4, "gate must be one of"),
        (lambda: CALMConfig(every=0), 4, 4, "positive integer"),
        (lambda: CALMConfig(anchor_layers=[1], augment_layers=[1, 2]), 4, 4, "paired one to one"),
        (lambda: CALMConfig(every=4), 4, 2, "selects no layer of a 2-layer"),
        (lambda: CALMConfig(every=1), 2, 4, "do not fit a 2-layer anchor"),
        (lambda: CALMConfig(augment_layers=[7]), 4, 4, "outside a 4-layer model"),
    ],
)
def test_bad_configs_say_what_is_wrong(make, anchor_depth, augment_depth, message):
    with pytest.raises(CALMError, match=message):
        make().layer_pairs(anchor_depth, augment_depth)


def test_dict_round_trip_and_unknown_fields():
    config = CALMConfig(every=2, gate="scalar", num_heads=2)
    assert CALMConfig.from_dict(config.to_dict()) == config
    with pytest.raises(CALMError, match="Unknown CALMConfig fields"):
        CALMConfig.from_dict({"every": 2, "evry": 3})
