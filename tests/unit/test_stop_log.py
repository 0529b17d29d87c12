"""What ipyparallel says about a cluster the user stopped, and what a crashed engine's process
printed, stay out of the notebook."""

from __future__ import annotations

import logging
import types

from nbdist.cluster.launch.stop_log import keep_crash_output, log_path, quiet_stop_log


def test_records_about_a_stopped_cluster_below_error_are_dropped_also_after_the_stop(caplog):
    logger = logging.getLogger("test-stop-log-ipyparallel")
    stopped = types.SimpleNamespace(log=logger, cluster_id="1795-abcd")
    with caplog.at_level(logging.INFO, logger=logger.name):
        with quiet_stop_log(stopped):
            logger.warning("Output for ipcontroller-1795-abcd-7:\nthe whole log")
        assert logger.level == logging.INFO  # the level is given back after the stop
        # ipyparallel learns later, on its own thread, that the killed controller exited
        logger.warning("Controller stopped: {'exit_code': -9, 'identifier': 'ipcontroller-1795-abcd-7'}")  # noqa: E501
        logger.warning("Controller stopped: {'exit_code': 1, 'identifier': 'ipcontroller-other-3'}")
        logger.error("engine set ipengine-1795-abcd-1 could not be stopped")
    shown = [record.getMessage() for record in caplog.records]
    assert shown == [
        "Controller stopped: {'exit_code': 1, 'identifier': 'ipcontroller-other-3'}",
        "engine set ipengine-1795-abcd-1 could not be stopped",
    ]


def test_a_crashed_processs_output_goes_to_the_log_file_and_one_line_names_it(caplog, tmp_path):
    logger = logging.getLogger("test-crash-output-ipyparallel")
    keep_crash_output(logger, str(tmp_path), "1795-efgh")
    keep_crash_output(logger, str(tmp_path), "1795-efgh")  # once per logger
    debug_log = "".join(f"[Engine.1] Handling apply_request: {i}\n" for i in range(100))
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        logger.warning("Output for %s:\n%s", "1", debug_log)  # as ipyparallel's launcher logs
        logger.debug("Output for %s:\n%s", "2", "a normal exit\n")
        logger.warning("engine set stopped 1: {'exit_code': -9}")
    path = log_path(str(tmp_path), "1795-efgh")
    shown = [record.getMessage() for record in caplog.records]
    assert shown == [
        f"[nbdist] engine process 1 exited unexpectedly; what its process printed is in {path}",
        "engine set stopped 1: {'exit_code': -9}",
    ]
    with open(path) as file:
        kept = file.read()
    assert kept.count("Handling apply_request") == 100 and "a normal exit" in kept
    assert "===== engine process 1, exited at " in kept
