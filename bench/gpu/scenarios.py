"""The GPU benchmark's scenarios: each job's dataset, the late and slow jobs, the batch sizes."""


OVERLAP_PARTS = 5  # overlap scenario: a shared core of S/5 ids plus a private S/5 per job
STALL_GRACE_S = 15  # TensorSocket: how long after the time cap a job blocked in its loader may take

# name: (description, dataset of each job, late jobs, slow jobs, each job's batch as a fraction
# of --batch-size (empty: all of it))
SCENARIOS = {
    "n1": ("1 job", ["all"], (), (), ()),
    "n2": ("2 jobs, same dataset", ["all"] * 2, (), (), ()),
    "n4": ("4 jobs, same dataset", ["all"] * 4, (), (), ()),
    "overlap": ("4 jobs, pairwise 50% overlap", [f"ov{i}" for i in range(4)], (), (), ()),
    "late": ("4 jobs, job 3 starts at 30%", ["all"] * 4, (3,), (), ()),
    "slow": ("2 jobs, job 1 at half speed", ["all"] * 2, (), (1,), ()),
    "batches": ("2 jobs, batch 64 and 256 (a quarter and all of --batch-size)", ["all"] * 2,
                (), (), (0.25, 1.0)),
}


def job_batches(name, batch_size):
    """Each job's batch size in scenario `name` (64 and 256 in "batches" at --batch-size 256)."""
    keys, parts = SCENARIOS[name][1], SCENARIOS[name][4]
    return tuple(max(1, int(batch_size * f)) for f in parts) if parts else (batch_size,) * len(keys)
