"""Issue 12: data-parallel training (torch.distributed, gloo, CPU) on carpool. Each test spawns R
rank processes with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, TORCHELASTIC_RUN_ID,
MASTER_ADDR/PORT), so the loaders take their rank, world size and job key from it. The ranks train
a DistributedDataParallel model; every step is an all_reduce, so unequal step counts would hang
(each test has a deadline). Rank 0 gathers the delivered sample ids: exactly once per epoch over
the union of the ranks."""

import faulthandler
import multiprocessing as mp
import os
import queue
import socket as socketlib
import time
import traceback
import unittest

import carpool
from fixture import SUBSET, ServerFixture

try:
    import torch
    import torch.distributed as dist
except ImportError:
    torch = None

def free_port():
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, run_id, sock, batch, epochs, out):
    # A rank still running near the test's deadline prints every thread's stack: where it hangs.
    faulthandler.dump_traceback_later(100, exit=False)
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world), TORCHELASTIC_RUN_ID=run_id,
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(28 * 28, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ids, steps = [], 0
        with carpool.Loader("fm-small", batch_size=batch, epochs=epochs, socket=sock,
                            transform="normalize(0.2860,0.3530)|float32") as loader:
            assert (loader.rank, loader.world_size) == (rank, world), (loader.rank, loader.world_size)
            for epoch in range(loader.epochs):
                for images, labels in loader:
                    opt.zero_grad()
                    loss = torch.nn.functional.cross_entropy(model(images.reshape(len(labels), -1)),
                                                             labels)
                    loss.backward()  # all_reduce of the gradients: every rank must step
                    opt.step()
                    ids.extend((epoch, int(i)) for i in loader.ids)
                    steps += 1
            batches_per_epoch = len(loader)
        counts = [None] * world
        dist.all_gather_object(counts, (steps, ids))
        if rank == 0:
            out.put(("ok", counts, batches_per_epoch))
        dist.destroy_process_group()
        code = 0
    except BaseException:
        out.put(("error", rank, traceback.format_exc()))
        code = 1
    # torch 1.13 can deadlock when the DDP model is freed: ~Reducer drops the last reference to
    # the gloo process group, whose destructor joins its worker thread while holding the GIL,
    # and that thread waits for the GIL to free a tensor (gdb stacks; pytorch/pytorch#56297).
    # The hung process also kept the GIL from the queue's feeder thread, so rank 0's result never
    # reached the test ("no rank reported", 1 run in 5 under CPU load). So: flush the result,
    # then leave without running any destructor.
    out.close()
    out.join_thread()
    os._exit(code)


@unittest.skipIf(torch is None, "needs torch")
class DdpGlooTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fx = ServerFixture()

    @classmethod
    def tearDownClass(cls):
        cls.fx.close()

    def run_job(self, world, batch=32, epochs=2, deadline=120.0):
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        port = free_port()
        run_id = f"pytest-{world}-{port}"
        procs = [ctx.Process(target=rank_main,
                             args=(r, world, port, run_id, self.fx.socket, batch, epochs, out))
                 for r in range(world)]
        for p in procs:
            p.start()
        try:
            kind, *rest = out.get(timeout=deadline)  # a hang (unequal steps) fails here
        except queue.Empty:
            kind, rest = "hang", []
        finally:
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
        if kind == "hang":
            self.fail(f"no rank reported within {deadline:.0f} s; the ranks' stacks are printed "
                      f"above (faulthandler)\nserver log:\n{self.fx.server_log()}")
        if kind == "error":
            self.fail(f"rank {rest[0]} failed:\n{rest[1]}\nserver log:\n{self.fx.server_log()}")
        counts, batches_per_epoch = rest
        return counts, batches_per_epoch

    def check(self, world, batch=32, epochs=2):
        counts, per_epoch = self.run_job(world, batch, epochs)
        global_batch = world * batch
        self.assertEqual(per_epoch, (SUBSET + global_batch - 1) // global_batch)
        for rank, (steps, _) in enumerate(counts):
            self.assertEqual(steps, epochs * per_epoch, f"rank {rank}")
        for epoch in range(epochs):
            seen = [i for _, ids in counts for e, i in ids if e == epoch]
            padded = len(seen) - SUBSET
            self.assertEqual(len(set(seen)), SUBSET, f"epoch {epoch}: samples missing")
            # Padding repeats fewer than `world` samples, only in the epoch's last global batch.
            self.assertGreaterEqual(padded, 0)
            self.assertLess(padded, world)

    def test_two_ranks(self):
        self.check(2)

    def test_four_ranks(self):
        self.check(4, batch=25)  # 600 = 6 x 100: no padding

    def test_three_ranks_last_batch_split_evenly(self):
        self.check(3, batch=32)  # 600 = 6 x 96 + 24: a last step of 8 per rank (padding: e2e)


if __name__ == "__main__":
    unittest.main()


class DdpIdentityTest(unittest.TestCase):
    """Where a loader's rank, world size and job key come from (no server needed)."""

    KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
            "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")

    def setUp(self):
        self.saved = {k: os.environ.pop(k) for k in self.KEYS if k in os.environ}

    def tearDown(self):
        for k in self.KEYS:
            os.environ.pop(k, None)
        os.environ.update(self.saved)

    def identity(self, **kw):
        from carpool.loader import _ddp_identity
        return _ddp_identity("ds", kw.get("rank"), kw.get("world_size"), kw.get("job_key"))[:3]

    def test_no_environment_is_a_job_of_its_own(self):
        self.assertEqual(self.identity(), (0, 1, None))

    def test_torchrun_environment_names_rank_world_and_a_key_per_loader(self):
        os.environ.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                          TORCHELASTIC_RUN_ID="run7", MASTER_ADDR="h", MASTER_PORT="29500")
        rank, world, key = self.identity()
        self.assertEqual((rank, world), (1, 2))
        self.assertTrue(key.startswith("run7@h:29500/ds/"), key)
        self.assertNotEqual(self.identity()[2], key)  # the process's next loader: another job

    def test_explicit_values_win(self):
        os.environ.update(RANK="1", WORLD_SIZE="2", TORCHELASTIC_RUN_ID="run7")
        self.assertEqual(self.identity(rank=0, world_size=3, job_key="k"), (0, 3, "k"))

    def test_bad_and_missing_values_are_refused_by_name(self):
        with self.assertRaisesRegex(ValueError, "rank 2 of world_size 2"):
            self.identity(rank=2, world_size=2, job_key="k")
        with self.assertRaisesRegex(ValueError, "needs a job_key"):
            self.identity(rank=0, world_size=2)

    def test_several_nodes_are_one_job_per_node_on_its_part(self):
        from carpool.loader import _ddp_identity
        os.environ.update(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                          TORCHELASTIC_RUN_ID="run7")
        with self.assertRaisesRegex(ValueError, "GROUP_RANK"):
            _ddp_identity("ds", None, None, None)
        os.environ["GROUP_RANK"] = "1"
        rank, world, key, node, nodes = _ddp_identity("ds", None, None, None)
        self.assertEqual((rank, world, node, nodes), (1, 2, 1, 2))
        self.assertTrue(key.startswith("run7@"), key)
