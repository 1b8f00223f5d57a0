# Sourced by the benches whose tables in docs/measurements.md were measured on configs/demo.toml before session 48:
# the data order and outer step of that config, pinned, since the demo moved to shuffled rows, η 0.7, μ 0.5
# (docs/measurements.md "Demo calibration").
# shellcheck shell=bash disable=SC2034
demo_before_48=(--set data.order=contiguous --set diloco.outer_lr=1.0 --set diloco.outer_momentum=0)
