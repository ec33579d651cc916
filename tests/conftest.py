from pathlib import Path

import jax
import pytest

import gflow  # noqa: F401  (importing gflow turns on float64)
from gflow._util import free_compiled_programs

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def getkey():
    """A function returning a fresh PRNG key at every call, from a fixed seed:
    keys differ within a test and every test is deterministic."""
    base = jax.random.key(5678)
    counter = iter(range(10**9))

    def _getkey():
        return jax.random.fold_in(base, next(counter))

    return _getkey


SMALL_TOML = Path(__file__).resolve().parents[1] / "scripts" / "configs" / "small.toml"


@pytest.fixture(scope="session")
def small_config():
    """The test-size staged run (scripts/configs/small.toml: d = 3, parents (1, 2),
    L = 40, N = 2000)."""
    return gflow.load_config(SMALL_TOML)


@pytest.fixture(scope="session")
def small_loss(small_config):
    c = small_config
    return gflow.make_loss(c.data, c.model, c.estimator)


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, small_config, small_loss):
    """The small staged flow, integrated once per session and shared by the
    flow and check tests: ``(trajectory, run folder)``."""
    out = tmp_path_factory.mktemp("small_run")
    return gflow.integrate(small_config, out=out, loss=small_loss), out


# Long tests, run with `python3 -m pytest -m slow` (or `-m "slow or not slow"` for everything):
# each took 3 s or more in the default suite on the 2-core machine (`--durations`), and the
# property it checks is also covered in the default suite by a smaller test, or is an
# end-to-end run of a path the default suite reaches more cheaply. Keeping them here, by
# node id, leaves each test's code as it was.
SLOW = {
    "tests/test_second.py::test_table_hessian_and_hvp_are_jax_second_derivatives[sparse]",
    "tests/test_second.py::test_table_hessian_and_hvp_are_jax_second_derivatives[sparse-official-chunked]",
    "tests/test_methods.py::test_stochastic_run_equals_the_python_functions[sde]",
    "tests/test_replicates.py::test_batch_is_the_single_runs",
    "tests/test_refmodel.py::test_sparse_layout_equals_per_position_computation[sum-9]",
    "tests/test_cli_help.py::test_sgd_progress",
    "tests/test_methods.py::test_every_method_writes_a_folder_load_check_and_plot_accept[sgd]",
    "tests/test_cli_help.py::test_sde_progress",
    "tests/test_export_cache.py::test_export_cache_reproduces_the_run_bit_for_bit",
    "tests/test_flow.py::test_evaluation_count_gd_in_program_equals_host_count",
    "tests/test_flow.py::test_evaluation_count_in_program_equals_host_count",
    "tests/test_flow.py::test_gd_converges_to_flow_first_order",
    "tests/test_flow.py::test_gd_is_the_iteration",
    "tests/test_flow.py::test_same_seed_same_trajectory",
    "tests/test_flow.py::test_step_control_carried_across_solves",
    "tests/test_joint.py::test_gd_converges_to_joint_flow_first_order",
    "tests/test_ladder.py::test_bayes_predictive_equals_posterior_mean_by_quadrature[parents0-0.1-9]",
    "tests/test_ladder.py::test_ladder_in_theory_check_report_and_loss_figure",
    "tests/test_laws.py::test_ce_on_probs_gih_force_is_minus_dloss_da",
    "tests/test_laws.py::test_copier_vertex_gradient_is_a_vertex_limit",
    "tests/test_laws.py::test_gih_both_norms_exact_onehot[S0-counts]",
    "tests/test_laws.py::test_layer_norm_near_onehot_partial_window_is_a_cosine",
    "tests/test_laws.py::test_stage1_rates_equal_flow_at_t0[layer]",
    "tests/test_loss.py::test_layouts_agree[layer-log]",
    "tests/test_loss.py::test_monte_carlo_matches_exact_enumeration[bigram-stationary-counts]",
    "tests/test_loss.py::test_short_context_padding[sum]",
    "tests/test_methods.py::test_every_method_writes_a_folder_load_check_and_plot_accept[sde]",
    "tests/test_refmodel.py::test_drawn_target_is_the_sampled_y[log]",
    "tests/test_refmodel.py::test_every_layout_equals_direct_loss[True-aligned-layer]",
    "tests/test_refmodel.py::test_every_layout_equals_direct_loss[True-shifted-sum]",
    "tests/test_refmodel.py::test_gradient_matches_finite_differences[heads]",
    "tests/test_refmodel.py::test_gradient_matches_finite_differences[sparse]",
    "tests/test_refmodel.py::test_head_norm_changes_nothing_with_one_hot_copiers",
    "tests/test_refmodel.py::test_m1_shifted_reads_offset_h[counts]",
    "tests/test_refmodel.py::test_m1_shifted_reads_offset_h[sparse]",
    "tests/test_refmodel.py::test_predict_equals_direct[False-aligned-sum]",
    "tests/test_refmodel.py::test_replicates_with_different_slot_counts_stack",
    "tests/test_refmodel.py::test_sparse_features_are_each_sequences_distinct_windows",
    "tests/test_refmodel.py::test_sparse_layout_equals_per_position_computation[layer-9]",
    "tests/test_refmodel.py::test_sparse_layout_equals_per_position_computation[sum-3]",
    "tests/test_replicates.py::test_batch_groups_stage_II_by_selected_set",
    "tests/test_replicates.py::test_cli_run_replicates_with_checks",
    "tests/test_replicates.py::test_run_replicates_are_the_single_runs",
    "tests/test_scale.py::test_chunked_equals_unchunked[positions]",
    "tests/test_scale.py::test_sharded_equals_single_device",
    "tests/test_sgd.py::test_fresh_count_features_equal_the_loss_features",
    "tests/test_sgd.py::test_fresh_sampler_kernels_are_dirichlet[0.1]",
    "tests/test_sgd.py::test_method_sde_takes_its_settings_from_the_config",
    "tests/test_sgd.py::test_sde_without_noise_is_the_flow",
    "tests/test_sgd.py::test_sharded_sgd_on_two_devices",
    "tests/test_spectrum.py::test_modified_field_norm_identity",
    # the model family and the theorist's API (default-suite cover in brackets)
    "tests/test_member_paths.py::test_member_spectrum_is_the_dense_hessian",  # [test_spectrum]
    "tests/test_member_paths.py::test_member_export_cache_is_bit_for_bit",  # [test_export_cache_key_and_fallback]
    "tests/test_member_paths.py::test_member_modified_flow_at_eta_zero_is_the_flow",  # [test_modified_eta0_is_flow]
    "tests/test_member_paths.py::test_member_run_resumes_where_it_stopped",  # [test_resume_extends_stage3]
    "tests/test_member_paths.py::test_member_evaluation_off_the_training_distribution",  # [test_evaluate]
    "tests/test_members.py::test_neutral_members_stage_I_flow_is_the_papers[token]",  # [value], [residual]
    "tests/test_members.py::test_full_model_equals_the_official_forward_pass[1-sum]",  # [0-sum]
    "tests/test_members.py::test_full_model_equals_the_official_forward_pass[3-layer]",  # [2-layer]
    "tests/test_api.py::test_unrepresented_parents_warn_in_dry_run_theory_and_report",
    "tests/test_replicates.py::test_batch_replicates_keep_their_own_events_and_clocks",  # [test_failed_replicate_is_kept]
    "tests/test_evaluate.py::test_eval_builds_the_runs_own_loss_for_the_official_options",
    "tests/test_second.py::test_table_hessian_and_hvp_are_jax_second_derivatives[sparse-official-ce]",
    "tests/test_members.py::test_neutral_values_give_the_papers_model[token]",  # [value], [residual], [absolute]
    "tests/test_members.py::test_neutral_members_stage_I_flow_is_the_papers[value]",  # [residual]
    "tests/test_members.py::test_full_model_equals_the_official_forward_pass[0-sum]",  # [2-layer]
    "tests/test_members.py::test_loss_and_gradient_agree_across_layouts[paper]",  # [test_loss.py::test_layouts_agree]
    "tests/test_members.py::test_relabelling_symmetry_keeps_token_matrices_in_span_I_11",  # [its sample's permutations]
    "tests/test_replicates.py::test_batch_replicate_that_fails_leaves_the_others",  # [test_failed_replicate_is_kept]
    "tests/test_api.py::test_theory_report_takes_a_config",
}


