#!/bin/bash
# On a GPU node: installs the platform wheel (scripts/wheel.sh) alone into a venv over the node's
# own torch, with no CARPOOL_* variables set, and runs a 2-epoch cuda:0 job on 2,000 generated
# JPEGs, and a CPU job. Usage (carry the folder to the node): scripts/wheel_gpu_check.sh DIR, where
# DIR holds carpool-*.whl and, optionally, deps/numpy-*.whl (installed where numpy is missing).
set -euo pipefail
DIR=${1:?usage: scripts/wheel_gpu_check.sh DIR (holding carpool-*.whl)}
W=$(ls "$DIR"/carpool-*.whl)
unset $(env | grep -o '^CARPOOL_[A-Z_]*' || true)
# A PYTHONPATH (a bundle's carpool-env sets one) would import another carpool than the wheel's.
unset PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
# A venv over the node's own torch environment (/opt/torch/.venv): its site-packages by a .pth.
python3 -m venv /tmp/v
python3 -c "import site; print(site.getsitepackages()[0])" > /tmp/v/lib/python3.12/site-packages/node-torch.pth
/tmp/v/bin/pip install --no-index --no-deps "$W" 2>&1 | tail -1
# This node's torch comes without numpy. The Loader works with torch alone; numpy's own wheel is
# installed only where DIR carries one (deps/numpy-*.whl), to check the numpy path there too.
if ! /tmp/v/bin/python -c "import numpy" 2>/dev/null && ls "$DIR"/deps/numpy-*.whl >/dev/null 2>&1; then
  /tmp/v/bin/pip install --no-index --no-deps "$DIR"/deps/numpy-*.whl 2>&1 | tail -1
fi
/tmp/v/bin/python -c "import numpy; print('numpy', numpy.__version__)" 2>/dev/null || echo "no numpy: the Loader runs on torch alone"
export PATH=/tmp/v/bin:$PATH
which carpool; carpool --version || true
env | grep ^CARPOOL_ || echo "no CARPOOL_ variables"
cd /tmp
carpool dataset gen /tmp/img --count 2000 --size 500x375 --classes 10 -q
carpool dataset add img --dir /tmp/img --prepare resize=256,crop=224 --state-dir /tmp/st -q
carpool server --state-dir /tmp/st --gpus all --cache-size 256MiB > /tmp/server.log 2>&1 &
S=$!
for i in $(seq 100); do [ -S /tmp/st/carpool.sock ] && break; sleep 0.1; done
/tmp/v/bin/python - <<'PY'
import time, torch, carpool
print("carpool from", carpool.__file__)
assert carpool.__file__.startswith("/tmp/v/"), f"not the wheel's package: {carpool.__file__}"
with carpool.Loader("img", batch_size=128, epochs=2, device="cuda:0",
                    transform="flip|normalize(imagenet)|float16|nchw",
                    state_dir="/tmp/st") as loader:
    n = 0; t0 = time.time(); seen = set()
    for epoch in range(loader.epochs):
        for images, labels in loader:
            assert images.is_cuda and images.device.index == 0, images.device
            n += images.shape[0]
            seen.update(loader.ids.tolist())
    dt = time.time() - t0
    print(f"cuda:0 job: {n} samples in {dt:.2f} s = {n/dt:.0f} img/s, images {tuple(images.shape)} {images.dtype} on {images.device}, distinct ids {len(seen)}")
    print("stats:", {k: v for k, v in carpool.server_stats(state_dir="/tmp/st").items() if k in ("preparations", "deliveries", "sharing_ratio", "jobs")})
# With GPU decode, the job (alone on its GPU) decoded its own JPEGs with the wheel's
# libcarpool_job_decode.so, found beside libcarpool.so (docs/gpu.md "Decoding in the jobs' processes").
g = carpool.server_stats(state_dir="/tmp/st")["gpus"][0]
print(f"GPU decode: {g.get('decoder')}; decoded in the job {g.get('job_decodes')}, by the server "
      f"{g.get('gpu_decodes')}, job decode failures {g.get('job_decode_failures')}")
if g.get("decoder") in ("hardware", "gpu-hybrid"):
    assert g["job_decodes"] > 0 and g["job_decode_failures"] == 0, g
with carpool.Loader("img", batch_size=64, transform="center_crop(64)|float16|nchw",
                    state_dir="/tmp/st") as loader:
    seen = []
    for images, labels in loader:
        assert images.device.type == "cpu" and images.data_ptr() == loader._images_address
        seen += loader.ids.tolist()
    print(f"cpu job: {len(seen)} samples, {len(set(seen))} distinct, images {tuple(images.shape)} "
          f"{images.dtype}, labels {labels.dtype}, ids {type(loader.ids).__module__}")
import sys
print("numpy imported:", "numpy" in sys.modules)
PY
kill $S; wait $S || true
tail -3 /tmp/server.log
