"""A carpool server on a temporary state dir with a small Fashion-MNIST subset registered, shared
by the tests of one process; and the IDX files read in plain Python, as the reference."""

import os
import pathlib
import sqlite3
import tempfile

import carpool
from carpool.idx import read_idx  # noqa: F401 (the tests' reference reader)

FMNIST = pathlib.Path(os.environ.get("CARPOOL_FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
IMAGES = FMNIST / "t10k-images-idx3-ubyte.gz"
LABELS = FMNIST / "t10k-labels-idx1-ubyte.gz"
SUBSET = 600  # samples of the test dataset "fm-small": records [0, 600) of t10k


class ServerFixture:
    """Registers fm (all of t10k) and fm-small (600 records), starts `carpool server`."""

    def __init__(self, **server_flags):
        self.tmp = tempfile.TemporaryDirectory(prefix="carpool-pytest-")
        self.state = pathlib.Path(self.tmp.name)
        carpool.cli("dataset", "add", "fm", "--idx", IMAGES, LABELS, "--quiet",
                    state_dir=self.state)
        lo, hi = self.id_range("fm")
        carpool.cli("dataset", "add", "fm-small", "--from", "fm", "--ids", f"{lo}:{lo + SUBSET}",
                    "--quiet", state_dir=self.state)
        flags = dict(cache_size="64MiB", workers=2, lease="1s")
        flags.update(server_flags)
        self.server = carpool.Server(self.state, log=str(self.state / "server.log"), **flags)
        self.server.start()
        self.socket = self.server.socket

    def id_range(self, name):
        """[lo, hi) of the catalog's sample ids of an IDX dataset (read-only SQLite)."""
        db = sqlite3.connect(f"file:{self.state / 'catalog.db'}?mode=ro", uri=True)
        try:
            (count,) = db.execute("SELECT count FROM datasets WHERE name = ?", (name,)).fetchone()
            lo, hi = db.execute("SELECT MIN(id), MAX(id) FROM samples").fetchone()
        finally:
            db.close()
        if hi - lo + 1 != count:
            raise AssertionError(f"dataset {name}: ids {lo}..{hi} are not the {count} records")
        return lo, hi + 1

    def record_of(self):
        """sample id -> record index in the IDX file, from the catalog."""
        db = sqlite3.connect(f"file:{self.state / 'catalog.db'}?mode=ro", uri=True)
        try:
            return dict(db.execute("SELECT id, record FROM samples"))
        finally:
            db.close()

    def server_log(self):
        p = self.state / "server.log"
        return p.read_text(errors="replace")[-3000:] if p.exists() else ""

    def close(self):
        self.server.stop()
        self.tmp.cleanup()
