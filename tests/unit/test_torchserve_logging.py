"""The worker drops TorchServe's line per batch (handlers/servers/torchserve/adapter.py) and nothing else."""

import logging

from ts_compiled_handlers.servers.torchserve.adapter import PerBatchLines, quiet_per_batch_lines


def test_the_worker_drops_torchserve_s_line_per_batch_only(caplog):
    root = logging.getLogger()
    try:
        quiet_per_batch_lines()
        quiet_per_batch_lines()  # every initialize calls it: one filter per process
        assert sum(isinstance(each, PerBatchLines) for each in root.filters) == 1
        logged = (
            (
                "/venv/ts/protocol/otf_message_handler.py",
                "Backend received inference at: %d",
            ),  # TorchServe's, per batch
            ("/venv/ts/service.py", "Backend received inference at: %d"),  # the same words elsewhere: kept
            ("/venv/ts/protocol/otf_message_handler.py", "Frontend disconnected."),  # its other lines: kept
        )
        with caplog.at_level(logging.INFO):
            for path, message in logged:
                arguments = (1,) if "%d" in message else ()
                root.handle(root.makeRecord("root", logging.INFO, path, 1, message, arguments, None))
        assert [record.getMessage() for record in caplog.records] == [
            "Backend received inference at: 1",
            "Frontend disconnected.",
        ]
    finally:
        for each in [each for each in root.filters if isinstance(each, PerBatchLines)]:
            root.removeFilter(each)
