"""Issue 21: argument errors raise ValueError/TypeError before the server is asked anything,
naming the argument, the value and the fix; what the server refuses or fails raises CarpoolError
with its reason, in Python and from `carpool consume`."""

import pathlib
import subprocess
import tempfile
import unittest

import carpool

# No server listens here: a check that ran after connecting would raise CarpoolError
# (Unavailable) instead of the ValueError/TypeError these tests expect.
ABSENT = "/nonexistent-carpool-test/carpool.sock"


class LoaderArgumentTest(unittest.TestCase):
    def refused(self, exc, *words, **kwargs):
        args = dict(dataset="fm", socket=ABSENT)
        args.update(kwargs)
        with self.assertRaises(exc) as cm:
            carpool.Loader(**args)
        self.assertNotIsInstance(cm.exception, carpool.CarpoolError)
        for w in words:
            self.assertIn(w, str(cm.exception))
        return str(cm.exception)

    def test_bad_values_are_value_errors_naming_argument_value_and_fix(self):
        self.refused(ValueError, "batch_size", ">= 1", "got 0", "pass batch_size=1", batch_size=0)
        self.refused(ValueError, "epochs", "got -2", epochs=-2)
        self.refused(ValueError, "prefetch", "got 0", prefetch=0)
        self.refused(ValueError, "batch_size", "<= 4294967295", batch_size=2**32)
        self.refused(ValueError, "seed", "got -1", seed=-1)
        self.refused(ValueError, "timeout", "got 0.0", timeout=0)
        self.refused(ValueError, "dataset", "must not be empty", dataset="")
        self.refused(ValueError, '"tpu:0"', '"cpu"', "cuda:0", device="tpu:0")
        self.refused(ValueError, "rank 2 of world_size 2", "pass rank=", rank=2, world_size=2,
                     job_key="k")
        self.refused(ValueError, "job_key", rank=0, world_size=2)
        self.refused(ValueError, "as_numpy=True", "device=\"cpu\"", device="cuda:0",
                     as_numpy=True)
        self.refused(ValueError, "carpool_position", "keys ['epoch']", state={"epoch": 1})

    def test_wrong_types_are_type_errors(self):
        self.refused(TypeError, "batch_size", "'8' (str)", "int", batch_size="8")
        self.refused(TypeError, "epochs", "2.5 (float)", epochs=2.5)
        self.refused(TypeError, "batch_size", "True (bool)", batch_size=True)
        self.refused(TypeError, "dataset", "(bytes)", dataset=b"fm")
        self.refused(TypeError, "transform", "(int)", transform=3)
        self.refused(TypeError, "socket", "(int)", socket=7)
        self.refused(TypeError, "drop_last", "'yes'", drop_last="yes")
        self.refused(TypeError, "device", "(int)", device=0)
        self.refused(TypeError, "loader state", "list", state=[1, 2])

    def test_good_arguments_reach_the_server(self):
        # The same call with valid arguments gets as far as connecting: CarpoolError, Unavailable.
        with self.assertRaises(carpool.CarpoolError) as cm:
            carpool.Loader("fm", batch_size=8, socket=pathlib.Path(ABSENT))
        self.assertEqual(cm.exception.code_name, "Unavailable")


class ErrorClassTest(unittest.TestCase):
    """Issue 22: what only the server, the library or the CLI can refuse keeps raising a
    CarpoolError (old `except CarpoolError` code still catches it), of a class that is also the
    built-in exception a Python caller expects, picked by the status code."""

    def test_classes(self):
        self.assertTrue(issubclass(carpool.InvalidArgumentError, carpool.CarpoolError))
        self.assertTrue(issubclass(carpool.InvalidArgumentError, ValueError))
        self.assertTrue(issubclass(carpool.NotFoundError, carpool.CarpoolError))
        self.assertTrue(issubclass(carpool.NotFoundError, LookupError))
        self.assertTrue(issubclass(carpool.CarpoolError, RuntimeError))
        for code, cls in ((1, carpool.InvalidArgumentError), (2, carpool.NotFoundError),
                          (8, carpool.CarpoolError), (6, carpool.CarpoolError)):
            e = carpool._ffi.error("message", code)
            self.assertIs(type(e), cls)
            self.assertEqual((e.code, str(e)), (code, "message"))
        e = carpool.InvalidArgumentError("x")
        self.assertEqual((e.code, e.code_name), (1, "InvalidArgument"))

    def test_as_numpy_false_without_torch(self):
        import carpool.loader

        saved = carpool.loader.torch
        carpool.loader.torch = None
        try:
            with self.assertRaises(carpool.InvalidArgumentError) as cm:
                carpool.Loader("fm", as_numpy=False, socket=ABSENT)
        finally:
            carpool.loader.torch = saved
        self.assertIn("as_numpy=False", str(cm.exception))
        self.assertIn("pass as_numpy=True", str(cm.exception))
        self.assertEqual(cm.exception.code_name, "FailedPrecondition")
        self.assertIsInstance(cm.exception, ValueError)


class ServerArgumentTest(unittest.TestCase):
    def test_server_and_cli_arguments(self):
        with self.assertRaisesRegex(TypeError, "state_dir must be a path.*None"):
            carpool.Server(None)
        with self.assertRaisesRegex(ValueError, "grace must be >= 0 seconds, got -1"):
            carpool.Server("/tmp/x", grace=-1)
        with self.assertRaisesRegex(TypeError, r"server flag workers=\[2\] \(list\)"):
            carpool.Server("/tmp/x", workers=[2])
        with self.assertRaisesRegex(TypeError, r"cli argument 1 is None"):
            carpool.cli("dataset", None)
        with self.assertRaisesRegex(TypeError, "position bytes|loader state"):
            carpool.loader.describe_position("not bytes")


class JobFailureTest(unittest.TestCase):
    """A sample the job's transform cannot shape fails the job with the server's reason."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="carpool-pyerr-")
        state = pathlib.Path(cls.tmp.name)
        images = state / "images"
        # Prepared with a resize and no crop: 64x48 images become 53x40, 48x64 ones 40x53.
        carpool.cli("dataset", "gen", images / "wide", "--count", 10, "--size", "64x48",
                    "--classes", 1, "--quiet")
        carpool.cli("dataset", "gen", images / "tall", "--count", 10, "--size", "48x64",
                    "--classes", 1, "--quiet")
        carpool.cli("dataset", "add", "mixed", "--dir", images, "--prepare", "resize=40",
                    "--quiet", state_dir=state)
        cls.server = carpool.Server(state, log=str(state / "server.log"), cache_size="16MiB",
                                    workers=1, lease="1s").start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def test_iterating_raises_carpool_error_with_the_reason(self):
        with carpool.Loader("mixed", batch_size=4, socket=self.server.socket) as loader:
            with self.assertRaises(carpool.CarpoolError) as cm:
                for _ in loader:
                    pass
        self.assertIn("does not turn into its batch shape", str(cm.exception))
        self.assertIn("add a crop", str(cm.exception))

    def test_consume_exits_non_zero_printing_the_reason(self):
        r = subprocess.run([carpool.binary(), "consume", "--socket", self.server.socket,
                            "--dataset", "mixed", "--batch-size", "4"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("does not turn into its batch shape", r.stderr)

    def test_a_transform_that_crops_gets_every_sample(self):
        with carpool.Loader("mixed", batch_size=4, transform="center_crop(32)",
                            socket=self.server.socket, as_numpy=True) as loader:
            self.assertEqual(sum(images.shape[0] for images, _ in loader), 20)


if __name__ == "__main__":
    unittest.main()
