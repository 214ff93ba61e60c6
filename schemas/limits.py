"""Bounds on what one raw record may carry. A real host sends far less; they bound what a consumer must hold for one
record (a 10,000-GPU sample, a megabyte host name) and so what the rules can be made to act on. The validators
(schemas/validate.py) take them from the models' fields, so the sink and every stage refuse the same records."""

MAX_GPUS = 256  # GPU indices are 0..255 (a UInt8 column) and unique within a sample
GPU_INDEX_MAX = MAX_GPUS - 1
NAME_MAX = 253  # a DNS name's limit: hosts, racks, clusters, jobs
ID_MAX = 128  # UUIDs (GPU-… and MIG-… are ~40 characters), PCI bus ids, models, driver versions, collectives
TEXT_MAX = 4096  # a kernel-log line and its message (printk lines are under 1 KiB)
DURATION_US_MAX = 1e12  # ~11.6 days: a rank's compute or collective time; no timer that works reads more, and the
# straggler windows sum these in nanoseconds (a broken timer's 1e306 overflowed a window's sums to infinity)
