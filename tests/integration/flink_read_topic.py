"""A tiny bounded PyFlink job: read a Kafka topic through the connector, write JSON lines.

Run by test_services_smoke.py in its own process (PyFlink starts a JVM gateway).
Keeps topic/partition/offset via Table API metadata columns, as the stream job will.
"""

from __future__ import annotations

import argparse
import json
import sys

from pyflink.common import Configuration
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.table import StreamTableEnvironment

from features.flink.connector import kafka_connector_jar


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    conf = Configuration()
    conf.set_string("python.executable", sys.executable)
    conf.set_string("pipeline.jars", kafka_connector_jar().as_uri())
    conf.set_string("restart-strategy.type", "none")
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(1)
    t_env = StreamTableEnvironment.create(env)
    t_env.execute_sql(f"""
        CREATE TABLE src (
          `value` BYTES,
          `topic` STRING METADATA VIRTUAL,
          `partition` INT METADATA VIRTUAL,
          `offset` BIGINT METADATA VIRTUAL
        ) WITH (
          'connector' = 'kafka',
          'topic' = '{args.topic}',
          'properties.bootstrap.servers' = '{args.bootstrap}',
          'properties.group.id' = 'smoke-{args.topic}',
          'scan.startup.mode' = 'earliest-offset',
          'scan.bounded.mode' = 'latest-offset',
          'properties.request.timeout.ms' = '4000',
          'properties.default.api.timeout.ms' = '5000',
          'format' = 'raw'
        )""")
    rows = t_env.to_data_stream(t_env.from_path("src"))
    with open(args.out, "w") as fh, rows.execute_and_collect() as it:
        for r in it:
            fh.write(json.dumps({"value": bytes(r.value).decode(), "topic": r.topic,
                                 "partition": r.partition, "offset": r.offset}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
