"""Local development services: PostgreSQL, Redis, Kafka (KRaft) and Flink connector jars."""
