"""`fleetpulse bot kubernetes`: cordon, taint, evict, repair, validate and return nodes through the Kubernetes API."""
