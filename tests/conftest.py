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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in SLOW:
            item.add_marker(pytest.mark.slow)


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
