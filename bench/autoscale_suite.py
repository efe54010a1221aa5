"""The autoscaling suite: tokenplane's scaler against HPA (busy fraction), HPA (KV use) and the
cheapest static fleet that meets the SLO, on the shared traces at two speeds each and on generated
bursty traffic at two coefficients of variation.

    nice -n 10 .venv/bin/python bench/autoscale_suite.py --json            # the full suite, ~2 min
    nice -n 10 .venv/bin/python bench/autoscale_suite.py --minutes 10      # shorter workloads
    nice -n 10 .venv/bin/python bench/autoscale_suite.py --json --without slo_defer   # an ablation
    nice -n 10 .venv/bin/python bench/autoscale_suite.py --json --start 1  # every scaler opens at 1

Prints ``{"workloads": {NAME: {"tokenplane": {...}, "hpa": {...}, "hpa-kv": {...},
"static-best": {...}}}}``, each with ``gpu_hours`` and ``slo_attainment`` (the share of requests
whose TTFT met the SLO, failed ones counted as misses), plus ``skipped`` (workloads whose trace is
missing, with the reason) and ``verdict`` per workload.

One configuration for every workload (nothing here is set per workload but the workload itself,
its fleet's model and its SLO): every pool is given the same deliberately rough capacity prior
(``PRIOR_RPS``), which the scaler must correct online, and the tokenplane scaler the same settings
everywhere (``SCALERS``: a 30-minute burst memory, utilisation 1.0 of the learned capacity, and the
evidence rules of :mod:`tokenplane.core.autoscale.policy`, ``slo_budget`` and ``slo_defer``, which
are off by default).
``static-best`` is found by bisection over fleet sizes (the smallest static fleet whose TTFT
attainment is at least the target; attainment rises with n: checked by scanning mooncake-x4,
n = 1..10: 0.1, 0.4, 0.7, 1.3, 2.9, 85.8, 95.7, 97.3, 97.9, 98.3 %); every autoscaler then starts
serving with that many instances (the fleet a static planner would open with), so that the runs
differ in how they follow the load, not in how they survive a cold start at t = 0.

GPU-hours count every instance that holds a GPU: serving, warming (cold start), warm (the warm pool),
activating and draining (:mod:`tokenplane.sim.lifecycle`); a static fleet is charged until its last
request ends.

Result (full length, ``--json --cache FILE``; tokenplane GPU-hours over static-best's / tokenplane
TTFT attainment %), with the SLO judged over the run as one period (``slo_period_s``, below) and
``slo_defer`` on (:func:`tokenplane.core.autoscale.budget.deferral`):

    workload      seeds 1, 2, 3, 7, 9      seed 4        seed 5        seed 6        seed 8
    azure-x4      1.000 / 100.0 each       1.000 / 100   1.000 / 100   1.000 / 100   1.000 / 100
    azure-x8      1.000 / 99.6 each        1.000 / 99.6  1.000 / 99.6  1.000 / 99.6  1.000 / 99.6
    servegen-x8   1.000 / 97.6-98.5        1.000 / 98.2  1.000 / 99.1  1.008 / 95.9  1.000 / 100
    servegen-x16  1.000 / 98.5-99.7        0.993 / 99.2  0.997 / 99.4  1.004 / 97.2  1.006 / 95.7
    mooncake-x2   1.000 / 95.6 each        1.000 / 95.6  1.000 / 95.6  1.000 / 95.6  1.000 / 95.6
    mooncake-x4   1.000 / 95.7 each        1.000 / 95.7  1.000 / 95.7  1.000 / 95.7  1.000 / 95.7
    bursty-cv4    1.000 / 100.0 (9: 1.002) 1.000 / 100   1.000 / 100   1.000 / 100   1.000 / 100
    bursty-cv10   1.000 / 100.0 (9: 1.002) 1.000 / 100   1.000 / 100   1.000 / 100   1.000 / 100

The SLO is met in 72 of 72 cells and GPU-hours are at or under static-best's in 67 (every cell of
seeds 1, 2, 3, 4, 5 and 7). Over: servegen-x8 seed 6 (1.008), servegen-x16 seeds 6 and 8 (1.004,
1.006): one or two 70B cold starts bought in a KV episode whose windows fell to 0.46-0.56 and
cancelled while warming when it ended (static-best's attainment is the scaler's to the digit:
they bought nothing); bursty seed 9 (1.002 each): a cold start at a burst's onset, as before.
Before ``slo_defer`` (the same code with ``--without slo_defer``) 36 of the 72 cells were over,
by up to 1.069 (mooncake-x4 1.049 on every seed, mooncake-x2 1.016, servegen-x8 1.019-1.069,
servegen-x16 1.004-1.027). Held out (never run while building the rule): seeds 10-15 of the suite
(Mooncake's replay does not depend on the seed): SLO met in all 40 cells, over in 3 (servegen-x16
seed 12 1.003, bursty-cv4 and -cv10 seed 15 1.002 each), against 14 over and 2
misses without the rule (servegen-x16 seed 13 92.3 %, bursty-cv4 seed 14 92.3 % at 1.221). With
the rule, what is left over static-best is a 70B cold start bought in an episode that ended within
it; what the rule buys is the time to see that (mooncake-x4: the first two minutes at 7 windows of
0.90-0.94, with the run's bank at -30 requests at most, against 0.05 x 14.5 x 800 = 580 that an
instance more could earn back over the rest, so the queue term waits and 7 repays it by itself).

How ``slo_defer`` decides (each a pure function of the bank, the size records and the window now;
no constant but the SLO target): hold at n while staying at n ends the period on target (the
deficit now over a cold start at the rate now and over the rest at the period's mean rate), or the
latest time one size more could still earn the shortfall back is more than a decision away (a size
above measured at this load earns its mean over the target, else ``1 - target``); one size down
only where the bank covers that size's worst window near the load now for a cold start and the
size now earns the rest back; a size never measured at this load, only where the bank covers a cold
start of every request missed; a period that no size measured or assumed can bring back gets no
opinion. Two things it needed beyond the first version: KV pressure capped like the estimated terms
(without it servegen stayed 1.004-1.069 over on 30 cells: KV use at 0.95 asked for 13 of 10) and
one size up at a time on KV when not holding (servegen-x16 seed 8 bought four 70B instances for an
episode, cancelled: 1.019 -> 1.006); and an unmeasured size the capacity estimate calls short is
not held on its window alone, which lags the queue it builds (from a one-instance start, below).

Untuned variants (``--variants``, seeds 1 / 2): SLO met on 19 of 19 both seeds (before: 17 of 19:
mooncake-x3 94.2 %, x3.5 94.95 %); azure 1.000 at all three speeds, servegen-x6 1.000 / 1.000,
servegen-x12 1.000 / 0.993, servegen-x20 1.006 / 1.002, Mooncake x1.5, 1.75, 2.25, 3, 4.5 1.000,
x2.5 0.995, x5 0.998, x2.75 1.008, x3.25 1.010, x3.5 1.018, x6 1.022, bursty-cv6-r3 1.000 / 1.000,
bursty-cv2-r6 1.004 / 1.000. Further held-out shapes (seeds 3 and 4; Azure at 3x and 10x, ServeGen
at 10x and 14x and at 10x with other clients, Mooncake at 2.1x, 2.6x, 3.1x, 3.75x, 4.25x, 5.5x,
bursty CV 8 peak 5, CV 3 peak 2, CV 12 peak 8): SLO met in all 22 cells, at 0.985-1.028 (over on
mooncake-x2.6 1.007, mooncake-x5.5 1.028, bursty-cv3-r2 seed 3 1.003). Those sweeps were scripted
outside the repository from this file's ``workloads`` and ``variants``.

From an undersized start (``--start 1 --seed 1``: every scaler opens with one instance, so every
run starts short; tokenplane GPU-hours / attainment %, with and ``--without slo_defer``):
azure-x4 0.47 / 93.8 both; azure-x8 0.58 / 81.0 both; servegen-x8 7.62 / 95.1 against 9.98 /
95.1; servegen-x16 14.31 / 88.1 against 14.62 / 88.1; mooncake-x2 4.41 / 93.9 against 3.90 /
93.7 (the one cell where the rule costs more: it will not shrink into sizes it has not measured
until the bank pays for a cold start of misses); mooncake-x4 4.94 / 89.3 both; bursty-cv4 10.89 /
82.0 both; bursty-cv10 10.46 / 91.7 against 10.00 / 91.7. Before the capacity-estimate condition
the rule held a one-instance Azure pool on its lagging window for a minute (azure-x4 87.4 %).

The table before ``slo_defer`` (seeds 1 / 2 / 3 / 9; kept for the history below):

    workload      seed 1          seed 2          seed 3          seed 9          static-best n
    azure-x4      1.000 / 100.0   1.000 / 100.0   1.000 / 100.0   1.000 / 100.0   2 / 2 / 2 / 2
    azure-x8      1.000 /  99.6   1.000 /  99.6   1.000 /  99.6   1.000 /  99.6   3 / 3 / 3 / 3
    servegen-x8   1.062 /  99.5   1.068 /  98.3   1.024 /  97.7   1.056 /  98.9   5 / 5 / 5 / 5
    servegen-x16  1.016 /  99.2   1.021 /  98.5   1.006 /  99.6   1.010 /  99.7   10 / 10 / 10 / 10
    mooncake-x2   1.016 /  95.6   1.016 /  95.6   1.016 /  95.6   1.016 /  95.6   4 / 4 / 4 / 4
    mooncake-x4   1.049 /  95.7   1.049 /  95.7   1.049 /  95.7   1.049 /  95.7   7 / 7 / 7 / 7
    bursty-cv4    1.000 / 100.0   1.000 / 100.0   1.000 / 100.0   1.002 / 100.0   4 / 4 / 4 / 4
    bursty-cv10   1.000 / 100.0   1.000 / 100.0   1.000 / 100.0   1.002 / 100.0   4 / 4 / 4 / 4

``slo_period_s`` (:mod:`tokenplane.core.autoscale.budget`): the suite judges each run's attainment
over the whole run, so it tells the scaler so (the period is the run, to its last arrival; the
HPAs have no such input). ``slo_budget``'s bank may then also count what the size above, once
measured at the load now, will earn back over the rest of the period (its mean attainment over
the target, at the rate now), if the pool runs one short for a cold start and returns to it.
Against the code before (``slo_budget`` with the bank alone): mooncake-x4 1.082 -> 1.049 on every
seed (96.2 -> 95.7 %: the eighth, bought at t = 60 s on a 22-request backlog with windows at
0.91-0.94, goes back at t = 422 s instead of 570 s), servegen-x8 seed 2 1.072 -> 1.068, seed 9
1.061 -> 1.056; held out (seeds 4-8, never looked at while building): servegen-x8 seed 6 1.176 ->
1.069 (a sixth 70B instance bought in a KV episode that became a real miss, windows at 0.31-0.76,
held at attainment 1.0 until t = 2580 s, now until 1110 s: what 6 earns over the target over the
remaining half hour repays the miss), mooncake-x4 1.082 -> 1.049 on each; every other cell of the
72 (8 workloads x 9 seeds) identical to the digit, GPU-hours and attainment. Held-out GPU-hours
over static-best (seeds 4 / 5 / 6 / 7 / 8), SLO met in all 40 cells, no HPA variant beating
tokenplane on both axes: azure-x4 and azure-x8 1.000 on each, servegen-x8 0.957 / 1.019 / 1.069 /
1.022 / 1.000, servegen-x16 1.008 / 1.004 / 1.027 / 1.013 / 1.027, mooncake-x2 1.016 on each,
mooncake-x4 1.049 on each, bursty-cv4 and bursty-cv10 1.000 on each. Taking the size above's worst
window at the load now instead of its mean: every cell of seed 1 identical (checked on seed 1
only). With a 300 s period (the bank starting again every five minutes, less of the period left to
earn in; seed 1): mooncake-x4 back at 1.082 / 96.2 %, servegen-x8, servegen-x16 and mooncake-x2 as
without a period.

Untuned variants (``--variants --json --seed S --cache F``: Azure at 2x, 6x and 12x, ServeGen at
6x, 12x and 20x, Mooncake at 1.5x, 1.75x, 2.25x, 2.5x, 2.75x, 3x, 3.25x, 3.5x, 4.5x, 5x and 6x,
bursty at CV 6 / peak 3 / 300 s bursts and at CV 2 / peak 6 / 60 s bursts; none of them ever run
while building any rule), seed 1 / seed 2, GPU-hours over static-best / attainment %: azure 1.000 /
100.0 on all three speeds both seeds; servegen-x6 1.000 / 99.6, 1.012 / 99.3; servegen-x12 1.000 /
99.9, 0.924 / 99.6; servegen-x20 1.035 / 96.1, 1.027 / 97.4; Mooncake (the replay does not depend
on the seed) x1.5 1.006 / 97.2, x1.75 1.001 / 95.7, x2.25 1.000 / 97.2, x2.5 1.031 / 96.2, x2.75
1.015 / 95.2, x3.25 1.037 / 96.4, x4.5 1.012 / 96.2, x5 1.003 / 96.8, x6 1.025 / 95.7;
bursty-cv6-r3 1.000 / 100.0; bursty-cv2-r6 1.004 / 100.0, 1.000 / 100.0; no HPA variant
beating tokenplane on both axes anywhere. **mooncake-x3 misses the SLO: 94.2 % at 0.876** (static 6
97.1 %, static 5 92.7 %); it missed before ``slo_period_s`` too (94.2 % at 0.890; the period rule
moved only this cell and mooncake-x2.5, 1.035 -> 1.031, of the 24). The scaler shrinks 6 -> 5 on
the capacity estimate at t = 300 s with the run's bank near zero, and at 5 the 60 s windows
alternate around the target (0.75-1.0), so the SLO step, which buys a cold start only when two
decisions in a row ask for it, rarely does. Tried and not kept: while the run is behind (bank
negative) and the pool's mean window at the load now is under the target, ask one more as a
measured term, and do not shrink on the estimate into a size whose mean window at the load now is
under the target unless the bank affords it: mooncake-x3 94.8 % (still short) at 0.939, and
mooncake-x2 1.016 -> 1.047 on seed 1. Also tried and not kept, for the SLO step that never buys a
cold start: (a) a scale-up held back by ``window_from_cold_start`` starts no cooldown and no SLO
step interval, so the next failing decision asks again and buys: mooncake-x3 met (95.2 % at
0.971), but on the suite mooncake-x2 1.016 -> 1.054 and mooncake-x4 1.049 -> 1.059 on every seed,
servegen-x8 up to +0.040 (seed 5), attainment unchanged but for one cell (servegen-x8 seed 4 96.5
-> 97.7 %): the instances land after the failing windows have passed; (b) a lasting ask for one
more once the windows have failed at every decision for a cold start: mooncake-x3 unchanged (its
windows at 5 alternate around the target, so no run of failures lasts a cold start; one good
window cancels the start), mooncake-x2 1.024, mooncake-x4 1.059. A pool a little short (92.7 %
at 5 over the run, 60 s windows between 0.75 and 1.0) shows in the run's bank, not in a window.
**mooncake-x3.5 misses too: 94.95 % at 1.059** (static 6 95.2 %): it holds 7 from t = 113 s to
330 s, bought on the estimate in the first minutes, and 6 after, and still serves 31 requests fewer
in time than the static six.

Tried and not kept, for those two misses (Mooncake at 13 speeds, 1.5x-6x, and suite seeds 1-9; the
period projection): while the SLO is judged over a period, ask one more as a lasting measured term
when the bank plus the size's mean settled attainment under the target, over the rest of the
period at the rate now, is negative (the period ends behind if the pool stays), and the size above
was measured at the load now with a mean over the target. It meets the SLO at all 13 Mooncake
speeds (x3 95.3 % at 0.927, x3.5 95.6 % at 1.119), but costs x1.75 1.050, x2.5 1.086, x3.25 1.082,
mooncake-x4 1.075 (suite), and servegen-x8 1.191 on seed 2 and 1.183 on seed 6 (from 1.068 and
1.069, attainment unchanged): the size's mean over all its windows prices a load below the one it
was measured short at, the budget affords that size for a cold start while the projection asks one
more, and the pool cold-starts a 70B instance every five minutes. The same with each size's mean
kept per load band (as the worst windows are) and no shrinking into a size projected short:
servegen-x8 seed 2 1.074, but Mooncake x3 misses again (94.8 %: the pool goes back to 5 at t =
915 s with the bank at +109 requests and meets the run's last burst there), x4 1.117, x3.5 1.144.
Gating the ask on a failing window: x3.5 misses (a good window cancels the cold start while it
warms); keeping the ask while the bought instance warms: x3 misses (94.7 %). Requiring the size to
have been measured for 1-4 cold starts of requests first: misses at x3 for 1, 2 and 4, not at 3
(tuning, not kept). Pricing a never-measured smaller size by the worst window of the size now, paid
from the bank alone: x3 94.7 %, mooncake-x4 1.082. What the projection cannot see: every fixed
Mooncake pool serves 2-4 points worse in its first 4-6 minutes than after (mean window per 2
minutes, static 7 at x4: 0.941, 0.942, then 0.955-0.984; static 4 at x2: 0.934, 0.918, 0.923, then
0.94-0.985; static 5 at x3: 0.912, 0.861, then 0.93-0.97), at the same prompt-token load. A size
judged on its early windows looks short at x2 and x4 where it is not (static 4 and 7 meet the SLO)
and the same at x3 where it is. Counted by arrival (not by 60 s window) it is the first two to
four minutes, and the replay's prompts are the cause: they are its longest then (static 7 at x4,
2-minute arrival blocks: mean prompt 14.1k tokens and 99th percentile 100k in the first, served at
92.5 %, then 10.8-13.0k and 68-92k; static 4 at x2: 13.7-14.6k and 88-111k in the first four
minutes, 90.3-93.0 %, then 12.8-13.3k) at about the same prompt tokens per second (the load the
records are compared on), cached or not, so a record cannot tell a long-prompt minute from a short
pool; cold prefix caches add to the first two minutes (0.05-0.07 of prompt tokens found cached,
0.10-0.13 after). Tried and not kept: records compared on prefill work instead of prompt tokens
(each prompt of L tokens counted as L x (1 + L / 76k), the causal attention's QK^T and PV FLOPs
over the weights' for Qwen2.5-7B: 4 x 28 layers x 3584 per pair against 2 x 7.6e9 per token; by
this measure the replay's first two 2-minute blocks at x3 ask 1.49 work per prompt token, later
ones 1.37-1.45): alone, it changes no decision at x1.5, x2.25-x6 (both misses stay, to the digit)
and costs x1.75 1.001 -> 1.037: the misses are the deficit of the minutes before any record of the
size exists, which no load measure prices. Not recording any window of the first 300 s
(or 360 s) is worse (x3 still misses, mooncake-x4 1.132, x3.5 1.173: the records also price the
way down).

Tried and not kept (``kv_budget``, left out of the code): the KV term capped at the afforded size
while the SLO windows are met, like the estimated terms (KV use is a state a size may have been
measured at; requiring the record's highest mean KV use to be at least today's changed nothing):
servegen-x8 1.019 / 1.053 / 1.009 / 1.017 on seeds 1 / 2 / 3 / 9, servegen-x16 1.007 / 1.021 /
1.000 / 0.997, held out servegen-x8 0.935 / 1.019 / **1.111** / 1.022 / 1.000 and servegen-x16 1.002
/ 0.999 / 1.025 / 1.013 / 1.027 on seeds 4-8, attainment within 1.2 points, every other cell
unchanged. Seed 6 is the KV episode above: a window at 0.91, then KV at 0.97 one decision before
the windows fall to 0.31; capped, the KV term buys 15 s later into a deeper miss, the bank is
deeper in debt and the sixth stays to t = 1245 s, then the warm pool churns for a remembered
burst (1.069 -> 1.111, over the 0.005 any cell may worsen). KV use at 0.97 is a leading signal
that the worst windows a size was measured at do not show.

Before ``slo_period_s`` (the bank alone; the twin's engine reserving a whole prompt's KV at
admission and keeping a preempted request's blocks cached, as vLLM 0.19 does, merge 0f6ec88) the
table was the same but for servegen-x8 seed 2 1.072 and seed 9 1.061, and mooncake-x4 1.082 / 96.2
on every seed.

With ``slo_budget`` priced at the load now (:mod:`tokenplane.core.autoscale.budget`: each size keeps
its worst window per load band, 10 % wide, and going down to it costs the worst window of the band
of the load now, not the worst ever) and the warm pool the remembered bursts ask for capped at the
afforded size like every estimated term: servegen-x8 seed 2 1.129 -> 1.072 (size 5's record held a
0.63 window from a burst at 6.0-6.5k prompt tokens/s; at 4-5k it priced 5 by that miss, 0.32 x 4.3
req/s x 145 s = 200 requests, so the sixth 70B instance bought at t = 435 s stayed until 1770 s; now
it drains at 1065 s, priced by 5's windows at that load, and is not kept warm), seed 9 1.064 ->
1.061, mooncake-x4 1.089 -> 1.082 on every seed, bursty-cv10 seed 2 1.002 -> 1.000; attainment
unchanged to the last digit in every cell, every other cell identical. Held out (never looked at
before; the code before this change in brackets where it differs): seed 7 1.000, 1.000, 1.022,
1.013, 1.016, 1.082 (1.089), 1.000, 1.000; seed 8 1.000, 1.000, 1.000, 1.027, 1.016, 1.082 (1.089),
1.000, 1.000; seeds 4 and 5 bursty-cv4 1.008 -> 1.000 and 1.002 -> 1.000, mooncake-x4 1.089 ->
1.082, the rest identical; seed 6 1.000, 1.000, 1.176 (1.179), 1.027, 1.016, 1.082 (1.089), 1.000
(1.004), 1.000 (1.002); SLO met 8/8 on every seed. Either half alone is not enough on seed 2:
the bands alone 1.159 (the drained sixth parks in the warm pool the bursts ask for; seed 9 1.063),
the warm cap alone 1.135 (the bank never affords 5 before 1770 s). Bands 15 / 20 / 25 % wide:
seed 2 1.090 / 1.079 / 1.112 (a band reaching up to the burst's 6.0k prices the load now by the
miss), the other tuning cells within 0.002 of 10 %'s. Also tried and not kept: letting a size under the
remembered-bursts floor be afforded only when the bank also covers the burst's return (its worst
window at the burst's load, at the burst's rate, for a cold start; with the bands, before the warm
cap): seed 2 1.189, since that costs about 300 requests, which the bank does not hold while the
load is low.

The engine change moved only ServeGen: a static fleet of five 70B instances now meets the SLO on
seeds 1 and 2 (it needed six before: admitting on the first prefill chunk had it preempt and
recompute under KV pressure), so servegen-x8 went 1.000 -> 1.062 and 1.000 -> 1.129 against a
cheaper static-best, 1.131 -> 1.064 on seed 9 and stayed 1.024 on seed 3; servegen-x16 1.019 /
1.016 / 1.013 / 1.010 -> 1.016 / 1.021 / 1.006 / 1.010. Every other cell is identical. The SLO is
met on 8 of 8 for every seed and no HPA variant beats tokenplane on both axes anywhere. The figures
below this paragraph are from the engine before that change.

With ``cancel_warming`` (a scale-down cancels instances still warming, which stop costing at once;
see :mod:`tokenplane.core.autoscale.evidence`) the cold starts bought for KV, queue and SLO
episodes shorter than a cold start are cancelled two decisions after the need ends instead of
landing and being stopped unused: servegen-x16 1.028 / 1.016 / 1.055 -> 1.019 / 1.016 / 1.013,
servegen-x8 seed 3 1.038 -> 1.024, mooncake-x2 1.019 -> 1.016, bursty-cv10 seed 2 1.005 -> 1.002;
attainment unchanged everywhere. Seed 6 (not looked at while building): 1.000, 1.000, 1.000,
0.949, 1.016, 1.132, 1.004, 1.002 in the table's order (was 1.000, 1.000, 1.000, 0.949, 1.019,
1.132, 1.005, 1.005), SLO met 8/8. What is left over static-best is, except on mooncake-x4,
GPU time of cold starts bought while the pool was visibly short (SLO windows failing, KV at 0.9+,
a queue), up to their cancel (servegen-x16 seed 2: a KV episode as long as a cold start, the four
land as it ends); the GPU-hours spent serving are static-best's or less (within 0.1 %). Not buying them means
spending the SLO's slack on the episode, which only a run-level attainment (an error budget) can
justify; the scaler controls 60 s windows. mooncake-x4 holds 8 for a load 7 serves at 95.7 %
over the run (8: 97.3 %). Seeds 4 and 5 (SLO met 8/8 each): 1.000, 1.000, 1.000, 1.025, 1.016,
1.132, 1.008, 1.000 and 1.000, 1.000, 1.186, 1.023, 1.016, 1.132, 1.002, 1.000 (figures before
this rule below).

(Seed 1's absolute figures: static-best 0.49, 0.37, 4.58, 3.91, 1.98, 1.74, 4.00, 4.00 GPU-h in
this order; HPA (busy) 2.39, 1.16, 26.61, 13.41, 9.44, 5.30, 7.69, 7.88 GPU-h.) The Azure and
Mooncake replays do not depend on the seed; ServeGen's sampling and the bursty generator do. The
SLO is met on 8 of 8 workloads for every seed, the GPU-hours are at or under static-best on 5, 4
and 4 of 8 (azure-x4, azure-x8, servegen-x8 on seeds 1-2, bursty-cv4, bursty-cv10 on seeds 1 and
3), and no HPA variant beats tokenplane on both axes anywhere. With ``warm_slo_share`` (the warm pool
sized for ``slo_target`` of the cold-start peak while the SLO is met) azure-x8 no longer cold-starts
a fourth for a forecast 3 % over three instances, stopped unused when it lands (was 1.051 x), and
servegen-x8 seed 3 no longer holds a sixth 70B instance (warm, or serving) for most of the run
(1.038 x at 96.7 %, was 1.170 x at 99.0 %: the SLO's margin is spent), servegen-x16 seed 2 1.016
(was 1.033). A capacity ceiling below the rate served comfortably counts as refuted
(``latency_queues``): found on seed 4's bursty-cv4 (1.015 -> 1.010, a cold start for a burst's
onset trend on a stale ceiling), checked on seed 5 (bursty-cv10 1.005 -> 1.000; seeds 1-3 the
same). Seeds 4 and 5 (SLO met 8/8 each): 1.000,
1.000, 1.000, 1.025, 1.019, 1.132, 1.010, 1.000 and 1.000, 1.000, 1.186, 1.028, 1.019, 1.132,
1.005, 1.000 in the table's order (servegen-x8 seed 5: the burst floor, as on seed 3 before).
With ``latency_queues``
(a backlog judged by the latency it causes, see :mod:`tokenplane.core.autoscale.policy`) the
bursty pools no longer buy a fifth instance for a peak a few percent over four times an estimate
set by queues at a tenth of the SLO (was 1.11-1.22 x static-best; seed 2's bursty-cv4 missed the
SLO at 91.7 %) nor a warm fifth for the forecast's trend at a burst's onset, and mooncake-x4
holds 8 rather than 9 (was 1.22). What is left: one such onset cold start on seed 2's bursty-cv10
(0.5 % over), servegen-x16 and servegen-x8 seed 3, whose GPU-hours over static-best are 70B cold
starts (about 130 s each) bought for KV-pressure and SLO episodes shorter than a cold start and
stopped unused when they land, mooncake's first minutes at a window attainment under 95 % (the static
fleet of 7 runs at 95.7 % over the whole run, the scaler controls 60 s windows), and servegen-x8,
where the floor that keeps a quiet pool at its remembered bursts' peak (served comfortably) also
holds a trace whose peaks are noise around a slow level (was 0.88-0.89 x on seeds 1-2; without
the floor it reached 0.84 x at 94.98 %, and the bursty pools of seed 2 missed at 90-94 %).
Bursty traffic with memoryless bursts cannot be much cheaper than the static fleet sized for its
peak: a burst that finds the pool short costs a cold start (68 s) of misses at 1 s TTFT, so the
burst's capacity must be held (serving or warm, both holding GPUs) all the time.

Seed 9 (unseen), same code: 1.000, 1.000, 1.131, 1.010, 1.016, 1.132, 1.002, 1.002 in the table's
order, SLO met 8/8; servegen-x8's 1.131 is a sixth 70B instance bought in KV-pressure episodes
during which window attainment fell to 0.32 (really short), kept until the KV episodes end.

Why mooncake-x4 holds 8 (seed 1; the same on every seed, the replay does not depend on it): the
scale-down need is the demand at utilisation ``1.0 - scale_down_hysteresis`` of a capacity that is
learned as the rate served (``capacity_lower_bounds``) and can probe above it only up to the last
saturated measurement: first 1.86 req/s each (14.9 req/s over 8 ready instances 7 s after the eighth
came up, judged saturated by a queue and an attainment window, 0.918, that measured the 7-instance
pool), then 1.3-1.9 from 15 s windows whose queue (Little's-law wait over 1 s) is judged saturation
at TTFT p90 2 s of the 5 s SLO. At 8 instances nothing measured can exceed the load over 8 (1.8-1.9
each), so the need at 0.9 stays ⌈14.5 / (2.1 × 0.9)⌉ = 8 for the rest of the run. By its own 60 s
windows the scaler is right: 7 instances at 14.5 req/s dip under 95 % (static 7 does too, 95.7 %
over the run; 6 gives 85.8 %). Tried, seed-1 figures (mooncake-x4, mooncake-x2; none kept): the
probe not capped by a ceiling below the most served comfortably 1.046 / 94.1 %, 0.995 / 93.8 % (the
most served comfortably is a maximum of 15 s throughputs, a ratchet: the pool steps to 5); the same
with that rate from the minute's arrivals 1.131, 1.066; no hysteresis 1.034 / 93.9 %, 1.003 / 93.9
%; an error budget for the SLO term (a window under the target fails only when the decayed run-long
attainment cannot cover it for a cold start) identical on all 40 workload x seed runs (1, 2, 3, 6,
9): the SLO term is never the marginal driver; no saturated measurement within a minute plus the SLO
of a change in ready instances 1.132, 1.016 (unchanged); that, the uncapped probe and no
queue-judged saturation while latency is comfortable 1.008 / 92.8 %, 0.928 / 87.3 %. Every rule that
lets the estimate rise walks the pool under the knee (7: 95.7 %, 6: 85.8 %); every rule that makes
the measurement robust keeps 8. Under ``window_from_cold_start`` the SLO term's step (asked for one
decision, then holding n) never buys a cold start (seed 1: 11 of 11 steps that needed one); letting
it hold its step until the next one costs mooncake-x2 1.016 -> 1.263.

With ``slo_budget`` (:mod:`tokenplane.core.autoscale.budget`: the run's banked SLO margin pays for
one instance fewer when it covers, for a cold start, the worst window that size was measured at, at
the prompt-token load now or more) mooncake-x4 goes 1.132 -> 1.089 on seeds 1, 2, 3, 6 and 9 (96.9
-> 96.2 %): it buys the eighth at t = 60 s as before (windows at 7 were 0.91-0.94 and the run
behind the target), and returns to 7 at t = 570 s instead of never, once 14.5 req/s x 83 s x (0.95 -
0.903) = 57 requests are banked; the other 39 workload x seed cells are unchanged to the last digit
(GPU-hours and attainment). Seeds 4 and 5: mooncake-x4 the same, servegen-x8 seed 5 1.186 -> 1.095
(99.1 %), the other 14 cells unchanged. Compared on req/s instead of prompt tokens/s it changes nothing (7 was
measured at 11.3 req/s, the load later is 14-15 req/s, but the same ~160k prompt tokens/s). Why
1.0 is out of reach for a causal scaler on this cell: static 7's per-minute attainment (by arrival
minute, seed 1) is 94.5, 90.4, 96.4, 95.4, 95.8, 96.9, 93.3, 96.7, 96.6, 99.0, 97.8, 97.6, 92.2,
96.8, 95.0 %; it meets 95 % over the run only because the later minutes repay the first two, which a
pool at 7 cannot know at t = 60 s, and holding 8 from 60 s to 570 s is the 8.9 %. servegen-x8 seed 9
is unchanged: the worst window at 5 is 0.32 and the run's bank is negative from that KV episode
until late, so no size is afforded (taking the mean window instead of the worst changes no cell).

Tried and not kept (two rules, named here ``kv_needs_latency`` and ``floor_from_level``, left out
of the code; tuned on seeds 1 / 2 / 3 / 9, then 4 and 5 held out;
servegen-x8 and servegen-x16 as GPU-hours over static-best / attainment %; every other cell is
the code's own on all six seeds: the table above, and on seeds 4 and 5 azure-x4, azure-x8,
mooncake-x2, mooncake-x4, bursty-cv4, bursty-cv10 1.000, 1.000, 1.016, 1.089, 1.008, 1.000 and
1.000, 1.000, 1.016, 1.089, 1.002, 1.000, SLO met):

    variant             workload     seed 1     seed 2     seed 3     seed 9     seed 4     seed 5
    both rules          servegen-x8  1.010/97.0 1.053/97.9 1.008/97.6 1.023/98.5 0.953/96.5 0.971/97.6
                        servegen-x16 0.979/99.2 1.021/98.5 0.967/99.6 0.933/96.8 0.956/88.5 0.923/92.0
    floor_from_level    servegen-x8  1.062/99.5 1.113/98.3 1.023/97.6 1.064/98.9 0.957/96.5 0.993/98.9
                        servegen-x16 0.989/99.2 1.021/98.5 0.973/99.6 0.942/97.3 0.962/88.5 0.928/92.3
    kv_needs_latency    servegen-x8  1.019/98.3 1.151/97.9 1.009/97.7 1.023/98.5 0.953/96.5 1.019/99.1
                        servegen-x16 1.007/99.2 1.021/98.5 1.000/99.6 0.997/99.7 1.002/99.2 0.999/99.4
    (the code before)   servegen-x8  1.062/99.5 1.129/98.3 1.024/97.7 1.064/98.9 0.957/96.5 1.019/99.1
                        servegen-x16 1.016/99.2 1.021/98.5 1.006/99.6 1.010/99.7 1.008/99.2 1.004/99.4

``floor_from_level`` sizes the remembered-bursts floor for today's level plus the rise the burst
memory measured above its level (at most the remembered peak) rather than for the peak alone: a peak
seen from a busier level was taken for a level that had passed (servegen-x8 seed 2 held a sixth 70B
instance from t = 480 s to 1770 s, the last fourteen minutes at 4-5 req/s, for a remembered peak of
7.7 req/s). It met the SLO on the tuning seeds and failed both held-out ones: on servegen-x16 seed 4
the pool, released from the floor, shrank 10 -> 7 at 8-9 req/s and the load returned to 10-12 req/s
minutes later; at 7 the KV caches filled (0.93-0.98) and windows fell to 3-12 % for the two minutes
the cold starts took (88.5 % over the run). The peak floor is there for exactly that return.
``kv_needs_latency`` (full KV caches buy nothing while TTFT p90 is within ``comfort_fraction`` of
the SLO and attainment is met, the hold paid from the ``slo_budget`` bank against the worst window
measured near KV pressure; without the bank the two rules together missed on seed 3, 94.7 %) cuts
what seed 1's KV-bought sixth instance cost (1.062 -> 1.019) and meets the SLO on every seed, but on
seed 2 it buys later into the same real miss, which then costs more (1.129 -> 1.151), over the 0.005
this suite allows any cell to get worse. Together they are cheaper on every tuning cell because the
floor's release repays seed 2, which the held-out seeds refute.

``--cache FILE`` keeps static-fleet and HPA runs (keyed by the whole scenario document) across
runs; the tokenplane row is always rerun.

Traces come from the configurable traces folder (``--traces``, ``$TOKENPLANE_TRACES``, default
``../shared/traces``); a missing one is skipped with a reason. Each scenario is also a file the
twin runs: ``--write-scenarios DIR`` writes them (``tokenplane simulate DIR/NAME.yaml``).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tokenplane.sim.runner import run_scenario
from tokenplane.sim.scenario import parse_scenario
from tokenplane.sim.workloads.factory import build_workload
from tokenplane.sim.workloads.traces import traces_dir

SLO_TARGET = 0.95
PRIOR_RPS = 4.0  # the same rough per-instance prior for every workload: the scaler must learn
LIFECYCLE = {"start_s": 60, "load_gb_per_s": 2.0, "warm_activation_s": 5}
POOL = {"capacity_rps": PRIOR_RPS, "min_instances": 1}

SMALL = {"gpu": "H100", "model": "llama-3-8b", "lifecycle": LIFECYCLE}
LARGE = {"gpu": "H100", "model": "llama-3-70b", "tp": 2, "lifecycle": LIFECYCLE}


def workloads(minutes: float | None) -> dict[str, dict[str, Any]]:
    """Each workload: its ``workload`` slice, fleet (max pool), SLO and the trace it needs."""
    cut = None if minutes is None else minutes * 60.0
    out: dict[str, dict[str, Any]] = {}
    for speed in (4, 8):
        limit = None if cut is None else int(cut * 5.5 * speed)  # azure: about 5.5 req/s at 1x
        out[f"azure-x{speed}"] = {
            "needs": "azure-2023/AzureLLMInferenceTrace_conv.csv",
            "fleet": {**SMALL, "instances": 12},
            "slo": {"ttft_s": 1.0, "tbt_s": 0.1},
            "workload": {
                "type": "azure",
                "path": "azure-2023/AzureLLMInferenceTrace_conv.csv",
                "time_scale": 1 / speed,
                **({"limit": limit} if limit else {}),
            },
        }
    for speed in (8, 16):
        out[f"servegen-x{speed}"] = {
            "needs": "servegen/reason/deepseek-r1",
            "fleet": {**LARGE, "instances": 40},
            "slo": {"ttft_s": 2.0, "tbt_s": 0.1},
            "workload": {
                "type": "servegen",
                "path": "servegen/reason/deepseek-r1",
                "clients": [47, 18, 62, 11],
                "time_scale": 1 / speed,
                "duration_s": cut if cut is not None else 6 * 3600 / speed,
            },
        }
    for speed in (2, 4):
        limit = None if cut is None else int(cut * 3.4 * speed)  # mooncake: about 3.4 req/s at 1x
        out[f"mooncake-x{speed}"] = {
            "needs": "mooncake/conversation_trace.jsonl",
            "fleet": {"gpu": "H200", "model": "qwen2.5-7b", "lifecycle": LIFECYCLE, "instances": 24},
            "slo": {"ttft_s": 5.0, "tbt_s": 0.1},
            "workload": {
                "type": "mooncake",
                "path": "mooncake/conversation_trace.jsonl",
                "time_scale": 1 / speed,
                **({"limit": limit} if limit else {}),
            },
        }
    for cv in (4, 10):
        out[f"bursty-cv{cv}"] = {
            "needs": None,
            "fleet": {**SMALL, "instances": 16},
            "slo": {"ttft_s": 1.0, "tbt_s": 0.1},
            "workload": {
                "type": "bursty",
                "rate_rps": 20,
                "cv": cv,
                "peak_ratio": 4,
                "burst_s": 120,
                "duration_s": cut if cut is not None else 3600,
            },
        }
    return out


def variants() -> dict[str, dict[str, Any]]:
    """Workloads the scaler was never tuned on (``--variants``): other speeds of the same traces
    and other bursty shapes, each with its workload's fleet and SLO."""
    base = workloads(None)

    def variant(src: str, **changes: Any) -> dict[str, Any]:
        wl = copy.deepcopy(base[src])
        wl["workload"].update(changes)
        return wl

    out = {f"azure-x{k}": variant("azure-x4", time_scale=1 / k) for k in (2, 6, 12)}
    for k in (6, 12, 20):
        out[f"servegen-x{k}"] = variant("servegen-x8", time_scale=1 / k, duration_s=6 * 3600 / k)
    for k in (1.5, 1.75, 2.25, 2.5, 2.75, 3, 3.25, 3.5, 4.5, 5, 6):
        out[f"mooncake-x{k}"] = variant("mooncake-x2", time_scale=1 / k)
    out["bursty-cv6-r3"] = variant("bursty-cv4", cv=6, peak_ratio=3, burst_s=300)
    out["bursty-cv2-r6"] = variant("bursty-cv4", cv=2, peak_ratio=6, burst_s=60, rate_rps=12)
    return out


