"""The floor every role stands on: errors, process settings, Kafka client configuration and admin. Imports no role."""
