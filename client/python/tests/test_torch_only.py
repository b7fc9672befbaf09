"""Issue 24: carpool.Loader with torch alone, as in a GPU node's torch environment without numpy.
A child interpreter in which `import numpy` fails reads from a real server: torch tensors over the
shared-memory slots (torch.frombuffer), zero-copy and writable, with the IDX files' bytes and
labels (read there with gzip and struct), every sample exactly once per epoch, a float transform's
shape and dtype, and as_numpy=True refused naming the fix; numpy is never imported."""

import json
import subprocess
import sys
import unittest

from fixture import IMAGES, LABELS, SUBSET, ServerFixture
from test_import import BLOCK_NUMPY, PACKAGE

try:
    import torch
except ImportError:
    torch = None

CHILD = r"""
import gzip, json, sqlite3, struct
import carpool, torch
args = json.loads(sys.argv[1])
images = gzip.open(args["images"]).read()[16:]
labels = gzip.open(args["labels"]).read()[8:]
db = sqlite3.connect(f"file:{args['catalog']}?mode=ro", uri=True)
record = dict(db.execute("SELECT id, record FROM samples"))
subset = sorted(i for i, r in record.items() if r < args["subset"])  # fm-small: records [0, 600)
pixels = 28 * 28
out = {"epochs": [], "batches": 0}
with carpool.Loader("fm-small", batch_size=64, epochs=2, socket=args["socket"]) as loader:
    for epoch in range(loader.epochs):
        seen = []
        for x, y in loader:
            ids = loader.ids
            assert isinstance(x, torch.Tensor) and x.dtype == torch.uint8, (type(x), x.dtype)
            assert tuple(x.shape[1:]) == (28, 28, 1), x.shape
            assert y.dtype == torch.int64 and ids.dtype == torch.int64, (y.dtype, ids.dtype)
            assert x.data_ptr() == loader._images_address, "not a view of the slot"
            rec = [record[i] for i in ids.tolist()]
            want = b"".join(images[r * pixels:(r + 1) * pixels] for r in rec)
            assert bytes(x.reshape(-1).tolist()) == want, "pixels differ from the IDX file"
            assert y.tolist() == [labels[r] for r in rec], "labels differ from the IDX file"
            seen += ids.tolist()
            out["batches"] += 1
        x.add_(1)  # writable: the slot is this job's alone
        out["epochs"].append([len(seen), len(set(seen)), sorted(seen) == subset])
with carpool.Loader("fm-small", batch_size=100, transform="random_crop(24)|flip|float16",
                    socket=args["socket"], seed=3) as loader:
    x, y = next(iter(loader))
    out["float"] = [str(x.dtype), list(x.shape), bool(torch.isfinite(x.float()).all())]
try:
    carpool.Loader("fm-small", socket=args["socket"], as_numpy=True)
except carpool.InvalidArgumentError as e:
    out["as_numpy"] = str(e)
out["numpy_imported"] = "numpy" in sys.modules
print(json.dumps(out))
"""


@unittest.skipIf(torch is None, "torch is not importable: the torch-only path needs torch")
class TorchOnlyLoaderTest(unittest.TestCase):
    def setUp(self):
        self.fx = ServerFixture()
        self.addCleanup(self.fx.close)

    def test_loader_without_numpy(self):
        args = dict(images=str(IMAGES), labels=str(LABELS), socket=str(self.fx.socket),
                    catalog=str(self.fx.state / "catalog.db"), subset=SUBSET)
        code = BLOCK_NUMPY.format(package=str(PACKAGE)) + CHILD
        r = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:] + self.fx.server_log())
        out = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(out["epochs"], [[SUBSET, SUBSET, True]] * 2)  # each sample once an epoch
        self.assertEqual(out["batches"], 2 * -(-SUBSET // 64))
        self.assertEqual(out["float"], ["torch.float16", [100, 1, 24, 24], True])
        self.assertIn("as_numpy=True needs numpy, which is not importable", out["as_numpy"])
        self.assertFalse(out["numpy_imported"])


if __name__ == "__main__":
    unittest.main()
