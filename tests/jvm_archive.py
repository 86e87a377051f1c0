"""A class-data-sharing archive (AppCDS) for the PyFlink JVMs the tests start (issue 46).

Each PyFlink job a test runs starts a fresh JVM (PyFlink's local gateway, which hosts the
mini-cluster) that loads and verifies ~10,000 classes from Flink's jars before the job's first
record. A dynamic CDS archive of those classes, mapped by every later JVM with
``-XX:SharedArchiveFile``, skips that work: a small job's JVM takes ~2.3 s less on this
2-core machine (measured: a datagen + pandas-UDF job, 8.3 s -> 6.1 s, 3 rounds each).

:func:`pyflink_archive` makes the archive once (a short job in its own JVM with
``-XX:ArchiveClassesAtExit``, about 12 s) into ``.cache/jvm-archives/`` (ignored by git), named
by a key of what it depends on: the JVM (its ``java`` and ``libjvm.so``), the jars on the
gateway's class path (PyFlink's ``lib/`` and ``opt/``) and the workload below. A later session
with the same key reuses it. A JVM whose class path differs (``flink run``'s client, a
standalone cluster's daemons) or another JDK finds the archive does not fit and runs
without it, silently (``-Xlog:cds=off``): an archive never changes what a JVM does, only how
fast it loads its classes. ``FEATURES_TEST_JVM_ARCHIVE=off`` turns it off.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Another key's archive unused for this long (seconds) is removed.
STALE_S = 2 * 24 * 3600
#: Options every JVM gets with the archive: a JVM it does not fit says nothing (its warning
#: would go to the job's stdout, which some tests read).
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")

#: The job run to record the classes: a pandas UDF over a datagen table on the mini-cluster,
#: the path of the stream job (Table API, Python worker, blackhole sink) without its services.
WORKLOAD = """
from pyflink.common import Configuration
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.table import DataTypes, EnvironmentSettings, StreamTableEnvironment
from pyflink.table.udf import udf

env = StreamExecutionEnvironment.get_execution_environment(Configuration())
env.set_parallelism(1)
t_env = StreamTableEnvironment.create(env, EnvironmentSettings.in_streaming_mode())
t_env.create_temporary_function(
    "plus_one", udf(lambda x: x + 1, result_type=DataTypes.BIGINT(), func_type="pandas"))
t_env.execute_sql("CREATE TEMPORARY TABLE s (x BIGINT) WITH ('connector' = 'datagen', "
                  "'number-of-rows' = '10')")
t_env.execute_sql("CREATE TEMPORARY TABLE d (x BIGINT) WITH ('connector' = 'blackhole')")
t_env.execute_sql("INSERT INTO d SELECT plus_one(x) FROM s").wait()
from pyflink.java_gateway import get_gateway
print(get_gateway().jvm.java.lang.ProcessHandle.current().pid())
"""


def gateway_class_path() -> str:
    """The class path PyFlink's local gateway runs with (``pyflink_gateway_server``)."""
    from pyflink import pyflink_gateway_server as server

    env = dict(os.environ)
    server.prepare_environment_variables(env)
    return os.pathsep.join([server.construct_flink_classpath(env), server.construct_hadoop_classpath(env)])


def java_executable() -> Path | None:
    """The ``java`` PyFlink's gateway runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(os.path.realpath(found)) if found and os.path.exists(found) else None


def archive_key(java: Path) -> str:
    """What the archive depends on: the JVM, the gateway's jars (name, size, mtime) and
    :data:`WORKLOAD`."""
    import pyflink

    home = Path(os.path.realpath(pyflink.__file__)).parent  # the gateway's class path is of the real path
    digest = hashlib.sha256(WORKLOAD.encode())
    files = [java, *sorted(java.parents[1].glob("lib/server/libjvm.so"))]
    files += sorted((home / "lib").glob("*.jar")) + sorted((home / "opt").glob("*.jar"))
    for path in files:
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def pyflink_archive(jvm_args: str, folder: Path = ROOT / ".cache" / "jvm-archives") -> Path | None:
    """The archive of the PyFlink gateway's classes under ``folder``, made now (under a lock
    file: one session makes it while the others wait) unless one of this key exists; None
    when it cannot be made (no ``java``, the recording job failed, or the archive it wrote
    does not map: the tests then run without it, as before). ``jvm_args`` are the JVM
    options of the recording job."""
    java = java_executable()
    if java is None:
        return None
    key = archive_key(java)
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / f"pyflink-{key}.jsa"
    with (folder / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for other in folder.glob("*.jsa"):
            if other != archive and time.time() - other.stat().st_mtime > STALE_S:
                other.unlink()
        if archive.is_file() and maps(java, archive):  # 0.4 s: a damaged one would crash every JVM
            os.utime(archive)  # in use: not stale
            return archive
        archive.unlink(missing_ok=True)
        partial = folder / f".pyflink-{key}.{os.getpid()}.jsa"
        env = {**os.environ, "JVM_ARGS": f"{jvm_args} -XX:ArchiveClassesAtExit={partial} {' '.join(QUIET)}"}
        try:
            done = subprocess.run([sys.executable, "-c", WORKLOAD], env=env, cwd=folder, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=300)
            # The JVM writes the archive as it exits, after the Python client has ended.
            pid = int(done.stdout.split()[-1]) if done.returncode == 0 and done.stdout.split() else 0
            deadline = time.monotonic() + 120
            while pid and _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            made = bool(pid) and not _alive(pid) and partial.is_file() and maps(java, partial)
        except (subprocess.TimeoutExpired, ValueError):
            made = False
        if not made:
            partial.unlink(missing_ok=True)
            return None
        partial.rename(archive)
        return archive


def maps(java: Path, archive: Path) -> bool:
    """Whether a JVM with the gateway's class path maps ``archive`` (``-Xshare:on``: one that
    cannot exits with an error): a half-written or unfitting archive is never kept (a
    truncated one crashes the JVM: its ``hs_err`` file goes beside the archive)."""
    done = subprocess.run([str(java), "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp",
                           gateway_class_path(), "-version"], capture_output=True, timeout=120,
                          cwd=archive.parent)
    return done.returncode == 0


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def with_archive(jvm_args: str) -> str:
    """``jvm_args`` with :func:`pyflink_archive`'s archive (and :data:`QUIET`); unchanged when
    they name an archive already, when ``FEATURES_TEST_JVM_ARCHIVE`` is ``off`` or when
    none could be made."""
    if "SharedArchiveFile" in jvm_args or \
            os.environ.get("FEATURES_TEST_JVM_ARCHIVE", "").lower() in ("off", "0", "no", "false"):
        return jvm_args
    archive = pyflink_archive(jvm_args)
    if archive is None:
        return jvm_args
    return " ".join([jvm_args, f"-XX:SharedArchiveFile={archive}", *QUIET]).strip()
