"""The harness's families on known laws: valid on equal laws, and able to fail.

Complements ``test_audit_entries`` (the registered mechanisms): here the
families and the tape probe are checked against constructions whose answer is
known, including the *fixed* versions of issue #14's two findings, which the
harness must pass (so its failures on the old code are not false alarms).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from mechanisms.audit import controls, dp, events, tapes
from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.competitors import audit as competitors_audit
from mechanisms.dip.noise import NoiseStep
from mechanisms.dp import baselines


def test_trailing_zeros_and_lattice_membership_are_exact() -> None:
    v = np.array([1.0, 1.5, 0.75, 3.0 * 2.0**-40, 1.0 + 2.0**-52, 0.1])
    tz = events.trailing_zeros(events.mantissa_bits(v))
    assert tz.tolist() == [52.0, 51.0, 51.0, 51.0, 0.0, 1.0]
    m = events.lattice_membership(v, np.array([-52, -40, -1, 0]))
    assert m.tolist() == [[True, True, True, True], [True, True, True, False],
                          [True, True, False, False], [True, True, False, False],
                          [True, False, False, False], [False, False, False, False]]


@pytest.mark.parametrize("seed", range(4))
def test_equal_laws_certify_nothing_in_any_family(seed: int) -> None:
    """Validity: the four families (each picks among thousands of events or fits a model)
    certify no loss between two samples of one law (split halves keep them honest)."""
    rng = np.random.default_rng(seed)
    x = rng.laplace(size=(8000, 3)) * 2.0**-10
    y = rng.laplace(size=(8000, 3)) * 2.0**-10
    probe = rng.laplace(size=(20, 3)) * 2.0**-10
    for result in (events.interval_family(x, y, 1e-3, 0.0),
                   events.representation_family(x, y, 1e-3, 0.0),
                   events.learned_family(x, y, 1e-3, 0.0),
                   events.support_gap(x, y, probe, probe, 1e-3, 0.0)):
        assert result.certified <= 0.0, result
        assert not result.gap


def test_a_lattice_leak_is_found_by_the_representation_family() -> None:
    """Same law of values, different low bits: D on 2^-20·Z, D' on 2^-30·Z. Only the
    encoding differs, and that family certifies a large loss; the interval one nothing."""
    rng = np.random.default_rng(5)
    u = rng.random((20_000, 1))
    x = np.floor(u * 2**20) * 2.0**-20
    y = np.floor(u[::-1] * 2**30) * 2.0**-30
    assert events.representation_family(x, y, 1e-3, 0.0).certified > 3.0
    assert events.interval_family(x, y, 1e-3, 0.0).certified < 0.2


def _deep_laplace(rng: np.random.Generator, scale: float, size: int) -> NDArray[np.int64]:
    """A discrete Laplace without the 44.43 cut, for the probe test: |X| is the largest k
    with U < 2p^k/(1+p), U from raw words (each zero word adds 64 bits of depth)."""
    p = math.exp(-1.0 / scale)
    out = np.empty(size, dtype=np.int64)
    for i in range(size):
        log_u, word = 0.0, 0
        for _ in range(8):
            word = int(rng.bit_generator.random_raw())
            if word:
                break
            log_u -= 64 * math.log(2.0)
        log_u += math.log((word + 0.5) * 2.0**-64)
        y = scale * (math.log(2.0 / (1.0 + p)) - log_u)
        magnitude = max(0, math.ceil(y) - 1)
        out[i] = magnitude if rng.bit_generator.random_raw() >> 63 else -magnitude
    return out


class DeepLaplace(baselines.LaplaceMechanism):
    def _sample(self, rng: np.random.Generator, plan: Any, size: int) -> NDArray[np.int64]:
        return _deep_laplace(rng, plan.noise_scale, size)


def test_the_tail_probe_passes_an_untruncated_sampler_and_flags_the_truncated_one() -> None:
    """Catches a probe that cannot tell the samplers apart: at ε = 45 both give the same
    fair runs (they differ with probability ~e^-44), but the extreme tapes drive the
    untruncated sampler past the other neighbour's releases, the truncated one not."""
    deep = dp.baseline_scenario("deep", DeepLaplace(), dp.MEAN, dp.eps(45), dp.unit_meta(20))
    cut = dp.baseline_scenario("cut", controls.TruncatedLaplace(), dp.MEAN, dp.eps(45),
                               dp.unit_meta(20))
    ok = dp.evaluate(deep, "ci", 3)
    bad = dp.evaluate(cut, "ci", 3)
    assert ok.passed and not ok.gap, ok.families
    assert bad.family("tail").gap and not bad.passed
    reach = tapes.reach(lambda g: deep.once(g, 0), 2, 0)
    centre = float(np.median(deep.draw(np.random.default_rng(0), 0, 101)))
    noise_scale = deep.mech._plan(deep.params, deep.cost, deep.meta).noise_scale  # type: ignore[attr-defined]
    grid = deep.mech._plan(deep.params, deep.cost, deep.meta).grid  # type: ignore[attr-defined]
    assert np.max(np.abs(reach - centre)) / grid > 80 * noise_scale  # beyond two zero words


