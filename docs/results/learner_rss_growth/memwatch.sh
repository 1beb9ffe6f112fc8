#!/bin/bash
# sample learner/rollout RSS every 10 s
while true; do
  for p in $(pgrep -f "ray::LearnerActor"); do
    echo "$(date +%H:%M:%S) L $(grep -E 'VmRSS|RssAnon|RssFile|RssShmem|VmHWM' /proc/$p/status 2>/dev/null | awk '{printf "%s%s ", $1, $2}')"
  done
  for p in $(pgrep -f "ray::RolloutWorker"); do
    echo "$(date +%H:%M:%S) R $(grep -E 'VmRSS|RssAnon' /proc/$p/status 2>/dev/null | awk '{printf "%s%s ", $1, $2}')"
  done
  sleep 10
done
