"""Issue 10 item 4, mid-epoch resume from Python: a training process checkpoints
Loader.state_dict() after every step and is killed (SIGKILL) at random steps, sometimes before its
checkpoint and sometimes with the server restarted too; each new process resumes with
Loader(..., state=...). Over every kill point, each epoch is every sample exactly once."""

import multiprocessing as mp
import os
import pickle
import random
import signal
import unittest

import carpool
from fixture import SUBSET, ServerFixture


def train(sock, ckpt, ids_path, kill_at, kill_before_checkpoint):
    """One life of a training process: resume from `ckpt` if present, log ids, checkpoint each
    step, SIGKILL itself at step `kill_at` (never, if None)."""
    state = None
    if os.path.exists(ckpt):
        with open(ckpt, "rb") as f:
            state = pickle.load(f)
    loader = carpool.Loader("fm-small", batch_size=32, epochs=2, socket=sock, state=state,
                            as_numpy=True, seed=3)
    steps = 0
    with open(ids_path, "w") as log:
        while loader.epoch < loader.epochs:
            for _images, _labels in loader:
                log.write("".join(f"{loader.epoch},{i}\n" for i in loader.ids))
                log.flush()
                steps += 1
                if steps == kill_at and kill_before_checkpoint:
                    os.kill(os.getpid(), signal.SIGKILL)
                with open(ckpt + ".tmp", "wb") as f:
                    pickle.dump(loader.state_dict(), f)
                os.replace(ckpt + ".tmp", ckpt)
                if steps == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
    loader.close()
    os._exit(0)


def samples_at(ckpt):
    if not os.path.exists(ckpt):
        return 0
    with open(ckpt, "rb") as f:
        return pickle.load(f)["samples"]


class ResumeTest(unittest.TestCase):
    def setUp(self):
        self.fx = ServerFixture()

    def tearDown(self):
        self.fx.close()

    def life(self, ckpt, ids_path, kill_at, before):
        p = mp.get_context("fork").Process(
            target=train, args=(str(self.fx.socket), ckpt, ids_path, kill_at, before))
        p.start()
        p.join(60)
        self.assertFalse(p.is_alive(), "a training life hung")
        return p.exitcode

    def test_kill_and_resume_points_lose_and_repeat_nothing(self):
        rng = random.Random(7)
        lo, _ = self.fx.id_range("fm")
        expected = set(range(lo, lo + SUBSET))
        kills = restarts = 0
        for t in range(3):
            ckpt = os.path.join(self.fx.tmp.name, f"t{t}.pkl")
            kept, before = [], 0
            for life in range(9):
                ids_path = os.path.join(self.fx.tmp.name, f"t{t}-{life}.ids")
                last = life == 8
                code = self.life(ckpt, ids_path, None if last else rng.randint(1, 6),
                                 rng.random() < 0.3)
                # A life may finish its training before its kill step comes.
                self.assertIn(code, (0,) if last else (0, -signal.SIGKILL), self.fx.server_log())
                kills += code == -signal.SIGKILL
                now = samples_at(ckpt)
                with open(ids_path) as f:
                    lines = [tuple(map(int, line.split(","))) for line in f]
                self.assertGreaterEqual(len(lines), now - before)
                kept += lines[:now - before]
                before = now
                if code == 0:
                    break
                if rng.random() < 0.25:
                    self.fx.server.stop()
                    self.fx.server.start()
                    restarts += 1
            for epoch in (0, 1):
                got = [s for e, s in kept if e == epoch]
                self.assertEqual(len(got), SUBSET, f"training {t} epoch {epoch}")
                self.assertEqual(set(got), expected, f"training {t} epoch {epoch}")
        print(f"python resume: {kills} kill points, {restarts} server restarts")
        self.assertGreaterEqual(kills, 20)

    def test_state_dict_reads_and_load_state_dict_comes_first(self):
        sock = str(self.fx.socket)
        with carpool.Loader("fm-small", batch_size=100, epochs=2, socket=sock,
                            as_numpy=True) as a:
            it = iter(a)
            next(it)
            next(it)
            sd = a.state_dict()
            self.assertEqual((sd["dataset"], sd["epochs"], sd["epoch"], sd["batches"],
                              sd["samples"], sd["taken"]), ("fm-small", 2, 0, 2, 200, 200))
            with self.assertRaises(carpool.CarpoolError) as cm:
                a.load_state_dict(sd)
            self.assertIn("before the loader's first batch", str(cm.exception))
        with carpool.Loader("fm-small", batch_size=100, epochs=2, socket=sock,
                            as_numpy=True) as b:
            b.load_state_dict(sd)
            self.assertEqual(b.epoch, 0)
            rest = [i for _ in b for i in b.ids]
            self.assertEqual(len(rest), SUBSET - 200)
            self.assertEqual(b.batch_index, 5)  # batches 2..5 of epoch 0
        with self.assertRaises(carpool.CarpoolError) as cm:
            carpool.Loader("fm", batch_size=100, socket=sock, state=sd)
        self.assertIn('position is in dataset "fm-small"', str(cm.exception))
        with self.assertRaises(ValueError):  # an argument error, found before the server
            carpool.Loader("fm-small", batch_size=100, socket=sock, state={"epoch": 1})


if __name__ == "__main__":
    unittest.main()
