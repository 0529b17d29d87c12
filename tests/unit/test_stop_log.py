"""What ipyparallel says about a cluster the user stopped stays out of the notebook."""

from __future__ import annotations

import logging
import types

from nbdist.cluster.stop_log import quiet_stop_log


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
