#!/usr/bin/env bash
# The engine- and server-facing GPU gates at the final commit.
set -uo pipefail
mkdir -p /tmp/g2 /tmp/gout2
for f in .gpu2/*.xz; do xz -dc "$f" > "/tmp/g2/$(basename "$f" .xz)"; done
chmod +x /tmp/g2/*
mkdir -p /work/main/crates && ln -sfn "$PWD/crates/server" /work/main/crates/server
cublas=$(find /usr/local/cuda*/ -name 'libcublas.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$(dirname "$cublas") QWEN35_FIXTURES=$PWD/crates/qwen35/tests/fixtures GDN_REQUIRE_GPU=1
for t in gpu_engine gpu_served prefix_cache_chat; do
  { echo "### GDN_REQUIRE_GPU=1 $t"; /tmp/g2/$t --test-threads=1 --nocapture; echo "rc=$?"; } > /tmp/gout2/$t.log 2>&1
done
touch /tmp/gout2/DONE
