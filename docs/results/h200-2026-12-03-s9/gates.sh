#!/usr/bin/env bash
# Runs every GPU gate binary carried in .gpu/ (xz) on the H200, sequentially;
# logs under /tmp/gout (copied to $OUT by the calling command).
set -uo pipefail
mkdir -p .carry/bin /tmp/gout
for f in .gpu/*.xz; do xz -dc "$f" > ".carry/bin/$(basename "$f" .xz)"; done
chmod +x .carry/bin/*
# prefix_cache_chat finds the demo checkpoint where it was built.
mkdir -p /work/main/crates && ln -sfn "$PWD/crates/server" /work/main/crates/server
export OUT=/tmp/gout
GDN_COMMIT=$(cat .gpu/COMMIT) bash checks/gpu/device_run.sh tests,dsl,skinny,qwen35 > /tmp/gout/device_run.out 2>&1
echo "device_run rc=$?" >> /tmp/gout/device_run.out
cublas=$(find /usr/local/cuda*/ /usr/lib /usr/local/lib $(python3 -c 'import site; print(*site.getsitepackages())') -name 'libcublas.so.13*' 2>/dev/null | head -1)
{ echo "### GDN_REQUIRE_GPU=1 prefix_cache_chat"; LD_LIBRARY_PATH=$(dirname "$cublas") GDN_REQUIRE_GPU=1 .carry/bin/prefix_cache_chat --test-threads=1 --nocapture; echo "rc=$?"; } > /tmp/gout/prefix_cache_chat.log 2>&1
touch /tmp/gout/DONE
