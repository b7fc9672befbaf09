"""Issue 23: does GPU decode change what a model learns? ResNet-18 (torchvision, 10 classes)
trained for a few epochs on a labelled JPEG set, on one GPU, with the server decoding on the CPU
(--gpu-decode off) and on the GPU (--gpu-decode on), the same seeds; prints each run's test
accuracy and the mean and spread per way.

The set is Fashion-MNIST made into colour JPEGs (`make-set`, on any machine with PIL): each
28x28 image upscaled to 64x64 and tinted with a random colour (seeded per image, independent of
its class), so that the chroma that GPU and CPU decoders upsample differently carries edges;
saved at quality 90, 4:2:0, as DIR/train/<class>/NNNNN.jpg and DIR/test/<class>/NNNNN.jpg.
Both ways prepare with resize=56,crop=48, so the resize differs too (the exact box filter
against OpenCV's INTER_AREA) and the test set is decoded the way its model was trained.

  python3 -m bench.decode_accuracy make-set DIR [--train 12000 --test 3000]
  python3 -m bench.decode_accuracy run DIR [--seeds 0 1 2] [--epochs 4] [--json F]
The run needs carpool with CUDA and nvJPEG (the bundle) and a GPU."""

import argparse
import gzip
import json
import pathlib
import statistics
import tempfile
import time

PREPARE = "resize=56,crop=48"
TRAIN_TRANSFORM = "random_crop(44)|flip|normalize(imagenet)|float32|nchw"
TEST_TRANSFORM = "center_crop(44)|normalize(imagenet)|float32|nchw"


def read_idx(path):
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def make_set(out, fmnist, train, test):
    import numpy as np
    from PIL import Image
    for split, idx, count in (("train", "train", train), ("test", "t10k", test)):
        images = read_idx(pathlib.Path(fmnist) / f"{idx}-images-idx3-ubyte.gz")[:count]
        labels = read_idx(pathlib.Path(fmnist) / f"{idx}-labels-idx1-ubyte.gz")[:count]
        rng = np.random.default_rng(0 if split == "train" else 1)
        tints = rng.uniform(0.25, 1.0, size=(count, 3)).astype(np.float32)
        for i, (image, label) in enumerate(zip(images, labels)):
            gray = np.asarray(Image.fromarray(image).resize((64, 64), Image.BICUBIC), np.float32)
            rgb = np.clip(gray[:, :, None] * tints[i] + 20 * (1 - tints[i]), 0, 255)
            folder = pathlib.Path(out) / split / f"{int(label)}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rgb.astype(np.uint8), "RGB").save(
                folder / f"{i:05d}.jpg", quality=90, subsampling=2)
        print(f"{split}: {count} JPEGs in {pathlib.Path(out) / split}", flush=True)


def train_once(carpool, torch, socket, seed, epochs, batch):
    import torchvision
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=10).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    with carpool.Loader("acc-train", batch_size=batch, epochs=epochs, seed=seed,
                        transform=TRAIN_TRANSFORM, device="cuda:0", socket=socket) as loader:
        for _ in range(epochs):
            model.train()
            for images, labels in loader:
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = loss_fn(model(images), labels)
                loss.backward()
                opt.step()
    correct = total = 0
    model.eval()
    with torch.no_grad(), carpool.Loader("acc-test", batch_size=500, epochs=1, seed=0,
                                         transform=TEST_TRANSFORM, device="cuda:0",
                                         socket=socket) as test:
        for images, labels in test:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                pred = model(images).argmax(1)
            correct += int((pred == labels).sum())
            total += int(labels.numel())
    return correct / total, total


def run(args):
    import carpool
    import torch
    results = {}
    for way in ("cpu", "gpu"):
        with tempfile.TemporaryDirectory(prefix="carpool-acc-") as state:
            for split in ("train", "test"):
                carpool.cli("dataset", "add", f"acc-{split}", "--dir",
                            str(pathlib.Path(args.dir) / split), "--prepare", PREPARE, "--quiet",
                            state_dir=state)
            with carpool.Server(state, gpus="0", gpu_decode="off" if way == "cpu" else "on",
                                cache_size="1GiB", gpu_cache_size="1GiB",
                                log=str(pathlib.Path(state) / "server.log")) as srv:
                accs = []
                for seed in args.seeds:
                    t = time.monotonic()
                    acc, n = train_once(carpool, torch, srv.socket, seed, args.epochs, args.batch)
                    accs.append(acc)
                    print(f"{way} decode, seed {seed}: test accuracy {acc:.4f} on {n} images "
                          f"({time.monotonic() - t:.0f} s)", flush=True)
                g = carpool.server_stats(socket=srv.socket)["gpus"][0]
                results[way] = {"accuracy": accs, "mean": statistics.mean(accs),
                                "stdev": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                                "decoder": g.get("decoder"), "gpu_decodes": g.get("gpu_decodes")}
    for way, r in results.items():
        print(f"{way} decode ({r['decoder']}, {r['gpu_decodes']} GPU decodes): mean "
              f"{r['mean']:.4f} +- {r['stdev']:.4f} over seeds {args.seeds}")
    diff = results["gpu"]["mean"] - results["cpu"]["mean"]
    print(f"GPU - CPU decode: {diff:+.4f} (pooled spread "
          f"{(results['gpu']['stdev'] + results['cpu']['stdev']) / 2:.4f})")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


def main():
    ap = argparse.ArgumentParser(prog="python -m bench.decode_accuracy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-set")
    m.add_argument("dir")
    m.add_argument("--fmnist", default="/usr/share/datasets/fashion-mnist")
    m.add_argument("--train", type=int, default=12000)
    m.add_argument("--test", type=int, default=3000)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--epochs", type=int, default=4)
    r.add_argument("--batch", type=int, default=128)
    r.add_argument("--json")
    args = ap.parse_args()
    if args.cmd == "make-set":
        make_set(args.dir, args.fmnist, args.train, args.test)
    else:
        run(args)


if __name__ == "__main__":
    main()
