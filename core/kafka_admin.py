"""Topic administration on whichever cluster is configured: create what is missing and wait for leaders, delete a namespace."""

from __future__ import annotations

import asyncio
import time

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from core.errors import BrokerError

async def create_missing(client_args: dict, wanted: list[NewTopic], timeout: float = 30) -> list[str]:
    """Create whichever of `wanted` do not exist yet, then wait for their partition leaders."""
    admin = AIOKafkaAdminClient(**client_args)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [nt for nt in wanted if nt.name not in existing]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another process created them between list and create
            await _wait_for_leaders(admin, [nt.name for nt in missing], timeout)
        return [nt.name for nt in missing]
    finally:
        await admin.close()


async def _wait_for_leaders(admin: AIOKafkaAdminClient, names: list[str], timeout: float) -> None:
    """New topics refuse writes until their partitions have leaders; wait so producers start clean."""
    deadline = time.monotonic() + timeout
    while True:
        described = await admin.describe_topics(names)
        pending = [
            d["topic"] for d in described
            if d["error_code"] != 0 or not d["partitions"] or any(p["leader"] < 0 for p in d["partitions"])
        ]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise BrokerError(f"topics without leaders after {timeout:.0f}s: {', '.join(pending[:5])}")
        await asyncio.sleep(0.1)


async def delete_prefixed(client_args: dict, prefix: str) -> list[str]:
    """Delete every topic whose name starts with `prefix` (an evaluation run's namespace); returns their names."""
    if not prefix:
        raise ValueError("refusing to delete topics without a prefix")
    admin = AIOKafkaAdminClient(**client_args)
    await admin.start()
    try:
        names = sorted(t for t in await admin.list_topics() if t.startswith(prefix))
        if names:
            await admin.delete_topics(names)
        return names
    finally:
        await admin.close()
