"""The ClickHouse sink: batches raw and derived topics into tables, committing offsets only after durable writes."""