# The CI tier: tests outside the default suite's five minutes that `.ci/run` runs after it
# (`python3 -m pytest -m ci`). Each took 3 s or more in the default suite on the 2-core machine
# (`--durations`, 2026-12-07, commit eb2651b; the two added after it took 29 s and 78 s), or 7 s
# once those had left it, or reads a module fixture that costs 18–46 s to build (the replicates'
# chunked batch, the theory-only limit grid, the executors' serial grid); the shipped
# configurations' runs and the README's blocks stay in the default suite. Nothing here is skipped
# by CI: only the README's test command (the default suite) leaves them out.
CI_TIER = {
    "tests/test_stiff.py::test_switching_member_fails_with_the_fixed_step_advice_not_a_stiff_switch",
    "tests/test_central.py::test_unsolved_complementarity_stops_the_run_with_its_reason",
    "tests/test_stiff.py::test_value_stage3_switches_to_kvaerno5_and_agrees_with_an_implicit_stage3",
    "tests/test_stiff.py::test_without_the_switch_the_stiff_stage_fails_with_the_advice",
    "tests/test_stiff.py::test_gd_stage1_slopes_are_held_to_gds_own_rate",
    "tests/test_second.py::test_modified_field_structured_equals_linearised[moves2]",
    "tests/test_sweep.py::test_headline_without_report",
    "tests/test_second.py::test_modified_field_structured_equals_linearised[moves1]",
    "tests/test_members.py::test_loss_and_gradient_agree_across_layouts[value]",
    "tests/test_members.py::test_loss_and_gradient_agree_across_layouts[full_layer]",
    "tests/test_members.py::test_loss_and_gradient_agree_across_layouts[value_ln]",
    "tests/test_members.py::test_member_gradient_equals_finite_differences[full_layer]",
    "tests/test_members.py::test_member_gradient_equals_finite_differences[value]",
    "tests/test_members.py::test_loss_and_gradient_agree_across_layouts[full]",
    "tests/test_members.py::test_member_gradient_equals_finite_differences[linear_query]",
    "tests/test_loss.py::test_gradient_matches_finite_differences[counts-layer]",
    "tests/test_members.py::test_neutral_values_give_the_papers_model[residual]",
    "tests/test_plot.py::test_plot_run_formats",
    "tests/test_members.py::test_loss_and_gradient_agree_across_layouts[residual]",
    "tests/test_members.py::test_loss_and_gradient_agree_across_layouts[linear_output]",
    "tests/test_replicates.py::test_run_replicates_in_chunks",
    "tests/test_replicates.py::test_run_replicates_in_chunks_of_two",
    "tests/test_replicates.py::test_run_replicates_bands_batched_and_sequential",
    "tests/test_limit.py::test_limit_resume_and_overwrite_rules",
    "tests/test_limit.py::test_limit_resume_reuses_a_computed_size",
    "tests/test_executor.py::test_workers_give_the_serial_phase_csv",
    "tests/test_executor.py::test_lost_worker_is_retried",
    "tests/test_executor.py::test_point_lost_for_good_is_not_written_and_the_next_run_finishes",
    "tests/test_checks.py::test_member_law_rows_decide_for_a_member_without_the_gih",
    "tests/test_checks.py::test_stage2_rate_row_decides_for_a_first_layer_that_is_not_the_rpe",
    "tests/test_laws.py::test_full_member_rates_of_sets_outside_the_normaliser_are_their_linear_coefficients",
    "tests/test_docs.py::test_example_tiny[replicate_bands]",
    "tests/test_docs.py::test_python_blocks_run[docs/guides/models.md]",
    "tests/test_docs.py::test_python_blocks_run[docs/guides/data.md]",
    "tests/test_docs.py::test_python_blocks_run[docs/guides/python.md]",
    "tests/test_kinds.py::test_attention_along_the_sequence_for_every_positional_member",
    "tests/test_flow.py::test_resume_extends_stage3",
    "tests/test_docs.py::test_example_tiny[stochastic_vs_flow]",
    "tests/test_kinds.py::test_dag_run_reports_through_the_command_line",
    "tests/test_member_paths.py::test_every_member_runs_through_gflow_run[value]",
    "tests/test_sweep.py::test_sweep_two_values",
    "tests/test_members.py::test_neutral_members_stage_I_flow_is_the_papers[residual]",
    "tests/test_kinds.py::test_nichani_two_heads_first_head_learns_the_query_parent",
    "tests/test_flow.py::test_failed_solve_keeps_partial_trajectory",
    "tests/test_kinds.py::test_nichani_flow_learns_the_chain",
    "tests/test_replicates.py::test_resumed_replicates_run_as_a_batch",
    "tests/test_export_cache.py::test_freeing_compiled_programs_returns_their_memory_maps",
    "tests/test_flow.py::test_stage3_matches_closed_form",
    "tests/test_member_paths.py::test_gd_of_a_member_is_the_iteration",
    "tests/test_spectrum.py::test_gd_orders_to_flow_and_modified_flow",
    "tests/test_docs.py::test_example_tiny[disagreeing_rankings]",
    "tests/test_docs.py::test_python_blocks_run[docs/guides/limits.md]",
    "tests/test_flow.py::test_non_finite_field_fails_before_integrating",
    "tests/test_second.py::test_modified_field_structured_equals_linearised[moves0]",
    "tests/test_limit.py::test_theory_only_limit_values_are_the_stage1_rates_of_each_replicate",
    "tests/test_central.py::test_third_derivative_vectors_are_finite_differences_of_hessian_products",
    "tests/test_priors.py::test_doubly_stochastic_kernels_are_balanced_with_uniform_stationary_law",
    "tests/test_positions.py::test_an_integrated_run_stores_the_strategies_kl_at_every_saved_time",
    "tests/test_kinds.py::test_nichani_loss_is_their_reduced_model_and_its_gradient_is_the_derivative",
    "tests/test_api.py::test_joint_run_stopped_early_leaves_the_limit_rows_undecided",
    "tests/test_triggers.py::test_zero_start_orders_the_blocks_by_their_powers_of_t",
    "tests/test_triggers.py::test_bietti_gradient_is_the_derivative_and_the_zero_start_is_partly_forced",
    "tests/test_docs.py::test_example_tiny[first_flow]",
    "tests/test_docs.py::test_python_blocks_run[docs/results/gd-follows-flow.md]",
    "tests/test_spectrum.py::test_modified_eta0_is_flow",
    "tests/test_plot.py::test_plot_run_writes_every_figure",
    "tests/test_spectrum.py::test_hessian_vector_products_batched_to_a_memory_budget[paper-positions]",
    "tests/test_kinds.py::test_edelman_loss_is_their_minimal_model",
    "tests/test_prefix.py::test_a_grid_over_L_draws_one_chain_and_reproduces_gflow_theory[L]",
    "tests/test_theory.py::test_chi2_mi_matches_brute_force",
    "tests/test_loss.py::test_monte_carlo_matches_exact_enumeration[trigram-stationary-counts]",
    "tests/test_positions.py::test_run_strategies_find_edelmans_phases_on_a_short_run",
    "tests/test_refmodel.py::test_every_layout_equals_direct_loss[False-shifted-layer]",
    "tests/test_member_paths.py::test_member_sde_without_noise_is_euler",
    "tests/test_kinds.py::test_nichani_heads_loss_is_the_definition_and_its_gradient_is_the_derivative",
    "tests/test_spectrum.py::test_modified_norm_growth_along_trajectory",
    "tests/test_triggers.py::test_bietti_loss_is_their_forward_pass",
    "tests/test_sweep.py::test_cli_sweep",
    "tests/test_kinds.py::test_graph_sampler_matches_its_conditional_laws[chain]",
    "tests/test_kinds.py::test_graph_bayes_counts_are_the_repository_counts",
    "tests/test_methods.py::test_every_method_writes_a_folder_load_check_and_plot_accept[gd]",
    "tests/test_methods.py::test_stochastic_run_equals_the_python_functions[sgd]",
    "tests/test_members.py::test_full_model_equals_the_official_forward_pass[2-layer]",
    "tests/test_laws.py::test_member_stage1_rates_equal_flow_at_t0[residual]",
    "tests/test_spectrum.py::test_run_spectrum_saved_and_drawn",
    "tests/test_kinds.py::test_graph_sampler_matches_its_conditional_laws[icl]",
    "tests/test_priors.py::test_unigram_kernels_share_one_dirichlet_row",
    "tests/test_api.py::test_dense_solution_of_a_staged_run",
    "tests/test_spectrum.py::test_scale_invariance_exact",
    "tests/test_sgd.py::test_full_batch_sgd_is_gd",
    "tests/test_loss.py::test_short_context_padding[layer]",
    "tests/test_loss.py::test_gradient_matches_finite_differences[counts-sum]",
    "tests/test_docs.py::test_python_blocks_run[docs/guides/checks.md]",
    "tests/test_theory.py::test_theory_report_is_json_and_consistent",
    "tests/test_members.py::test_loss_and_gradient_agree_across_layouts[token]",
    "tests/test_laws.py::test_gih_both_norms_exact_onehot[S0-positions]",
    "tests/test_robust.py::test_nan_trajectory_fails_check",
    "tests/test_layers.py::test_importing_gflow_leaves_other_libraries_alone",
    "tests/test_positions.py::test_edelman_every_position_gradient_is_central_differences",
    "tests/test_kinds.py::test_graph_sampler_matches_its_conditional_laws[graph2]",
    "tests/test_kinds.py::test_dag_sampler_matches_its_conditional_laws[graph2]",
    "tests/test_api.py::test_save_times_and_the_dense_solution_agree",
    "tests/test_evaluate.py::test_eval_at_the_training_configuration_reproduces_the_final_loss",
    "tests/test_kinds.py::test_dag_bayes_counts_are_the_repository_counts_and_exact",
    "tests/test_kinds.py::test_dag_sampler_matches_its_conditional_laws[random]",
    "tests/test_members.py::test_neutral_values_give_the_papers_model[value]",
    "tests/test_theory.py::test_J_tends_to_Itilde_as_L_grows",
    "tests/test_refmodel.py::test_predict_equals_direct[False-aligned-layer]",
    "tests/test_scale.py::test_chunked_equals_unchunked[counts]",
    "tests/test_flow.py::test_batch_throw_raises_the_first_failure",
    "tests/test_refmodel.py::test_m1_shifted_reads_offset_h[positions]",
    "tests/test_kinds.py::test_graph_chi2_mi_follows_the_data_processing_inequality",
    "tests/test_methods.py::test_stochastic_report_is_judged_on_the_seed_mean[sde]",
    "tests/test_sgd.py::test_method_sgd_routes_to_gflow_sgd",
    "tests/test_members.py::test_full_model_dead_head_carries_nothing",
    "tests/test_loss.py::test_layouts_agree[sum-log]",
    "tests/test_triggers.py::test_bayes_rung_and_output_positions_are_the_per_sequence_rules",
    "tests/test_data.py::test_stationary_law_of_a_chain_rounding_made_reducible",
    "tests/test_members.py::test_member_gradient_equals_finite_differences[token_factorised]",
    "tests/test_kinds.py::test_dag_sampler_matches_its_conditional_laws[heap]",
    "tests/test_laws.py::test_gih_tail_constant[ce_on_probs-12.0]",
    "tests/test_laws.py::test_gih_both_norms_exact_onehot[S1-counts]",
    "tests/test_theory.py::test_stage3_without_a_finite_zero",
    "tests/test_config.py::test_bad_config_subprocess_sample",
    "tests/test_priors.py::test_unigram_bayes_rung_is_the_add_alpha_token_count",
    "tests/test_members.py::test_loss_and_gradient_agree_across_layouts[token_factorised]",
    "tests/test_ladder.py::test_ladder_order_on_the_test_sample",
    "tests/test_study_pages.py::test_mi_question_rows_follow_from_their_numbers",
    "tests/test_ladder.py::test_oracle_is_the_entropy_of_a_fixed_kernel",
    "tests/test_robust.py::test_reader_never_sees_a_mixed_snapshot",
    "tests/test_member_paths.py::test_member_sgd_full_batch_without_replacement_is_gd",
    "tests/test_theory.py::test_J_is_the_derivative_and_first_order_expansion",
    "tests/test_members.py::test_member_gradient_equals_finite_differences[value_ln]",
    "tests/test_sgd.py::test_fresh_sampler_transitions_match_the_kernel[parents1-stationary-2]",
    "tests/test_members.py::test_member_gradient_equals_finite_differences[paper]",
    "tests/test_theory.py::test_ordinary_rankings_tie_the_parents_with_their_supersets",
    "tests/test_model.py::test_forward_matches_materialised_features[3-30-3-3-2-sum]",
    "tests/test_refmodel.py::test_drawn_target_is_the_sampled_y[ce_on_probs]",
    "tests/test_docs.py::test_python_blocks_run[docs/guides/executors.md]",
    "tests/test_second.py::test_table_hessian_and_hvp_are_jax_second_derivatives[counts]",
    "tests/test_replicates.py::test_failed_replicate_is_kept",
    "tests/test_members.py::test_member_gradient_equals_finite_differences[token]",
    "tests/test_laws.py::test_small_a_rates_layer_norm_first_order_in_a",
    "tests/test_loss.py::test_layouts_agree[sum-ce_on_probs]",
    "tests/test_laws.py::test_small_a_rates_sum_norm_are_the_J_linearisation",
    "tests/test_positions.py::test_edelman_every_position_is_their_model_on_every_prefix",
    "tests/test_ladder.py::test_bayes_counts_from_counts_layout_equal_counts_from_tokens",
    "tests/test_plot.py::test_joint_run_plots_against_t",
    "tests/test_docs.py::test_docstring_roles_become_links",
    "tests/test_second.py::test_outer_derivatives_closed_form",
    "tests/test_members.py::test_member_gradient_equals_finite_differences[full]",
    "tests/test_checks.py::test_a_set_holding_the_residual_stream_is_checked_by_its_heads_and_offsets",
    "tests/test_spectrum.py::test_sharpness_by_lanczos_is_the_dense_spectrums_top_eigenvalue",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in SLOW:
            item.add_marker(pytest.mark.slow)
        elif item.nodeid in CI_TIER:
            item.add_marker(pytest.mark.ci)


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Each test module's compiled programs are freed when it ends: one worker of the suite
    compiles thousands of distinct programs, whose memory maps reached the kernel's cap
    (vm.max_map_count = 65,530) in test_theory.py and crashed jaxlib's compiler
    (docs/tests.md, "Memory maps")."""
    yield
    free_compiled_programs()


def _xla_cache_for_the_suite() -> None:
    """JAX's persistent compilation cache for the suite, when ``GFLOW_TEST_XLA_CACHE`` names a
    folder (off by default): one folder shared by the two xdist workers, so that a program one
    test compiled is read back by every other test (on either worker) that lowers to the same
    program, and a second run of the suite compiles almost nothing. Off by default because a first
    run with an empty folder is slower than without it (writing every program costs more than
    the few shared ones save; docs/tests.md, "Compilation"). Numbers do not depend on it: an
    entry is keyed by the program, JAX's version and the compiler's flags, and a read error (a
    file the other worker is still writing) falls back to compiling."""
    import os

    where = os.environ.get("GFLOW_TEST_XLA_CACHE", "")
    if where and where.lower() != "none":
        jax.config.update("jax_compilation_cache_dir", where)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


_xla_cache_for_the_suite()
