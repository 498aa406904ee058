#!/bin/bash
# One background job on the lent GPU (untracked driver; deleted after the lease).
set -u
O=/tmp/kg-out; mkdir -p $O
cd /tmp/kg-repo
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 MOSAIC_GPU_DUMP_PTXAS=1
unset JAX_COMPILATION_CACHE_DIR
{ nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
  echo "tree c8a318b"; date -u; } > $O/device.txt 2>&1
run() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout -k 10 $limit "$@" > $O/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s $(date -u +%H:%M:%S)" >> $O/steps.txt; }
V="python3 -m kernels.tools.variants --shapes grid --variants pipelined --dtypes bfloat16 float16"
run d128-a 330 $V --head-dims 128 --out $O/d128-a.json
run d64-d256 450 $V --head-dims 64 256 --out $O/d64-d256.json
run d128-b 330 $V --head-dims 128 --out $O/d128-b.json
echo done >> $O/steps.txt