def scenario_doc(name: str, wl: dict[str, Any], autoscaler: dict[str, Any], seed: int) -> dict[str, Any]:
    return {
        "name": name,
        "seed": seed,
        "router": "least-requests",
        "fleet": copy.deepcopy(wl["fleet"]),
        "workload": copy.deepcopy(wl["workload"]),
        "slo": dict(wl["slo"]),
        "autoscaler": {"decision_interval_s": 15, "pool": dict(POOL), **autoscaler},
    }


SCALERS: dict[str, dict[str, Any]] = {
    # The tokenplane settings for every workload: remember bursts for a half-life of 30 minutes (the
    # default, 2 x stabilisation_s = 6 minutes, forgets an on-off cycle longer than that) and plan
    # for 90 % of the learned capacity (the default is 0.75).
    "tokenplane": {
        "name": "tokenplane",
        "initial_serving": 1,  # replaced by the static-best size
        "params": {
            "burst_half_life_s": 1800,
            "target_utilisation": 1.0,  # the learned capacity is a served rate; headroom is measured
            "comfort_fraction": 0.8,
            "burst_k": 0.5,
            "capacity_prior_weight": 0.5,
            "capacity_lower_bounds": True,
            "trust_latency": True,
            "symmetric_bursts": True,
            "queue_buffer": True,
            "window_from_cold_start": True,
            "latency_queues": True,
            "warm_slo_share": True,
            "cancel_warming": True,
            "slo_budget": True,
            "slo_defer": True,
        },
    },
    "hpa": {
        "name": "hpa",
        "initial_serving": 1,  # replaced by the static-best size
        "params": {"target_utilisation": 0.7, "tolerance": 0.1, "stabilisation_s": 300},
    },
    "hpa-kv": {
        "name": "hpa",
        "initial_serving": 1,  # replaced by the static-best size
        "utilisation_metric": "kv_usage",
        "params": {"target_utilisation": 0.5, "tolerance": 0.1, "stabilisation_s": 300},
    },
}


