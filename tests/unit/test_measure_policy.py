"""How candidates are timed per target class: on CPUs every operand but x is flushed from the
caches before each timed call (the weights come from DRAM, as a model's layers' do), on GPUs
MetaSchedule's defaults."""

from qcompile.measure import COLD_REPEATS, MeasurePolicy


def test_cpu_candidates_are_timed_with_cold_weights():
    policy = MeasurePolicy.for_target("cpu", build_workers=2)
    assert policy.cold_weights and (policy.number, policy.repeat, policy.min_repeat_ms) == (
        1, COLD_REPEATS, 0)  # one call a repeat: a second call would find them cached
    config = policy.runner().evaluator_config
    assert config.enable_cpu_cache_flush and config.number == 1


def test_gpu_candidates_keep_the_defaults():
    policy = MeasurePolicy.for_target("cuda", build_workers=16)
    assert not policy.cold_weights and policy == MeasurePolicy(build_workers=16)
    assert not policy.runner().evaluator_config.enable_cpu_cache_flush


def test_settings_given_win():
    assert MeasurePolicy.for_target("cpu", build_workers=2, repeat=5).repeat == 5
