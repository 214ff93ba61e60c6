"""`fleetpulse evaluate`: scenarios through the real pipeline, scored against the simulator's ground truth."""
