"""Host side: collectors that read a GPU host, the Kafka publisher they share, and the fleet simulator."""
