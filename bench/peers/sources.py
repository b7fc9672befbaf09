"""What a job of each configuration of the peers benchmark iterates: carpool.Loader, a
DataLoader over ImageFolder, a DALI CPU pipeline, a TensorSocket consumer or webdataset's loader."""

from bench.common import CROP, IndexedFolder, tensorsocket_compat, ts_ports
from bench.peers.scenarios import MEAN, STD, TRANSFORM, WDS_SHARD_SHUFFLE, WDS_SHUFFLE
from bench.torchvision_jobs import imagenet_train_transform


class CarpoolSource:
    def __init__(self, spec):
        import carpool
        self.carpool, self.spec = carpool, spec
        self.index = spec["catalog_to_index"]  # catalog id -> ImageFolder index

    def start(self):  # the job joins the server here, after the clock starts
        s = self.spec
        self.loader = self.carpool.Loader(s["dataset"], batch_size=s["batch"], epochs=s["epochs"],
                                          transform=TRANSFORM, socket=s["socket"],
                                          seed=s["job"] + 1)

    def epoch(self):
        for images, _ in self.loader:
            yield images, [self.index[i] for i in self.loader.ids.tolist()]

    def close(self):
        self.loader.close()


def make_dataloader(spec, workers, batch):
    import warnings
    import torch
    from torch.utils.data import DataLoader
    from torchvision import transforms
    torch.manual_seed(spec["job"] + 1)
    # W workers on fewer cores is the point of "the same W for every configuration".
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    data = IndexedFolder(spec, imagenet_train_transform(transforms, CROP))
    # fork, Linux's default: this process was spawned, and its children would be too.
    return DataLoader(data, batch_size=batch, shuffle=True, num_workers=workers,
                      multiprocessing_context="fork")


class DataLoaderSource:
    def __init__(self, spec):
        self.loader = make_dataloader(spec, spec["workers"], spec["batch"])

    def start(self):
        pass  # the workers fork at the first iter(), after the clock starts

    def epoch(self):
        for images, _, index in self.loader:
            yield images, index.tolist()

    def close(self):
        pass


class DaliSource:
    def __init__(self, spec):
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def
        self.spec = spec
        files = [spec["paths"][i] for i in spec["indices"]]

        @pipeline_def(batch_size=spec["batch"], num_threads=spec["workers"], device_id=None,
                      seed=spec["job"] + 1)
        def pipe():
            # The labels carry the ImageFolder index: DALI exposes no sample id otherwise.
            jpegs, index = fn.readers.file(files=files, labels=spec["indices"], name="Reader",
                                           random_shuffle=True, pad_last_batch=True)
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=256)
            images = fn.crop(images, crop=(256, 256))
            images = fn.crop_mirror_normalize(
                images, crop=(CROP, CROP), crop_pos_x=fn.random.uniform(range=(0, 1)),
                crop_pos_y=fn.random.uniform(range=(0, 1)), mirror=fn.random.coin_flip(),
                dtype=types.FLOAT, output_layout="CHW", mean=[255 * m for m in MEAN],
                std=[255 * s for s in STD])
            return images, index
        self.pipe = pipe()
        self.pipe.build()

    def start(self):
        # DALI 2.4's PyTorch plugin (DALIGenericIterator) needs torch 2 (`with torch.device`);
        # apt's torch is 1.13, so the job runs the pipeline itself as the plugin would with
        # LastBatchPolicy.PARTIAL: ceil(size / batch) runs per epoch, the padding cut off.
        import torch
        self.torch = torch
        self.size = self.pipe.epoch_size("Reader")

    def epoch(self):
        batch = self.spec["batch"]
        for k in range(-(-self.size // batch)):
            images, index = self.pipe.run()
            n = min(batch, self.size - k * batch)
            yield (self.torch.from_numpy(images.as_array()[:n]),
                   index.as_array().reshape(-1)[:n].tolist())

    def close(self):
        pass


class TensorSocketSource:
    def __init__(self, spec):
        self.ts, self.spec = tensorsocket_compat(), spec

    def start(self):  # blocks until the producer announces its loader
        self.consumer = self.ts.TensorConsumer(batch_size=self.spec["batch"],
                                               **ts_ports(self.spec["ts_port"]))

    def epoch(self):
        for images, _, index in self.consumer:
            yield images, index.tolist()

    def close(self):
        pass


class WebDatasetSource(DataLoaderSource):
    """webdataset's loader as its documentation runs it: shards shuffled (per DataLoader worker,
    which reads every W-th shard), samples through a shuffle buffer, decoded with PIL, the same
    torchvision pipeline; the sample key is the ImageFolder index. Iterated as DataLoaderSource."""

    def __init__(self, spec):  # noqa: super().__init__ would build the per-job ImageFolder loader
        import warnings
        import torch
        import webdataset as wds
        from torch.utils.data import DataLoader
        from torchvision import transforms
        torch.manual_seed(spec["job"] + 1)
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        tf = imagenet_train_transform(transforms, CROP)
        data = (wds.WebDataset(spec["wds_urls"], shardshuffle=WDS_SHARD_SHUFFLE)
                .shuffle(WDS_SHUFFLE).decode("pil")
                .map(lambda s: (tf(s["jpg"]), s["cls"], int(s["__key__"]))))
        self.loader = DataLoader(data, batch_size=spec["batch"], num_workers=spec["workers"],
                                 multiprocessing_context="fork")


SOURCES = {"carpool": CarpoolSource, "dataloader": DataLoaderSource, "dali": DaliSource,
           "tensorsocket": TensorSocketSource, "webdataset": WebDatasetSource}
