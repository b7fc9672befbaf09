"""carpool.datasets over `carpool dataset ... --json` (issue 24 item 2), on a temporary catalog
with Fashion-MNIST t10k registered; and the CLI's JSON itself, errors included."""

import json
import pathlib
import subprocess
import tempfile
import unittest

import carpool
import carpool.datasets as cds
from fixture import IMAGES, LABELS, read_idx

STATE = None
TMP = None


def setUpModule():
    global STATE, TMP
    TMP = tempfile.TemporaryDirectory(prefix="carpool-pyds-")
    STATE = pathlib.Path(TMP.name)


def tearDownModule():
    TMP.cleanup()


class DatasetsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fm = cds.add("fm", idx=(IMAGES, LABELS), state_dir=STATE)
        cls.labels = read_idx(LABELS)

    def test_add_reports_the_registration(self):
        fm = self.fm
        self.assertEqual((fm["name"], fm["samples"], fm["new_samples"]), ("fm", 10000, 10000))
        self.assertEqual(fm["classes"], [str(i) for i in range(10)])
        self.assertEqual(fm["prepare"], "raw,channels=1")
        self.assertEqual(fm["ids"][1] - fm["ids"][0] + 1, 10000)
        again = cds.add("fm-again", idx=(str(IMAGES), LABELS), state_dir=STATE)
        self.assertEqual((again["new_samples"], again["ids"]), (0, fm["ids"]))  # same files
        cds.remove("fm-again", state_dir=STATE)

    def test_add_from_a_folder_a_list_and_tar_shards(self):
        gen = STATE / "gen"
        carpool.cli("dataset", "gen", gen / "dir", "--count", 12, "--size", "64x48",
                    "--classes", 3, "--quiet")
        carpool.cli("dataset", "gen", gen / "tar", "--count", 12, "--size", "64x48",
                    "--classes", 3, "--tar", "--shard-size", 5, "--quiet")
        folder = cds.add("t-dir", dir=gen / "dir", prepare="resize=32,crop=32", state_dir=STATE)
        self.assertEqual((folder["samples"], len(folder["classes"])), (12, 3))
        self.assertEqual(folder["prepare"], "resize=32,crop=32")
        files = sorted((gen / "dir").rglob("*.jpg"))
        (gen / "list.csv").write_text("".join(f"{f},{i % 2}\n" for i, f in enumerate(files[:4])))
        listed = cds.add("t-list", list=gen / "list.csv", state_dir=STATE)
        self.assertEqual((listed["samples"], listed["new_samples"]), (4, 0))  # the same files
        shards = cds.add("t-tar", tar=sorted((gen / "tar").glob("*.tar")), state_dir=STATE)
        self.assertEqual(shards["samples"], 12)
        pattern = cds.add("t-tar2", tar=str(gen / "tar" / "train-{000000..000002}.tar"),
                          state_dir=STATE)
        self.assertEqual(pattern["ids"], shards["ids"])
        for n in ("t-dir", "t-list", "t-tar", "t-tar2"):
            cds.remove(n, state_dir=STATE)

    def test_derive_by_classes_fraction_and_ids(self):
        shoes = cds.derive("t-shoes", "fm", classes=[5, "7", 9], state_dir=STATE)
        self.assertEqual(shoes["samples"], int(sum((self.labels == c).sum() for c in (5, 7, 9))))
        part = cds.derive("t-part", "fm", fraction=0.1, seed=3, state_dir=STATE)
        self.assertEqual(part["samples"], 1000)
        lo = self.fm["ids"][0]
        head = cds.derive("t-head", "fm", ids=(lo, lo + 600), state_dir=STATE)
        self.assertEqual((head["samples"], head["ids"]), (600, [lo, lo + 599]))
        tail = cds.derive("t-tail", "fm", ids=f"{lo + 500}:", state_dir=STATE)
        self.assertEqual(tail["samples"], 9500)
        ov = cds.overlap("t-head", "t-tail", state_dir=STATE)
        self.assertEqual((ov["size_a"], ov["size_b"], ov["common"], ov["union"]),
                         (600, 9500, 100, 10000))
        self.assertAlmostEqual(ov["jaccard"], 0.01)
        self.assertAlmostEqual(ov["share_bound"], 100 / 9500)
        self.assertEqual(cds.union("t-u", "t-head", "t-tail", state_dir=STATE)["samples"], 10000)
        self.assertEqual(cds.intersect("t-i", "t-head", "t-tail", state_dir=STATE)["samples"], 100)
        self.assertEqual(cds.minus("t-m", "t-head", "t-tail", state_dir=STATE)["samples"], 500)
        names = {d["name"]: d for d in cds.list(state_dir=STATE)}
        self.assertTrue({"fm", "t-shoes", "t-part", "t-head", "t-u", "t-i", "t-m"} <= set(names))
        self.assertEqual(names["t-i"]["samples"], 100)
        info = cds.info("t-head", state_dir=STATE)
        self.assertEqual(info["samples"], 600)
        common = {o["name"]: o["common"] for o in info["overlap"]}
        self.assertEqual((common["fm"], common["t-tail"]), (600, 100))
        for n in ("t-shoes", "t-part", "t-head", "t-tail", "t-u", "t-i", "t-m"):
            self.assertTrue(cds.remove(n, state_dir=STATE))
        self.assertNotIn("t-head", {d["name"] for d in cds.list(state_dir=STATE)})
        self.assertFalse(cds.remove("t-head", missing_ok=True, state_dir=STATE))

    def test_cli_errors_are_carpool_errors_with_its_message(self):
        with self.assertRaises(carpool.CarpoolError) as cm:
            cds.derive("x", "no-such", classes=[1], state_dir=STATE)
        self.assertIn('dataset "no-such" not found', str(cm.exception))
        self.assertEqual(cm.exception.code_name, "NotFound")
        self.assertIsInstance(cm.exception, carpool.NotFoundError)
        self.assertIsInstance(cm.exception, LookupError)
        with self.assertRaises(carpool.CarpoolError) as cm:
            cds.add("fm", idx=(IMAGES, LABELS), state_dir=STATE)
        self.assertIn('dataset "fm" already exists', str(cm.exception))
        with self.assertRaises(carpool.CarpoolError) as cm:
            cds.derive("t-none", "fm", ids=(0, 1), state_dir=STATE)
        self.assertIn("would be empty", str(cm.exception))
        with self.assertRaises(carpool.CarpoolError) as cm:
            cds.add("t-missing", dir=STATE / "absent", state_dir=STATE)
        self.assertIn("absent", str(cm.exception))
        with self.assertRaises(carpool.CarpoolError) as cm:
            cds.remove("no-such", state_dir=STATE)
        self.assertEqual(cm.exception.code_name, "NotFound")
        self.assertIsInstance(cm.exception, carpool.NotFoundError)
        with self.assertRaises(carpool.InvalidArgumentError) as cm:  # the CLI parses the spec
            cds.derive("t-bad-spec", "fm", fraction=0.5, prepare="resize=-3", state_dir=STATE)
        self.assertIn("resize", str(cm.exception))
        self.assertEqual(cm.exception.code_name, "InvalidArgument")
        self.assertIsInstance(cm.exception, ValueError)

    def test_argument_errors_come_first(self):
        cases = [
            (ValueError, "exactly one source", lambda: cds.add("a", state_dir=STATE)),
            (ValueError, "exactly one source",
             lambda: cds.add("a", dir="/x", list="/y.csv", state_dir=STATE)),
            (TypeError, "pair", lambda: cds.add("a", idx="/x", state_dir=STATE)),
            (ValueError, "exactly one of classes", lambda: cds.derive("a", "fm", state_dir=STATE)),
            (ValueError, "fraction must be in", lambda: cds.derive("a", "fm", fraction=1.5)),
            (ValueError, "fraction must be a number > 0", lambda: cds.derive("a", "fm",
                                                                              fraction=0)),
            (ValueError, "seed= goes with fraction", lambda: cds.derive("a", "fm", classes=[1],
                                                                        seed=2)),
            (ValueError, "lo < hi", lambda: cds.derive("a", "fm", ids=(5, 5))),
            (ValueError, "LO:HI", lambda: cds.derive("a", "fm", ids="5-9")),
            (TypeError, "class", lambda: cds.derive("a", "fm", classes=[1.5])),
            (ValueError, "classes is empty", lambda: cds.derive("a", "fm", classes=[])),
            (TypeError, "name must be a str", lambda: cds.info(3)),
            (ValueError, "starts with '-'", lambda: cds.info("--help")),
            (TypeError, "replace must be True or False", lambda: cds.union("a", "b", "c",
                                                                           replace="y")),
        ]
        for exc, words, call in cases:
            with self.subTest(words=words), self.assertRaises(exc) as cm:
                call()
            self.assertIn(words, str(cm.exception))


