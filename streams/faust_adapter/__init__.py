"""Everything in fleetpulse that knows faust: the app, its fetch loop, producer, consumer, tables, worker and the
watchdogs for its known faults, behind the small interface docs/faust-adapter.md describes. Nothing outside this
package imports faust (.importlinter, tests/streams/test_faust_adapter.py)."""
