"""carpool.Loader against a real `carpool server` (started by fixture.py) on Fashion-MNIST t10k."""

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import numpy as np

import carpool
from fixture import IMAGES, LABELS, SUBSET, ServerFixture, read_idx

try:
    import torch
except ImportError:
    torch = None

FX = None


def setUpModule():
    global FX
    FX = ServerFixture()


def tearDownModule():
    if FX is not None:
        FX.close()


def ceil_div(a, b):
    return (a + b - 1) // b


def as_np(x):
    return x.numpy() if torch is not None and isinstance(x, torch.Tensor) else np.asarray(x)


class LoaderShapesTest(unittest.TestCase):
    def test_uint8_nhwc_default(self):
        with carpool.Loader("fm-small", batch_size=64, socket=FX.socket) as loader:
            self.assertEqual(len(loader), ceil_div(SUBSET, 64))
            self.assertEqual(loader.dataset_size, SUBSET)
            self.assertEqual((loader.dtype, loader.layout), ("uint8", "nhwc"))
            sizes = []
            for images, labels in loader:
                sizes.append(images.shape[0])
                self.assertEqual(tuple(images.shape[1:]), (28, 28, 1))
                self.assertEqual(tuple(labels.shape), (images.shape[0],))
                if torch is not None:
                    self.assertIsInstance(images, torch.Tensor)
                    self.assertEqual(images.dtype, torch.uint8)
                    self.assertEqual(labels.dtype, torch.int64)
                # Zero-copy: the tensor's memory is the batch slot's.
                if torch is not None:
                    self.assertEqual(images.data_ptr(), loader._images_address)
                else:
                    self.assertEqual(images.__array_interface__["data"][0],
                                     loader._images_address)
            self.assertEqual(sizes, [64] * (SUBSET // 64) + [SUBSET % 64])
            self.assertEqual(list(loader), [])  # one epoch only: the next pass is empty

    def test_float_transforms_and_drop_last(self):
        cases = [("normalize(0.2860,0.3530)", "float32", np.float32, (1, 28, 28)),
                 ("random_crop(24)|flip|float16", "float16", np.float16, (1, 24, 24)),
                 ("center_crop(20)|float32|nhwc", "float32", np.float32, (20, 20, 1))]
        for transform, name, np_dtype, shape in cases:
            with self.subTest(transform=transform), \
                    carpool.Loader("fm-small", batch_size=100, transform=transform, drop_last=True,
                                   socket=FX.socket, seed=3) as loader:
                self.assertEqual(loader.dtype, name)
                self.assertEqual(len(loader), SUBSET // 100)
                n = 0
                for images, labels in loader:
                    arr = as_np(images)
                    self.assertEqual(arr.dtype, np_dtype)
                    self.assertEqual(arr.shape, (100,) + shape)
                    self.assertTrue(np.isfinite(arr.astype(np.float32)).all())
                    n += 1
                self.assertEqual(n, SUBSET // 100)

    def test_numpy_mode(self):
        with carpool.Loader("fm-small", batch_size=50, socket=FX.socket, as_numpy=True) as loader:
            images, labels = next(iter(loader))
            self.assertIsInstance(images, np.ndarray)
            self.assertEqual(images.__array_interface__["data"][0], loader._images_address)
            self.assertTrue(images.flags.writeable)  # the slot is this job's alone: writable
            self.assertEqual((images.dtype, labels.dtype), (np.uint8, np.int64))
            self.assertEqual(loader.ids.shape, (50,))


class LoaderDataTest(unittest.TestCase):
    def test_labels_and_pixels_equal_the_idx_files(self):
        ref_images, ref_labels = read_idx(IMAGES), read_idx(LABELS)
        record = FX.record_of()
        seen = 0
        with carpool.Loader("fm", batch_size=250, socket=FX.socket) as loader:
            for images, labels in loader:
                recs = np.array([record[int(i)] for i in loader.ids])
                np.testing.assert_array_equal(as_np(labels), ref_labels[recs].astype(np.int64))
                np.testing.assert_array_equal(as_np(images)[..., 0], ref_images[recs])
                seen += len(recs)
        self.assertEqual(seen, len(ref_labels))

    def test_batches_are_writable_and_the_next_write_reaches_the_job(self):
        # One slot (prefetch=1): every batch lands where the job wrote into the previous one.
        ref_images = read_idx(IMAGES)
        record = FX.record_of()
        seen = 0
        with carpool.Loader("fm-small", batch_size=64, prefetch=1, socket=FX.socket) as loader:
            for images, _ in loader:
                recs = np.array([record[int(i)] for i in loader.ids])
                np.testing.assert_array_equal(as_np(images)[..., 0], ref_images[recs])
                if isinstance(images, np.ndarray):
                    images -= 1  # in place, as training code does
                    images[0] = 7
                else:
                    images.sub_(1)
                    images[0] = 7
                self.assertEqual(int(as_np(images)[0].max()), 7)
                seen += len(recs)
        self.assertEqual(seen, SUBSET)

    def test_exactly_once_per_epoch_and_a_new_order_each_epoch(self):
        lo, _ = FX.id_range("fm")
        expected = np.arange(lo, lo + SUBSET)
        orders = []
        with carpool.Loader("fm-small", batch_size=48, epochs=3, socket=FX.socket,
                            prefetch=2) as loader:
            self.assertEqual(loader.epochs, 3)
            for epoch in range(3):
                ids = []
                for _ in loader:
                    self.assertEqual(loader.epoch, epoch)
                    ids.append(loader.ids.copy())
                ids = np.concatenate(ids)
                np.testing.assert_array_equal(np.sort(ids), expected)  # each id exactly once
                orders.append(ids)
            self.assertEqual(list(loader), [])
            stats = loader.stats()
        self.assertEqual(stats["deliveries"], 3 * SUBSET)
        self.assertFalse(np.array_equal(orders[0], orders[1]))
        self.assertFalse(np.array_equal(orders[1], orders[2]))
        # Not the sorted order either: a shuffle of 600 ids is sorted with probability 1/600!.
        self.assertFalse(np.array_equal(orders[0], expected))

    def test_break_resumes_the_epoch(self):
        with carpool.Loader("fm-small", batch_size=100, epochs=1, socket=FX.socket) as loader:
            ids = []
            for i, _ in enumerate(loader):
                ids.append(loader.ids.copy())
                if i == 1:
                    break
            for _ in loader:
                ids.append(loader.ids.copy())
            self.assertEqual(len(np.unique(np.concatenate(ids))), SUBSET)


class _EmptyBatchesLib:
    """libcarpool as the loader sees it, except that the batches named by (epoch, batch_index)
    report 0 samples: what the server sends when every sample of a batch was unreadable."""

    def __init__(self, lib, empty):
        self._real, self._empty = lib, set(empty)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def carpool_batch_size(self, handle):
        key = (self._real.carpool_batch_epoch(handle), self._real.carpool_batch_index(handle))
        return 0 if key in self._empty else self._real.carpool_batch_size(handle)


class LoaderEpochEndTest(unittest.TestCase):
    def test_stopping_right_after_the_last_batch_loses_no_epoch(self):
        # islice, zip and a break at the last batch never resume the pass after its last batch;
        # the next pass must still deliver the next epoch, not end on that epoch's first batch.
        lo, _ = FX.id_range("fm")
        expected = np.arange(lo, lo + SUBSET)
        with carpool.Loader("fm-small", batch_size=100, epochs=3, socket=FX.socket,
                            prefetch=2) as loader:
            n = len(loader)
            self.assertEqual(n, SUBSET // 100)
            passes = [lambda: itertools.islice(loader, n),
                      lambda: (b for _, b in zip(range(n), loader)),
                      lambda: loader]
            for epoch, make_pass in enumerate(passes):
                ids = []
                for i, _ in enumerate(make_pass()):
                    self.assertEqual((loader.epoch, loader.batch_index), (epoch, i))
                    ids.append(loader.ids.copy())
                    if epoch == 2 and i == n - 1:
                        break
                self.assertEqual(len(ids), n, f"epoch {epoch}")
                np.testing.assert_array_equal(np.sort(np.concatenate(ids)), expected)
            self.assertEqual(list(loader), [])
            self.assertEqual(loader.epoch, 3)
            self.assertEqual(loader.stats()["deliveries"], 3 * SUBSET)

    def test_a_batch_of_no_samples_is_skipped(self):
        # Batch 2 and the last batch (5) of epoch 0 come with 0 samples: the pass leaves them out
        # (no exception, no empty tensors), still ends epoch 0 there, and epoch 1 is whole.
        lo, _ = FX.id_range("fm")
        with carpool.Loader("fm-small", batch_size=100, epochs=2, socket=FX.socket, prefetch=2,
                            timeout=5) as loader:
            loader._lib = _EmptyBatchesLib(loader._lib, {(0, 2), (0, 5)})
            seen = [(loader.epoch, loader.batch_index, images.shape[0])
                    for images, _ in loader]
            self.assertEqual(seen, [(0, 0, 100), (0, 1, 100), (0, 3, 100), (0, 4, 100)])
            self.assertEqual(loader.epoch, 1)
            ids = []
            for images, _ in loader:
                self.assertEqual(loader.epoch, 1)
                ids.append(loader.ids.copy())
            self.assertEqual(len(ids), 6)
            np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(lo, lo + SUBSET))
            self.assertEqual(list(loader), [])


class LoaderSharingTest(unittest.TestCase):
    def test_two_jobs_share_preparations(self):
        before = carpool.server_stats(socket=FX.socket)
        loaders = [carpool.Loader("fm-small", batch_size=32, epochs=1, socket=FX.socket, seed=s)
                   for s in (1, 2)]
        counts, errors = [0, 0], []

        def run(k):
            try:
                for images, _ in loaders[k]:
                    counts[k] += images.shape[0]
            except Exception as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for ld in loaders:
            ld.close()
        self.assertEqual(errors, [])
        self.assertEqual(counts, [SUBSET, SUBSET])
        after = carpool.server_stats(socket=FX.socket)
        prep = after["preparations"] - before["preparations"]
        deliv = after["deliveries"] - before["deliveries"]
        self.assertEqual(deliv, 2 * SUBSET)
        # Earlier tests may have left fm-small samples cached, so preparations can be fewer still;
        # what must hold is that two jobs did not each prepare their own copy of every sample.
        self.assertLess(prep, deliv, f"preparations {prep} vs deliveries {deliv}: no sharing")


class LoaderErrorTest(unittest.TestCase):
    def test_unknown_dataset(self):
        with self.assertRaises(carpool.NotFoundError) as cm:
            carpool.Loader("no-such-dataset", batch_size=8, socket=FX.socket)
        self.assertIn("no-such-dataset", str(cm.exception))
        self.assertEqual(cm.exception.code_name, "NotFound")
        self.assertIsInstance(cm.exception, LookupError)
        self.assertIsInstance(cm.exception, carpool.CarpoolError)  # as before issue 22

    def test_bad_transform_names_the_step(self):
        with self.assertRaises(carpool.InvalidArgumentError) as cm:
            carpool.Loader("fm-small", batch_size=8, transform="rotate(5)", socket=FX.socket)
        self.assertIn("rotate(5)", str(cm.exception))
        self.assertEqual(cm.exception.code_name, "InvalidArgument")
        self.assertIsInstance(cm.exception, ValueError)
        self.assertIsInstance(cm.exception, carpool.CarpoolError)

    def test_cuda_device_is_refused_clearly(self):
        # No CUDA in this process: FailedPrecondition; a GPU the server does not serve:
        # InvalidArgument. Either way an InvalidArgumentError, so a ValueError too.
        with self.assertRaises(carpool.InvalidArgumentError) as cm:
            carpool.Loader("fm-small", batch_size=8, device="cuda:0", socket=FX.socket)
        self.assertIn("cuda:0", str(cm.exception))
        self.assertIn(cm.exception.code_name, ("FailedPrecondition", "InvalidArgument"))
        self.assertIsInstance(cm.exception, ValueError)

    def test_no_server(self):
        with self.assertRaises(carpool.CarpoolError) as cm:
            carpool.Loader("fm", batch_size=8, socket=str(FX.state / "absent.sock"))
        self.assertEqual(cm.exception.code_name, "Unavailable")


VICTIM = """
import sys, time, carpool
loader = carpool.Loader("fm-small", batch_size=16, epochs=50, socket=sys.argv[1], prefetch=4)
print(loader.job_id, flush=True)
for epoch in range(loader.epochs):
    for images, labels in loader:
        time.sleep(0.01)
"""


class KillTest(unittest.TestCase):
    def test_kill9_of_one_job_does_not_disturb_the_other(self):
        env = dict(os.environ)
        pkg = os.path.dirname(os.path.dirname(carpool.__file__))  # the victim imports this carpool
        env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
        victim = subprocess.Popen([sys.executable, "-c", VICTIM, FX.socket], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            victim_job = int(victim.stdout.readline())
            lo, _ = FX.id_range("fm")
            with carpool.Loader("fm-small", batch_size=16, epochs=2, socket=FX.socket,
                                seed=9) as loader:
                ids = []
                for i, _ in enumerate(loader):
                    if i == 5:  # both jobs are consuming: kill the other one mid-epoch
                        jobs = {j["id"] for j in carpool.server_stats(socket=FX.socket)["jobs"]}
                        self.assertIn(victim_job, jobs)
                        os.kill(victim.pid, signal.SIGKILL)
                    ids.append(loader.ids.copy())
                    time.sleep(0.005)
                np.testing.assert_array_equal(np.sort(np.concatenate(ids)),
                                              np.arange(lo, lo + SUBSET))
                for _ in loader:  # the second epoch too, after the victim is gone
                    pass
                self.assertEqual(loader.stats()["deliveries"], 2 * SUBSET)
            self.assertEqual(victim.wait(10), -signal.SIGKILL)
            deadline = time.monotonic() + 10  # lease 1 s; the closed socket removes it at once
            while time.monotonic() < deadline:
                jobs = {j["id"] for j in carpool.server_stats(socket=FX.socket)["jobs"]}
                if victim_job not in jobs:
                    break
                time.sleep(0.1)
            self.assertNotIn(victim_job, jobs, "killed job still on the server")
        finally:
            if victim.poll() is None:
                victim.kill()
                victim.wait()
