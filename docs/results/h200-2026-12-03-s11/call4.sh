#!/bin/bash
set -u
OUT=${OUT:-/tmp/out}; mkdir -p .carry/bin
xz -dc .gpu3/moe_bench.xz > .carry/bin/moe_bench; chmod +x .carry/bin/moe_bench
timeout 300 .carry/bin/moe_bench 2>&1 | tee $OUT/moe_bench.txt
