"""The peers benchmark's configurations, scenarios and jobs."""


TRANSFORM = "random_crop(224)|flip|normalize(imagenet)|float32|nchw"
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
CONFIGS = ["carpool", "dataloader", "dali", "tensorsocket", "webdataset"]
LATE_AT = 0.3  # the late joiner starts when the others have delivered 30% of their epoch
STALL_GRACE_S = 15  # after the time cap, how long a job may take to notice the stop
# webdataset: its shard shuffle buffer (shards, per DataLoader worker) and sample shuffle buffer
# (samples, per worker; .shuffle(1000) as in its documentation).
WDS_SHARD_SHUFFLE = 100
WDS_SHUFFLE = 1000
MIX_WINDOW = 64  # deliveries per window of the shard-mix check


class Job:
    """One job of a scenario: its dataset, batch size, step time per 64 samples (x --step-ms)
    and whether it joins late."""

    def __init__(self, dataset="all", batch=64, speed=1.0, late=False):
        self.dataset, self.batch, self.speed, self.late = dataset, batch, speed, late


# name: (description, jobs). "speeds" scales by --speeds-step-ms instead of --step-ms.
SCENARIOS = {
    "n1": ("1 job", [Job()]),
    "n4": ("4 jobs, same dataset, in lockstep", [Job() for _ in range(4)]),
    "overlap": ("2 jobs, datasets overlapping 50%", [Job("ov0"), Job("ov1")]),
    "late": ("2 jobs, job 1 joins at 30% of job 0's epoch", [Job(), Job(late=True)]),
    "speeds": ("2 jobs, job 1 trains at half speed", [Job(), Job(speed=2.0)]),
    "batches": ("2 jobs, batch 64 and batch 256", [Job(), Job(batch=256)]),
}
