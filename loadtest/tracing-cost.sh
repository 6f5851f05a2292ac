#!/usr/bin/env bash
# What tracing costs the proxy: throughput and the proxy's CPU per request with tracing off,
# on at sampler ratio 1.0, and on at 0.01, measured in one run with interleaved rounds.
#
# Three proxies (release build, one worker thread each, all on CPU 1) serve the same one-rule
# config in front of the echo backend; wrk (32 keep-alive connections), the echo backend and
# the collector run on CPU 0. The collector is nginx answering 200 to every OTLP/HTTP export,
# so the proxy does all of an export's work (encoding, sending) and the collector none worth
# counting. Each round loads each proxy in turn for DURATION seconds; the medians are printed
# with their ratios to tracing off. At the end each proxy is stopped (it flushes its spans)
# and the spans its queue dropped are counted from its log.
#
#   cargo build --release -p cftunnel-proxy -p cftunnel-testkit
#   apt-get install -y wrk nginx
#   loadtest/tracing-cost.sh            # ROUNDS=3 DURATION=10 CONNECTIONS=32 BIN=target/release
set -euo pipefail

bin=${BIN:-target/release}
rounds=${ROUNDS:-3}
duration=${DURATION:-10}
connections=${CONNECTIONS:-32}
work=$(mktemp -d)
pids=()

cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

taskset -c 0 "$bin/cftunnel-echo" --http-addr 127.0.0.1:18080 --h2c-addr 127.0.0.1:18081 --quiet &
pids+=($!)

cat >"$work/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx-error.log;
events {}
http {
    access_log off;
    client_body_temp_path $work;
    client_max_body_size 64m;
    server { listen 127.0.0.1:14318; location / { return 200; } }
}
EOF
taskset -c 0 nginx -c "$work/nginx.conf" &

echo '{"version": 1, "rules": [{"backends": [{"url": "http://127.0.0.1:18080", "weight": 1}]}]}' \
    >"$work/config.json"

# name data-port env...
declare -A port proc
start_proxy() {
    local name=$1 data=$2
    shift 2
    env -u TUNNEL_TOKEN -u OTEL_EXPORTER_OTLP_ENDPOINT "$@" \
        PROXY_ADDR="127.0.0.1:$data" PROXY_CONFIG_ADDR="127.0.0.1:$((data + 1))" \
        PROXY_WORKER_THREADS=1 PROXY_GRACE_PERIOD=1s RUST_LOG=warn \
        taskset -c 1 "$bin/cftunnel-proxy" --config-file "$work/config.json" \
        2>"$work/$name.log" &
    proc[$name]=$!
    pids+=($!)
    port[$name]=$data
}
otlp=(OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:14318 OTEL_TRACES_SAMPLER=parentbased_traceidratio)
start_proxy off 18100
start_proxy ratio-1 18110 "${otlp[@]}" OTEL_TRACES_SAMPLER_ARG=1.0
start_proxy ratio-0.01 18120 "${otlp[@]}" OTEL_TRACES_SAMPLER_ARG=0.01
variants=(off ratio-1 ratio-0.01)

for name in "${variants[@]}"; do
    for _ in $(seq 100); do
        curl -fs "http://127.0.0.1:$((port[$name] + 1))/readyz" >/dev/null && break
        sleep 0.1
    done
done

# utime + stime of a process, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

declare -A rps cpu
for round in $(seq "$rounds"); do
    for name in "${variants[@]}"; do
        before=$(ticks "${proc[$name]}")
        out=$(taskset -c 0 wrk -t1 -c"$connections" -d"${duration}s" \
            "http://127.0.0.1:${port[$name]}/")
        after=$(ticks "${proc[$name]}")
        requests=$(echo "$out" | awk '/requests in/ {print $1}')
        r=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
        us=$(awk -v t=$((after - before)) -v hz="$hz" -v n="$requests" \
            'BEGIN {printf "%.2f", t / hz * 1e6 / n}')
        echo "round $round $name: $r req/s, $us us CPU per request"
        rps[$name]+="$r "
        cpu[$name]+="$us "
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
off_rps=$(echo "${rps[off]}" | median)
off_cpu=$(echo "${cpu[off]}" | median)
echo
echo "| tracing | req/s | vs off | proxy CPU per request | vs off |"
echo "|---|---|---|---|---|"
for name in "${variants[@]}"; do
    m_rps=$(echo "${rps[$name]}" | median)
    m_cpu=$(echo "${cpu[$name]}" | median)
    awk -v n="$name" -v r="$m_rps" -v c="$m_cpu" -v r0="$off_rps" -v c0="$off_cpu" \
        'BEGIN {printf "| %s | %.0f | %.2f | %.2f us | %.2f |\n", n, r, r / r0, c, c / c0}'
done

# Stop the proxies: each flushes what is queued and logs the spans its full queue dropped.
for name in "${variants[@]}"; do kill -TERM "${proc[$name]}"; done
sleep 8
for name in ratio-1 ratio-0.01; do
    dropped=$(grep -o 'dropped_span_count[^,} ]*' "$work/$name.log" || true)
    echo "$name: ${dropped:-no spans dropped}"
done
