"""The `carpool` command and carpool.datasets need no numpy (a GPU node's torch environment may have
none); the Loader imports it on first use and says so when it is missing."""

import os
import pathlib
import subprocess
import sys
import unittest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent

# Runs in a child interpreter where importing numpy fails, as where it is not installed.
BLOCK_NUMPY = """
import sys
class NoNumpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError("No module named 'numpy'", name="numpy")
        return None
sys.meta_path.insert(0, NoNumpy())
sys.path.insert(0, {package!r})
"""


def run_without_numpy(code):
    return subprocess.run([sys.executable, "-c", BLOCK_NUMPY.format(package=str(PACKAGE)) + code],
                          capture_output=True, text=True, timeout=60)


class ImportWithoutNumpyTest(unittest.TestCase):
    def test_command_and_datasets_import_without_numpy(self):
        r = run_without_numpy("import carpool, carpool._command, carpool.datasets\n"
                              "print('numpy' in sys.modules, carpool.binary.__name__)")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["False", "binary"])

    def test_loader_imports_without_numpy(self):
        r = run_without_numpy("import carpool\n"
                              "print(carpool.Loader.__name__, 'numpy' in sys.modules)")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["Loader", "False"])

    def test_loader_without_numpy_or_torch_says_so_before_connecting(self):
        hide_torch = BLOCK_NUMPY.replace('name == "numpy" or name.startswith("numpy.")',
                                         'name.split(".")[0] in ("numpy", "torch")')
        code = ("import carpool\n"
                "try:\n"
                "    carpool.Loader('fm', socket='/nonexistent-carpool-test/carpool.sock')\n"
                "except carpool.InvalidArgumentError as e:\n"
                "    print(e.code_name, str(e))\n")
        r = subprocess.run([sys.executable, "-c", hide_torch.format(package=str(PACKAGE)) + code],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("FailedPrecondition", r.stdout)  # not Unavailable: no connection was tried
        self.assertIn("carpool.Loader needs torch or numpy", r.stdout)
        self.assertIn("imports neither; install torch (or numpy)", r.stdout)

    def test_unknown_attribute_is_an_attribute_error(self):
        r = run_without_numpy("import carpool\ncarpool.NoSuchThing")
        self.assertIn("AttributeError: module 'carpool' has no attribute 'NoSuchThing'", r.stderr)


if __name__ == "__main__":
    unittest.main()


def run_clean(code, env_extra=None):
    """`code` in a child interpreter with CUDA_DEVICE_MAX_CONNECTIONS unset unless given."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", f"import sys\nsys.path.insert(0, {str(PACKAGE)!r})\n"
                           + code], capture_output=True, text=True, timeout=60, env=env)


# A GPU job's decode beside its training needs CUDA's 32 hardware queues, set before the
# process's CUDA context exists (docs/gpu.md, item 12 of "Decoding in the jobs' processes").
class CudaConnectionsTest(unittest.TestCase):
    def test_import_sets_32_when_unset(self):
        r = run_clean("import carpool, os\nprint(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'))")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["32"])
        self.assertNotIn("Warning", r.stderr)

    def test_a_value_the_user_set_wins(self):
        r = run_clean("import carpool, os\nprint(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'))",
                      {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["1"])

    def test_cuda_already_up_warns_and_names_the_fix(self):
        # A stand-in torch whose CUDA is initialized: too late to set it for this process.
        fake = ("import types\n"
                "torch = types.ModuleType('torch')\n"
                "torch.cuda = types.SimpleNamespace(is_initialized=lambda: True)\n"
                "sys.modules['torch'] = torch\n"
                "import carpool, os\nprint(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'))")
        r = run_clean(fake)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["None"])
        self.assertIn("RuntimeWarning", r.stderr)
        self.assertIn("CUDA_DEVICE_MAX_CONNECTIONS=32", r.stderr)
        self.assertIn("import carpool before touching CUDA", r.stderr)
