"""Maven POM for the local Kafka broker's jars (see fleetpulse.broker)."""
