"""Test-only handler: inductor raises on every graph, a real compile failure during initialize.

Packed as an archive's handler by the fault tests (build_mar.build(..., handler_file=...));
never part of the package.
"""

from unittest import mock

from ts_compiled_handlers.servers.torchserve.handler import Handler

INJECTED = "injected inductor failure (tests/fault_handlers/broken_compiler.py)"


class BrokenCompilerEmbedding(Handler):
    def initialize(self, context):
        with mock.patch("torch._inductor.compile_fx.compile_fx", side_effect=RuntimeError(INJECTED)):
            super().initialize(context)
