import pytest

from qcompile.errors import SpecError
from qcompile.kernels import UniformSpec, spec_from_dict


def test_name_and_round_trip():
    spec = UniformSpec(k=4096, n=11008, bits=3, group_size=-1)
    assert spec.name() == "uniform_b3_gcol_k4096_n11008_m1_f32"
    assert spec_from_dict(spec.to_dict()) == spec


def test_digest_is_pinned():
    """The digest keys every database row: it must not drift between versions by accident.
    Change this literal only together with a deliberate SPEC_SCHEMA_VERSION/compute_version bump."""
    spec = UniformSpec(k=4096, n=4096, bits=4, group_size=128)
    assert spec.digest() == "4ae4e3e77e2f14414d97ad42cdd01ecebf815dea03eeb3c577857d82a6076284"


def test_digest_depends_on_every_field():
    base = UniformSpec(k=256, n=256)
    variants = [UniformSpec(k=512, n=256), UniformSpec(k=256, n=512),
                UniformSpec(k=256, n=256, bits=2), UniformSpec(k=256, n=256, group_size=64),
                UniformSpec(k=256, n=256, m=2)]
    digests = {v.digest() for v in variants} | {base.digest()}
    assert len(digests) == len(variants) + 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(k=4000, n=64, group_size=128), "K=4000 must be divisible by group_size=128"),
    (dict(k=256, n=64, bits=5), "bits=5 is not supported"),
    (dict(k=100, n=64, bits=3, group_size=-1), "K=100 must be divisible by 32"),
    (dict(k=0, n=64), "K must be a positive integer; got 0"),
    (dict(k=256, n=64, group_size=16, bits=3), "group_size=16 must be a multiple of 32"),
    (dict(k=256, n=64, dtype="int8"), "dtype='int8' is not supported"),
])
def test_invalid_specs_state_the_rule(kwargs, message):
    with pytest.raises(SpecError, match=message):
        UniformSpec(**kwargs)


def test_unknown_family_and_fields():
    with pytest.raises(SpecError, match="Unknown kernel family 'nope'"):
        spec_from_dict({"family": "nope"})
    with pytest.raises(SpecError, match=r"unknown uniform spec fields \['colour'\]"):
        spec_from_dict({"family": "uniform", "k": 64, "n": 64, "colour": "red"})
