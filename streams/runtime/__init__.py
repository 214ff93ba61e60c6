"""The one stream runtime: a stage declares inputs, outputs, keyed state, config and a pure step; this runs it.

Per lane (a faust agent over the lane's input topics, concurrency 1, fed in batches straight from the fetch loop by
inbox.py): take a batch, decode and check each record once (the topic's validator; one dead letter per bad record,
written by the sink for registry topics), dispatch the records to the stages that read their topic, isolate a record
whose step raises, send the outputs, wait for their acknowledgements, then write state to the changelog with the
source record's partition, then acknowledge the records for faust to commit.
"""
