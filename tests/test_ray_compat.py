"""robusttune.experiments.sweep.ray_compat against the pinned Ray: every private or developer API the sweep
layer relies on still exists and means what the adapter says. A Ray upgrade fails here first."""

from __future__ import annotations

import inspect
from pathlib import Path

from robusttune.experiments.sweep import ray_compat


def test_ray_is_the_pinned_version():
    import ray

    assert ray.__version__ == ray_compat.RAY_VERSION


def test_tune_stops_a_function_trainable_with_system_exit():
    """TrialStopped is what Ray raises inside tune.report when it stops a trial."""
    from ray.train._internal.session import _TrainSession

    source = inspect.getsource(_TrainSession._report_training_result)
    assert "stop_event.is_set()" in source and "sys.exit(0)" in source
    assert ray_compat.TrialStopped is SystemExit


def test_autoscaling_ceiling_is_unknown_on_a_local_ray(ray_session):
    from ray._private.state import state

    assert callable(state.get_max_resources_from_cluster_config)
    ceiling = ray_compat.autoscaling_ceiling()
    assert ceiling is None or isinstance(ceiling, dict)


def test_autoscaler_node_types_sources_are_where_the_adapter_looks(ray_session, tmp_path):
    """autoscaling_node_types reads Ray's published cluster config, else the autoscaler's
    command line (``monitor.py --gcs-address=... --autoscaling-config=...``) and its file."""
    from ray._private import services
    from ray._private.state import state
    from ray.autoscaler._private import monitor

    assert callable(state.get_cluster_config)
    assert monitor.__file__.endswith("autoscaler/_private/monitor.py")
    source = inspect.getsource(services.start_monitor)
    assert '"--autoscaling-config="' in source and 'f"--gcs-address={gcs_address}"' in source
    # a local Ray has no autoscaler config: unknown, so nothing is refused for want of one
    assert ray_compat.autoscaling_node_types() is None
    assert ray_compat._monitor_config_path("127.0.0.1:1") is None
    config = tmp_path / "autoscaling.json"
    config.write_text(
        '{"head_node_type": "h", "available_node_types": {"h": {"resources": {"CPU": 0}},'
        ' "w": {"resources": {"CPU": 2, "GPU": 1}, "max_workers": 3},'
        ' "off": {"resources": {"CPU": 8}, "max_workers": 0}}}'
    )
    assert ray_compat.config_node_types(config) == {
        "h": {"CPU": 0.0},
        "w": {"CPU": 2.0, "GPU": 1.0},
    }
    config.write_text('{"head_node_type": "h", "available_node_types": {"h": {"resources": {}}}}')
    assert ray_compat.config_node_types(config) is None  # left for the provider to fill in


def test_tuner_and_result_grid_internals(ray_session, tmp_path):
    """A two-trial Tuner: grid_trials gives status, config, last result and folder of each trial;
    trial_storage names the folder the trial writes to; a restored Tuner's run config is editable."""
    import pyarrow.fs
    from ray import tune

    def trainable(config):
        filesystem, path = ray_compat.trial_storage(tune.get_context())
        assert isinstance(filesystem, pyarrow.fs.LocalFileSystem)
        tune.report({"x": config["x"], "folder": path})

    tuner = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1, 2])},
        run_config=tune.RunConfig(name="compat", storage_path=str(tmp_path), verbose=0),
    )
    grid = tuner.fit()
    trials = ray_compat.grid_trials(grid)
    assert sorted(t.config["x"] for t in trials) == [1, 2]
    assert {t.status for t in trials} == {"TERMINATED"}
    for trial in trials:
        assert trial.last_result["x"] == trial.config["x"]
        assert trial.last_result["folder"] == trial.path
    restored = tune.Tuner.restore(str(tmp_path / "compat"), trainable=trainable)
    run_config = ray_compat.restored_run_config(restored)
    run_config.verbose = 0
    assert ray_compat.restored_run_config(restored).verbose == 0


def test_no_other_module_reaches_into_ray_privates():
    """Private Ray and TensorBoard attributes appear only in ray_compat.py."""
    root = Path(ray_compat.__file__).parents[1]
    for path in root.rglob("*.py"):
        if path.name == "ray_compat.py":
            continue
        text = path.read_text()
        for private in (
            "ray._private",
            "_local_tuner",
            "_experiment_analysis",
            "get_storage()",
            "_get_file_writer",
        ):
            assert private not in text, f"{path} uses {private}"


def test_tune_notices_that_the_sweep_drops_are_still_logged_by_tune():
    """quiet_tune_logs matches Tune's end-of-fit notices by their text on the ray.tune.tune
    logger; each text is still in the pinned tune.run, and the filter drops only those."""
    import logging

    import ray.tune.tune as tune_module

    source = inspect.getsource(tune_module)
    assert tune_module.logger.name == ray_compat.TUNE_LOGGER
    for text in ray_compat.TUNE_NOISE:
        assert text in source, text
    assert "Tuner.restore(" in source  # the hint the sweep's users must not be shown

    seen: list[str] = []
    interrupts: list[bool] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger(ray_compat.TUNE_LOGGER)
    handler = Keep()
    logger.addHandler(handler)
    try:
        with ray_compat.quiet_tune_logs(on_interrupt=lambda: interrupts.append(True)):
            logger.warning("Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run.")
            logger.warning("Experiment has been interrupted, but the most recent state was saved.")
            logger.warning("something else")
        logger.warning("Experiment has been interrupted, after the filter")
    finally:
        logger.removeHandler(handler)
    assert seen == ["something else", "Experiment has been interrupted, after the filter"]
    assert interrupts == [True]


def test_the_sweep_silences_ray_output_through_environment_variables_tune_reads():
    """RAY_AIR_NEW_OUTPUT=0 (the older output engine, silent at verbose 0) and
    TUNE_PRINT_ALL_TRIAL_ERRORS are read by the pinned Ray where tuner.tune_environment says."""
    import ray.tune.execution.tune_controller as controller
    import ray.tune.experimental.output as output

    assert 'os.environ.get("RAY_AIR_NEW_OUTPUT", "1") == "0"' in inspect.getsource(
        output.get_air_verbosity
    )
    assert "TUNE_PRINT_ALL_TRIAL_ERRORS" in inspect.getsource(controller.TuneController.__init__)


def test_experiment_analysis_warns_on_the_logger_the_sweep_quiets():
    import logging

    import ray.tune.analysis.experiment_analysis as analysis

    assert analysis.logger.name == ray_compat.ANALYSIS_LOGGER
    assert "Failed to fetch metrics" in inspect.getsource(analysis)
    logger = logging.getLogger(ray_compat.ANALYSIS_LOGGER)
    before = logger.level
    with ray_compat.quiet_analysis():
        assert not logger.isEnabledFor(logging.WARNING) and logger.isEnabledFor(logging.ERROR)
    assert logger.level == before
