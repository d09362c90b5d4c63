"""The engine's safety-net timeouts around fan-out work, defined once (the runner config and the code share them).

The tools enforce their own, tighter limits (``tools.call_timeout_s``, a server's ``timeout_s``, a sub-agent's
``timeout_s``); these only catch what slips past them.
"""

from __future__ import annotations

ITEM_TIMEOUT_S = 900.0  # one fan-out item (a tool call, a sub-agent): ``runner.item_timeout_s``
FANOUT_TIMEOUT_S = 1800.0  # all fan-out items of one node together: ``runner.fanout_timeout_s``