class FreshVStep(NoiseStep):
    """The fixed DIP step (issue #14 finding 1): V drawn independently of the noise."""

    def __call__(self, u: Any, rng: np.random.Generator, exact_upper: bool = True) -> Any:
        noise = controls.truncated_discrete_laplace(rng, self.scale, np.shape(u))
        t = self.cell(u) + noise
        return self._uniformize(t, rng.random(np.shape(u)), exact_upper)


def test_dip_zero_noise_event_separates_the_old_step_and_not_the_fixed_one() -> None:
    """Catches a representation event that flags DIP whatever V is: at resolution 16 the old
    recycled V is certified above ε = 1, an independent V is not."""
    mech: Any = dp.registry.get("dip")
    coarse = {"columns": ["x"], "reference": dp.UNIFORM, "resolution": 16}
    old = dp.dip_scenario("old", mech, coarse, dp.eps(1), dp.unit_meta(2), old_step=True)
    new = dp.dip_scenario("new", mech, coarse, dp.eps(1), dp.unit_meta(2), old_step=True,
                          step_class=FreshVStep)
    assert dp.evaluate(old, "ci", 4).family("representation").certified > 1.0
    fixed = dp.evaluate(new, "ci", 4)
    assert fixed.passed, fixed.families
    assert fixed.certified > 0.8  # the audit still has power: the loss ε = 1 is nearly tight


# --------------------------------------------------------------------------- work (issue 27)


@pytest.mark.parametrize("seed", range(3))
def test_the_work_family_certifies_nothing_when_work_has_one_law(seed: int) -> None:
    """Validity: values and work counters (geometric, correlated with the value) of one
    law on both neighbours certify no loss, though thousands of joint events are tried."""
    rng = np.random.default_rng(seed)

    def sample() -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        v = rng.integers(0, 5, size=(8000, 1)).astype(np.float64)
        w = rng.geometric(0.05 + 0.02 * v).astype(np.float64)
        return v, w

    (x, wx), (y, wy) = sample(), sample()
    result = events.work_family(x, y, wx, wy, 1e-3, 0.0)
    assert result.events_tried > 1000
    assert result.certified <= 0.0, result


def test_the_work_family_finds_a_leak_only_the_joint_law_shows() -> None:
    """Same law of values (fair bits) and of work (10 or 100, even odds) on both neighbours,
    but long runs come with value 1 on D and with value 0 on D' (9 : 1): only a joint
    (value, work) cell sees it (loss ln 9), not the values, not the work alone."""
    rng = np.random.default_rng(11)
    runs = 20_000

    def sample(long_value: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        v = rng.integers(0, 2, size=runs)
        agree = rng.random(runs) < 0.9
        long = np.where(v == long_value, agree, ~agree)
        return v[:, None].astype(np.float64), np.where(long, 100.0, 10.0)[:, None]

    (x, wx), (y, wy) = sample(1), sample(0)
    result = events.work_family(x, y, wx, wy, 1e-3, 0.0)
    assert result.certified > 1.5 and "coordinate 0" in result.what, result
    assert events.interval_family(x, y, 1e-3, 0.0).certified < 0.1
    assert events.interval_family(wx, wy, 1e-3, 0.0).certified < 0.1
    same = np.full((runs, 1), 7.0)
    constant = events.work_family(x, y, same, same, 1e-3, 0.0)
    assert constant.certified == -math.inf and constant.events_tried == 1


def test_the_work_family_catches_the_old_exm_sampler_and_passes_exm() -> None:
    """Issue #27's pair (support 0..1999, one draw at ε = 1): the old rejection sampler's
    proposal count certifies ε > 1 at charged 1 (the issue measured 1.33); ``exm``'s
    permute-and-flip does the same work on D and D', so the family certifies nothing
    and every family passes."""
    plan = competitors_audit._exm_plan()
    control = next(s for fam, s in plan.controls if fam == "work")
    old = dp.evaluate(control, "ci", 1000)
    assert old.caught_by("work") and old.family("work").certified > 1.0
    assert old.family("interval").certified <= 1.0  # its values alone are ε-DP
    honest = next(s for s in plan.honest if "issue #27" in s.label)
    new = dp.evaluate(honest, "ci", 20)
    assert new.family("work").certified == -math.inf
    assert new.passed, new.families


def test_the_old_exm_control_is_the_old_loop_vectorised() -> None:
    """The work control draws many releases at once; with one release it reads the
    generator exactly as the verbatim old loop (``RejectionExm.sample``) does and returns
    the same draws, for one and for several draws per release."""
    mech = controls.RejectionExm()
    meta = DatasetMeta(12, {"g": ColumnMeta("g", "categorical", categories=("a", "b", "c"))})
    codes = np.array([0] * 7 + [1] * 4 + [2])
    for k in (1, 3):
        plan = mech._plan(mech.load_params({"column": "g", "draws": k}), Fraction(k), meta)
        counts = mech.counts(plan, codes)
        for seed in range(10):
            old = mech.sample(plan, counts, np.random.default_rng(seed), k)
            drawn, proposals = mech.runs(plan, counts, np.random.default_rng(seed), 1)
            assert drawn[0].tolist() == old.tolist()
            assert proposals[0] % max(16, 2 * k) == 0
