#!/bin/sh
# The engine code of each commit the tiny-model bisect runs (tiny_regression_bisect.toml), in .clean/<commit>/
# (git-ignored through .git/info/exclude): fast/, spec/, twinfer/ and reports/bench/. The shipped model's weights
# are left out: each tree links to the working tree's twinfer/models/stdlib-tiny (unchanged since ca03d96), a link
# the plan's first step makes again on the device (`link_models`).
# About 1.5 MB a tree, so six fit beside the working tree in the 64 MiB a device call carries.
set -e
rm -rf .clean
for commit in ca03d96 fd64c01 14bead8 6fad314 a0e8546; do
    mkdir -p ".clean/$commit"
    git archive "$commit" fast spec twinfer reports/__init__.py reports/bench | tar -x -C ".clean/$commit" --exclude='twinfer/models/stdlib-tiny'
    ln -sfn "$(pwd)/twinfer/models/stdlib-tiny" ".clean/$commit/twinfer/models/stdlib-tiny"
done
du -shL .clean/*/twinfer/models/stdlib-tiny | head -1
du -sh .clean