_CACHE: dict[str, dict[str, Any]] = {}
_CACHE_FILE: Path | None = None


def _cached_run(doc: dict[str, Any], traces: Path | None) -> dict[str, Any]:
    """``run_one`` through the ``--cache`` file (for runs that do not depend on the tokenplane code:
    static fleets and the HPA baselines), keyed by the whole scenario document."""
    if _CACHE_FILE is None:
        return run_one(doc, traces)
    key = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    if key not in _CACHE:
        _CACHE[key] = run_one(doc, traces)
        _CACHE_FILE.write_text(json.dumps(_CACHE, indent=0, sort_keys=True))
    return _CACHE[key]


def run_one(doc: dict[str, Any], traces: Path | None) -> dict[str, Any]:
    started = time.perf_counter()
    (outcome,) = run_scenario(parse_scenario(doc), traces=traces).values()
    r = outcome.report
    return {
        "gpu_hours": round(float(r["gpu_hours"]), 4),
        "slo_attainment": round(float(r["ttft_slo_attainment"] or 0.0), 4),
        "requests": r.get("requests_total"),
        "wall_s": round(time.perf_counter() - started, 2),
    }


def slo_period_s(wl: dict[str, Any], seed: int, traces: Path | None) -> float:
    """The period the suite judges the SLO over: the whole run, to its last arrival."""
    last = 0.0
    for spec in build_workload(wl["workload"], traces=traces, seed=seed).arrivals():
        last = spec.arrival_s
    return float(max(math.ceil(last), 1))


