"""The ``slow`` marker for the unit tests that ``make check`` leaves out.

``make check`` runs ``pytest tests/unit -m "not slow"`` and must stay under 2 minutes on
the 2-core development machine (ruff and mypy included); ``make test`` (CI) runs every test.
The tests below each took 0.5 s or more (summed over their parameters) in
``pytest tests/unit --durations=0``; most are Monte Carlo or brute-force checks. An entry
names a test function (all its parameters) relative to ``tests/unit``; one that names no
function of its module stops the run, so a renamed test cannot drop out of the list unseen.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SLOW = frozenset({
    "dip/test_empirical.py::test_table2_regression_error_within_15_percent",
    "dip/test_multivariate.py::test_known_gaussian_joint_is_kept_in_any_order",
    "dip/test_univariate.py::test_mean_ks_at_n_1000_is_the_papers_0_027",
    "iclp/test_competitors.py::test_ar_golden_table",
    "iclp/test_competitors.py::test_frl_kde_default_components_and_accuracy",
    "iclp/test_entries.py::test_cost_is_the_budget_and_outputs_are_plain_json",
    "iclp/test_functionals.py::test_erm_neighbours_stay_within_delta",
    "iclp/test_kde.py::test_kde_error_is_dominated_by_smoothing_not_privacy",
    "iclp/test_kde.py::test_kde_refuses_bad_inputs",
    "iclp/test_kde.py::test_random_neighbours_lose_at_most_epsilon",
    "iclp/test_kde.py::test_released_density_is_a_density_in_column_units",
    "iclp/test_kde.py::test_spec_kde_check",
    "iclp/test_mean.py::test_error_decreases_with_epsilon",
    "iclp/test_mean.py::test_matched_default_worst_case_attains_its_sensitivity",
    "iclp/test_spectral.py::test_warm_lookup_is_memoised_on_the_arrays_bytes",
    "iclp/test_tuning.py::test_kde_default_tuning_is_reported_and_overridable",
    "iclp/test_tuning.py::test_risk_terms_are_the_plans_own_numbers",
    "iclp/test_tuning.py::test_whole_grid_against_frl",
    "interval/test_coverage.py::test_calibration_meets_the_target",
    "interval/test_coverage.py::test_coverage_at_least_one_over_m",
    "interval/test_coverage.py::test_leakage_is_subadditive_for_every_realisation",
    "interval/test_estimators.py::test_table_ii_cells",
    "interval/test_functionals.py::test_bootstrap_interval_covers",
    "interval/test_npmle_scale.py::test_case2_at_scale_is_certified",
    "interval/test_parametric.py::test_ses_match_the_spread_across_seeds",
    "interval/test_regression.py::test_slope_over_seeds",
    "interval/test_entries.py::test_calibration_is_a_fixed_point",
    "interval/test_entries.py::test_release_end_to_end",
    "noiseless/test_central.py::test_float_fuzz_random_bounds_seeded",
    "noiseless/test_central.py::test_values_exactly_on_bin_edges_production_path",
    "noiseless/test_queries.py::test_edges_certificate_matches_brute_force_through_release",
    "noiseless/test_queries.py::test_order_statistics_brute_force",
    "subset/test_independence.py::test_permutation_p_values_are_uniform_under_h0",
    "subset/test_independence.py::test_power_ordering",
    "subset/test_independence.py::test_type_one_error_and_null_means",
    "subset/test_release.py::test_library_imports_no_service_code",
    "subset/test_targets.py::test_table_iii_n1000",
    "test_analysis_checks.py::test_check_refuses_exactly_what_run_refuses",
    "dp/test_baselines.py::test_release_is_unbiased_and_covers_as_stated",
    "test_client.py::test_429_waits_for_retry_after",
    "test_client.py::test_backoff_grows",
    "test_client_plots.py::test_cli_health_and_openapi",
    "test_ingest.py::test_one_planted_violation_names_its_column",
    "test_ingest.py::test_valid_tables_round_trip",
    "test_plotting.py::test_release_plots_have_labels_epsilon_and_bands",
    "test_precompute.py::test_replayed_plan_is_the_computed_one",
    "test_precompute.py::test_two_processes_share_the_work",
    "test_zcdp.py::test_sigma_for_rho_is_the_smallest_float_meeting_rho",
    "test_zcdp.py::test_units_never_let_charges_exceed_the_cap",
    # an app's services open the record: these start the session's PostgreSQL
    "test_route_coverage.py::test_every_route_has_a_client_method",
    "test_route_coverage.py::test_every_route_has_a_cli_command",
    "test_route_coverage.py::test_every_api_operation_has_a_console_way",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seen: dict[str, object] = {}
    for item in items:
        if not isinstance(item, pytest.Function) or HERE not in item.path.parents:
            continue
        path = item.path.relative_to(HERE).as_posix()
        seen[path] = item.module
        if f"{path}::{item.originalname}" in SLOW:
            item.add_marker(pytest.mark.slow)
    stale = sorted(entry for entry in SLOW
                   if (module := seen.get(entry.partition("::")[0])) is not None
                   and not hasattr(module, entry.partition("::")[2]))
    if stale:
        raise pytest.UsageError(f"tests/unit/conftest.py lists no such test: {stale}")
