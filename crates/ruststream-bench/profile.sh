#!/usr/bin/env bash
# Profiles the framework side of one scenario with perf (software clock, works in VMs) and sums
# the consumer's (or publisher's) own CPU samples into categories.
#
#   crates/ruststream-bench/profile.sh SCENARIO CONFIG [N] [REDIS_URL]
#
# Needs `perf` (apt-get install linux-perf) and a release build
# (cargo build --release -p ruststream-bench). Writes target/rsb-SCENARIO-CONFIG.perf.
set -eu
scenario=${1:?scenario}
config=${2:?default or tuned}
n=${3:-300000}
redis=${4:-redis://127.0.0.1:6379}
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${RSB_BIN:-$root/target/release/ruststream-bench}
data=${RSB_PERF_DATA:-$root/target/rsb-$scenario-$config.perf}
comm=rsb-consumer
case $scenario in publish*) comm=rsb-publisher ;; esac

perf record -q -o "$data" -e cpu-clock -F 4999 -- \
  "$bin" --scenario "$scenario" --config "$config" --n "$n" --redis "$redis" --no-baseline |
  grep RESULT

echo "# samples per thread name (4999 Hz)"
perf report -i "$data" --sort comm --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -8
echo "# $comm self time by category (% of its samples)"
perf report -i "$data" --comm "$comm" --percentage relative --sort sym --stdio 2>/dev/null |
  grep -E '^ +[0-9]' |
  awk '
    {
      pct = $1; sub(/%/, "", pct)
      sym = $0; sub(/^ +[0-9.]+% +\[[.k]\] /, "", sym)
      if ($2 == "[k]")                                                   c = "kernel (syscalls: socket read/write, epoll, futex)"
      else if (sym ~ /malloc|free|memalign|_int_|unlink_chunk|realloc|cfree|tcache/) c = "malloc/free"
      else if (sym ~ /memcpy|memmove|memset|memcmp/)                     c = "memcpy"
      else if (sym ~ /serde_json|serde_core|json_decode|json_encode|Msg/) c = "JSON decode/encode (serde_json)"
      else if (sym ~ /^bytes::/)                                          c = "Bytes refcounts (clone/drop)"
      else if (sym ~ /frame::|from_utf8|utf8|Frame|encode_parts/)         c = "frame decode/encode (ruststream_redis::frame)"
      else if (sym ~ /join_set|JoinSet|idle_notified_set|task::list|OwnedTasks|sharded_list|task::state|task::harness|task::raw|task::core|task::waker|spawn|JoinHandle|bind_new_task|TaskIdGuard|new_task/) c = "tokio task per message (spawn, JoinSet, wake, join)"
      else if (sym ~ /tokio::sync|semaphore|Semaphore|mpsc|Notify|AtomicWaker/) c = "tokio sync (semaphore permits, mpsc to the settler)"
      else if (sym ~ /tokio::runtime|tokio::util|scheduler|park|Parker|context|coop|mio::|epoll|clock_gettime|tokio::time/) c = "tokio scheduler, timers, I/O driver"
      else if (sym ~ /fred::|redis_protocol|Resp|resp2|resp3/)            c = "fred client (encode, decode, routing)"
      else if (sym ~ /ruststream_core::dispatch|settle_loop/)             c = "core dispatch loop (reader, settler)"
      else if (sym ~ /ruststream_redis/)                                  c = "redis broker (deliveries, settle args)"
      else if (sym ~ /ruststream_bench/)                                  c = "benchmark handler (records the id)"
      else if (sym ~ /Arc|drop_in_place|alloc::/)                          c = "Vec building, Arc, drop glue"
      else                                                                c = "other"
      sum[c] += pct
    }
    END { for (c in sum) printf "%6.1f%%  %s\n", sum[c], c }' | sort -rn
