"""``fingerprint.digest`` is the one home of cache keys; its hash must stay what the caches on disk are named by."""

import hashlib
import json

import pytest

from keepsight.demo import cache_key
from keepsight.fingerprint import differences, digest
from keepsight.profiles import PROFILES


@pytest.mark.parametrize("obj", [{"b": 1, "a": [1.5, "x", None]}, [{"z": True}, 3], "text"])
def test_digest_is_the_sha256_of_sorted_json(obj):
    # every cache directory written before digest took a length was named by exactly this
    plain = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()
    assert digest(obj) == plain[:16] and digest(obj, 12) == plain[:12]


def test_demo_cache_keys_are_unchanged():
    # the names of the cached bases every earlier demo run wrote (runs/cache/base-<key>)
    assert cache_key(PROFILES["smoke"], seed=3, environment={"a": 1}) == "1fd4b5feaa4be45f"
    assert cache_key(PROFILES["full"], seed=3, environment={"a": 1}) == "9c01dd7b3d353537"


def test_differences_name_nested_fields():
    assert differences({"a": {"b": 1}, "c": 2}, {"a": {"b": 2}, "c": 2}) == ["a.b: 1 -> 2"]
