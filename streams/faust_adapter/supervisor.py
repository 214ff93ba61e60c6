"""The supervisor of each lane's faust agent: restarts a crashed lane the way faust does, and starts the replacement
so that a stop stops it.

faust 0.15.3 replaces a crashed actor with one it never starts as a service (`Agent._replace_actor` calls
`_start_one`, not `_start_one_supervised`). The supervisor stops only started services and the agent then waits for
every actor's task, so a worker whose lane had crashed once never stopped: after a crash its SIGTERM, and its own
decision to give up (streams/cli.py), hung until SIGKILL. Started here, the replacement is stopped, and its task
cancelled, like the first actor.
"""

from __future__ import annotations

from mode import ServiceT
from mode.supervisors import OneForOneSupervisor


class LaneSupervisor(OneForOneSupervisor):
    async def restart_service(self, service: ServiceT) -> None:
        index = self._index.get(service)
        await super().restart_service(service)
        if self.replacement is not None and index is not None:
            replaced = self._services[index]
            if replaced is not service and not replaced.started:
                await replaced.maybe_start()
