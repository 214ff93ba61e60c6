"""`fleetpulse bot slurm`: drain, repair, validate and return nodes through Slurm's own commands."""