def with_period(period_s: float, without: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """``SCALERS`` with the tokenplane scaler told the SLO's period (the HPAs have no such input),
    and the evidence rules named in ``without`` turned off (an ablation)."""
    tp = SCALERS["tokenplane"]
    unknown = [r for r in without if tp["params"].get(r) is not True]
    if unknown:
        raise SystemExit(f"--without: not an evidence rule the suite turns on: {', '.join(unknown)}")
    params = {**tp["params"], "slo_period_s": period_s, **dict.fromkeys(without, False)}
    return {**SCALERS, "tokenplane": {**tp, "params": params}}


def static_best(name: str, wl: dict[str, Any], seed: int, traces: Path | None) -> dict[str, Any]:
    """Bisection for the smallest static fleet meeting the target (attainment rises with size)."""
    lo, hi = 1, int(wl["fleet"]["instances"])
    tried: dict[int, dict[str, Any]] = {}

    def attempt(n: int) -> dict[str, Any]:
        if n not in tried:
            doc = scenario_doc(name, wl, {"name": "static", "params": {"instances": n}}, seed)
            tried[n] = _cached_run(doc, traces)
        return tried[n]

    if attempt(hi)["slo_attainment"] < SLO_TARGET:
        return {**tried[hi], "instances": hi, "meets": False, "tried": sorted(tried)}
    while lo < hi:
        mid = (lo + hi) // 2
        if attempt(mid)["slo_attainment"] >= SLO_TARGET:
            hi = mid
        else:
            lo = mid + 1
    return {**attempt(hi), "instances": hi, "meets": True, "tried": sorted(tried)}


def verdict(row: dict[str, dict[str, Any]]) -> dict[str, Any]:
    tp, st = row["tokenplane"], row["static-best"]
    meets = tp["slo_attainment"] >= SLO_TARGET
    cheaper = tp["gpu_hours"] <= st["gpu_hours"] + 1e-9
    dominated_by = [
        k
        for k in ("hpa", "hpa-kv")
        if row[k]["slo_attainment"] >= tp["slo_attainment"]
        and row[k]["gpu_hours"] <= tp["gpu_hours"]
        and (row[k]["slo_attainment"] > tp["slo_attainment"] or row[k]["gpu_hours"] < tp["gpu_hours"])
    ]
    return {
        "meets_slo": meets,
        "gpu_hours_vs_static_best": round(tp["gpu_hours"] / st["gpu_hours"], 3) if st["gpu_hours"] else None,
        "no_more_than_static_best": cheaper,
        "beaten_by_hpa_variant": dominated_by,
        "done": meets and cheaper and not dominated_by,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the result as JSON (default: a table)")
    ap.add_argument("--traces", default=None, help="the public traces folder (default ../shared/traces)")
    ap.add_argument("--minutes", type=float, default=None, help="cut every workload to this many minutes")
    ap.add_argument("--only", action="append", default=None, help="run only this workload (repeatable)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--variants", action="store_true", help="run the untuned variants (other speeds and shapes) instead"
    )
    ap.add_argument("--write-scenarios", default=None, help="write each workload's scenario file here")
    ap.add_argument(
        "--cache",
        default=None,
        help="JSON file of static-fleet and HPA results reused across runs (tokenplane runs never are)",
    )
    ap.add_argument(
        "--without",
        action="append",
        default=[],
        help="turn this evidence rule of the tokenplane scaler off, e.g. slo_defer (repeatable)",
    )
    ap.add_argument(
        "--start",
        type=int,
        default=None,
        help="every autoscaler starts serving with this many instances (default: static-best's size)",
    )
    args = ap.parse_args(argv)
    global _CACHE_FILE
    if args.cache:
        _CACHE_FILE = Path(args.cache)
        if _CACHE_FILE.exists():
            _CACHE.update(json.loads(_CACHE_FILE.read_text()))

    folder = traces_dir(args.traces)
    result: dict[str, Any] = {"workloads": {}, "skipped": {}, "slo_target": SLO_TARGET}
    for name, wl in (variants() if args.variants else workloads(args.minutes)).items():
        if args.only and name not in args.only:
            continue
        needs = wl["needs"]
        if needs is not None and (folder is None or not (folder / needs).exists()):
            result["skipped"][name] = f"trace {needs} not found under {folder}"
            continue
        row: dict[str, Any] = {}
        best = static_best(name, wl, args.seed, folder)
        period = slo_period_s(wl, args.seed, folder)
        scalers = {
            label: {**scaler, "initial_serving": args.start or best["instances"]}
            for label, scaler in with_period(period, tuple(args.without)).items()
        }
        if args.write_scenarios:
            write_scenario(Path(args.write_scenarios), name, wl, args.seed, scalers)
        for label, started in scalers.items():
            doc = scenario_doc(name, wl, started, args.seed)
            row[label] = run_one(doc, folder) if label == "tokenplane" else _cached_run(doc, folder)
        row["static-best"] = best
        row["verdict"] = verdict(row)
        result["workloads"][name] = row
        print(f"{name}: {json.dumps(row)}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)
    return 0


def write_scenario(
    folder: Path, name: str, wl: dict[str, Any], seed: int, scalers: dict[str, dict[str, Any]]
) -> None:
    """``NAME.yaml``: the workload with one run per scaler, as the suite ran them (each run's
    autoscaler whole: runs deep-merge over the base, so the base holds only what they share)."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = scenario_doc(name, wl, {}, seed)
    doc["runs"] = [{"name": k, "autoscaler": v} for k, v in scalers.items()]
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def print_table(result: dict[str, Any]) -> None:
    cols = ("tokenplane", "hpa", "hpa-kv", "static-best")
    print(f"{'workload':16}" + "".join(f"{c:>22}" for c in cols) + "  done")
    for name, row in result["workloads"].items():
        cells = "".join(
            f"{row[c]['gpu_hours']:>11.2f} GPU-h {100 * row[c]['slo_attainment']:>5.1f}%" for c in cols
        )
        print(f"{name:16}{cells}  {row['verdict']['done']}")
    for name, why in result["skipped"].items():
        print(f"{name:16} skipped: {why}")


if __name__ == "__main__":
    raise SystemExit(main())
