"""carpool.idx: write_idx and read_idx round-trip, gzipped and plain; bad arrays are refused."""

import pathlib
import tempfile
import unittest

import numpy as np

from carpool.idx import read_idx, write_idx


class IdxTest(unittest.TestCase):
    def test_round_trip(self):
        rng = np.random.default_rng(1)
        with tempfile.TemporaryDirectory() as tmp:
            for name, shape in (("a-idx3-ubyte.gz", (5, 28, 28)), ("b-idx1-ubyte", (7,))):
                data = rng.integers(0, 256, shape, dtype=np.uint8)
                path = pathlib.Path(tmp) / name
                write_idx(path, data)
                self.assertEqual(path.read_bytes()[:2] == b"\x1f\x8b", name.endswith(".gz"))
                np.testing.assert_array_equal(read_idx(path), data)

    def test_non_uint8_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp, self.assertRaisesRegex(ValueError, "uint8"):
            write_idx(pathlib.Path(tmp) / "x", np.zeros(3, np.float32))


if __name__ == "__main__":
    unittest.main()
