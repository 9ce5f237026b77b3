#!/usr/bin/env bash
# Best-of-N with SmolLM2's own judgement of its rollouts (self:p_true, self:certainty) over three committed
# pools, scored on CPU (one thread) into copies here; then the reports with their best-of-N sections.
#   demo_level0: demo_level0_signals (greedy, L pool L=1..10 at T=0, T pool T=0.1..1.0 at L=0), first 20 of 100 problems
#   gsm8k_pools: gsm8k_pools (the leaderboard's L pool, the T pool, greedy), first 8 of 100 problems and 6 chosen
#   demo_lxt   : the 11x11 L x T grid on the demo (demo_lxt), first 3 of 6 problems
# --limit keeps the scoring within ~20 minutes of one CPU thread; rerunning resumes from the score stores.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/smollm2-135m-instruct
HERE=$R/verify_self
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
SELF="--verifier self:p_true --verifier self:certainty --device cpu"
eglr-verify $R/demo_level0_signals/greedy $R/demo_level0_signals/lpool $R/demo_level0_signals/tpool $SELF \
  --limit 20 --out $HERE/demo_level0
eglr-verify $R/leaderboard/gsm8k/eglr_sc $R/gsm8k_pools/tpool $R/gsm8k_pools/greedy $SELF --limit 8 \
  --out $HERE/gsm8k_pools
# no rollout is right on the first 8: add the 6 problems with the most right rollouts of the 100
# (chosen by their correctness, so these accuracies are not the pool's; the comparisons between selections are)
eglr-verify $R/leaderboard/gsm8k/eglr_sc $R/gsm8k_pools/tpool $R/gsm8k_pools/greedy $SELF \
  --doc_ids 19,27,37,44,92,96 --out $HERE/gsm8k_pools
eglr-verify $R/demo_lxt/run $SELF --limit 3 --out $HERE/demo_lxt
eglr-report $HERE/demo_level0/greedy $HERE/demo_level0/lpool $HERE/demo_level0/tpool --sections runs,bestofn \
  --out $HERE/demo_level0/report
eglr-report $HERE/gsm8k_pools/eglr_sc $HERE/gsm8k_pools/tpool $HERE/gsm8k_pools/greedy --sections runs,bestofn \
  --out $HERE/gsm8k_pools/report
eglr-report $HERE/demo_lxt/run --sections runs,bestofn --out $HERE/demo_lxt/report
