#!/bin/bash
# Every 5 s: the machine's used memory (MemTotal - MemAvailable, GB) and the resident size (and
# its shared part, the object store's pages) of every learner and rollout worker, one line each.
# Run beside `learning.py --parallel 2`; stop it with kill.
while true; do
  t=$(date +%H:%M:%S)
  awk -v t="$t" '/MemTotal/{tot=$2} /MemAvailable/{av=$2} END{printf "%s machine_used_gb %.2f\n", t, (tot-av)/1e6}' /proc/meminfo
  for kind in LearnerActor RolloutWorker; do
    for p in $(pgrep -f "ray::$kind"); do
      awk -v t="$t" -v k="$kind" -v p="$p" '/VmRSS/{r=$2} /RssShmem/{s=$2} /VmHWM/{h=$2} END{printf "%s %s %s rss_gb %.2f shmem_gb %.2f hwm_gb %.2f\n", t, k, p, r/1e6, s/1e6, h/1e6}' /proc/$p/status 2>/dev/null
    done
  done
  sleep 5
done