class CliJsonTest(unittest.TestCase):
    def run_cli(self, *args):
        r = subprocess.run([carpool.binary(), "dataset", *args, "--json", "--state-dir",
                            str(STATE)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 1, r.stdout)  # exactly one object, on one line
        return r.returncode, json.loads(lines[0]), r.stderr

    def test_errors_are_one_object_on_stdout_with_the_exit_code(self):
        rc, out, err = self.run_cli("show", "no-such")
        self.assertEqual(rc, 1)
        self.assertIn('dataset "no-such" not found', out["error"])
        self.assertEqual((out["code"], out["status"], out["usage"], out["verb"]),
                         (2, "not found", False, "show"))
        self.assertEqual(err, "")
        rc, out, _ = self.run_cli("overlap", "only-one")
        self.assertEqual((rc, out["code"], out["usage"]), (2, 1, True))
        self.assertIn("expected 2 dataset names, got 1", out["error"])
        rc, out, _ = self.run_cli("frobnicate")
        self.assertEqual(rc, 2)
        self.assertIn('unknown verb "frobnicate"', out["error"])
        rc, out, _ = self.run_cli("gen", str(STATE / "g"), "--count", "1")
        self.assertEqual(rc, 2)  # gen writes files, it has no JSON report
        self.assertIn("json", out["error"])

    def test_ls_is_one_object(self):
        rc, out, _ = self.run_cli("ls")
        self.assertEqual(rc, 0)
        self.assertIsInstance(out["datasets"], list)


if __name__ == "__main__":
    unittest.main()
