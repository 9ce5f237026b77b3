#!/usr/bin/env bash
# Selection by signals on the committed level-0 L×T grid (../demo_level0_lxt/run, 100 problems, 121 cells):
# the report's "selection" section only, read from the saved run (no model loaded). That run records no
# per-rollout signals (made before the engine recorded them), so the only signal is the one derived from the
# answers: l_agreement (share of the problem's rollouts at the same T and another L in the same cluster).
set -euo pipefail
cd "$(dirname "$0")/../../.."
eglr-report results/smollm2-135m-instruct/demo_level0_lxt/run --sections runs,selection \
  --out results/smollm2-135m-instruct/demo_level0_lxt_selection/report
