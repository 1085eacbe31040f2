#!/usr/bin/env bash
# Memory per idle keep-alive client connection: sluice next to nginx and
# HAProxy (HTTP, HTTPS) and next to Kamailio (SIP over TCP and TLS), on
# loopback.
#
# usage: bench/idle-mem.sh [LEGS...]          (default: http sip)
#        bench/idle-mem.sh http https sip sip-tls      (every leg)
#   http   for each system of HTTP_SYSTEMS and each N of HTTP_NS: a fresh
#          balancer in front of two trivial nginx backends (the peers'
#          nginx-backend.conf: one worker answering `b1`/`b2`, on
#          127.0.0.1:18681/18682), then bench/idleconn opens N client
#          connections, each carrying one complete keep-alive
#          `GET / HTTP/1.1` and its 200 before going silent, and holds them
#   https  the same over TLS (one self-signed ECDSA P-256 certificate made
#          by openssl, the same for all), for each N of HTTPS_NS
#   sip    SIP over TCP, for each system of SIP_SYSTEMS and N of SIP_NS:
#          each connection carries one OPTIONS with Max-Forwards 0 which
#          the edge answers itself (sluice 200, Kamailio 483), so it is past
#          sluice's wait for a first message (-sip-tcp-first-message-timeout)
#          as a phone's first REGISTER would be, then goes silent. (SIP over
#          WSS: bench/sip-edge.sh mem.)
#   sip-tls  the same over TLS (sluice's -sip-tls-listen, Kamailio's
#          tls:5091 listener), for each N of SIP_NS
# What is measured, per system and N: the balancer's memory SETTLE s after
# it started and answered one request (before), and SETTLE s after the N
# connections are all open (after), each the PSS and the RSS from
# /proc/PID/smaps_rollup summed over every process of the system (nginx's
# master and worker, HAProxy's, sluice and its sluice-store child, Kamailio's
# many; the `timeout` wrapper excluded); bytes per idle connection =
# (after - before) / connections open. PSS counts a page shared by several
# processes once in all, RSS once per process (Kamailio's shm, nginx's
# master and worker pages). For sluice, the Go heap in use and the
# goroutines before and after come from its /metrics. Kernel memory (the
# sockets' own, about the same for every system) is in no process's PSS and
# not counted. The client checks, when it lets go of its connections, that
# the server closed none of them and sent nothing on any while they were
# held (a TLS server's close starts with its close_notify, seen as bytes
# sent): a figure with some is marked INVALID.
#
# Connections: the client binds each socket to one of SOURCES in turn
# before connecting (with IP_BIND_ADDRESS_NO_PORT), so N can pass the ~28k
# ephemeral ports of one source address. Every process needs one descriptor
# per connection: the script raises `ulimit -n` to its hard limit (raising
# the hard limit past what it is needs CAP_SYS_RESOURCE; with it,
# `ulimit -Hn 1048576` before running, under fs.nr_open), and leaves out
# (recorded as skipped) every N that the limit cannot hold. No sysctl is
# changed. By default (NETNS=1, as root) the script runs itself in a
# network namespace of its own (`unshare -n`, loopback up), so its
# connections take no port and no socket table from anything else on the
# machine, and any port it uses is free.
#
# sluice: `sluice run` (HTTP; loop engine by default, `sluice-fasthttp` in
# HTTP_SYSTEMS for -http-engine fasthttp) or `sluice sip` with its defaults
# but for the bounds a test from one client lifts: -http-max-conns and
# -http-max-conns-per-source (default: half the descriptor limit, an eighth
# of it per source), -http-client-idle 1h (default 2m would close the held
# connections), -tls-handshake-rate 0 and -tls-handshakes-max 4096 (as
# bench/https.sh), -sip-tcp-max-conns, -sip-tcp-max-conns-per-source and
# -sip-tcp-idle-timeout 1h; GOMAXPROCS=$GMP. nginx: one worker,
# worker_connections and worker_rlimit_nofile from the descriptor limit,
# keepalive_timeout 1h, upstream keep-alive pool (the peers' nginx-lb.conf);
# HAProxy: one thread, maxconn from the descriptor limit, timeout client
# and http-keep-alive 1h (the peers' haproxy.cfg otherwise); the TLS
# settings of bench/conf/nginx-tls.conf and haproxy-tls.cfg. Kamailio:
# bench/conf/kamailio-edge.cfg (plain SIP over TCP on its :8091 listener,
# one TCP worker, tcp_max_connections 30000, tcp_connection_lifetime 3605)
# with -m KAM_SHM_MB. No CPU cap or pinning: memory is what is measured.
#
# Knobs: HTTP_SYSTEMS="sluice nginx haproxy" (add sluice-fasthttp)
#   HTTP_NS="1000 10000 100000" HTTPS_NS=10000 SIP_SYSTEMS="sluice kamailio"
#   SIP_NS=10000 SOURCES=127.0.0.2-127.0.0.9 PARALLEL=64 (connections being
#   opened at once) SETTLE=5 GMP=1 KAM_SHM_MB=2048 NETNS=1
#   SLUICE_BIN (default: this tree, built into OUT) SLUICE_FLAGS (extra)
#   OUT=$TMPDIR/sluice-bench/idle-mem-<timestamp>
# Output: OUT/results.tsv (system, leg, N, metric, value), OUT/idle-mem.tsv
# (leg/system, N, bytes per idle connection by PSS: what
# `go run ./bench/plot idlemem` charts), a table on stdout ready for
# bench/RESULTS.md, every log. Every process it starts runs under `timeout`
# and is stopped by its PID; each point's client is bounded by
# OPEN_TIMEOUT s to open its connections.
set -u
usage() { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; }
case ${1:-} in -h|--help|help) usage; exit 0 ;; esac
case ${SLUICE_BIN:-} in ""|/*) ;; *) SLUICE_BIN=$(pwd -P)/$SLUICE_BIN ;; esac
NETNS=${NETNS:-1}
if [ "$NETNS" = 1 ] && [ -z "${IDLE_MEM_NETNS:-}" ]; then
    [ "$(id -u)" = 0 ] || { echo "bench/idle-mem.sh: NETNS=1 needs root (unshare -n); NETNS=0 runs in this namespace" >&2; exit 1; }
    export IDLE_MEM_NETNS=1 SLUICE_BIN
    exec unshare -n -- bash -c 'ip link set lo up && exec bash "$0" "$@"' "$0" "$@"
fi
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
LEGS=${*:-http sip}
HTTP_SYSTEMS=${HTTP_SYSTEMS-"sluice nginx haproxy"}
HTTP_NS=${HTTP_NS-"1000 10000 100000"}
HTTPS_NS=${HTTPS_NS-10000}
SIP_SYSTEMS=${SIP_SYSTEMS-"sluice kamailio"}
SIP_NS=${SIP_NS-10000}
SOURCES=${SOURCES:-127.0.0.2-127.0.0.9}
PARALLEL=${PARALLEL:-64}
SETTLE=${SETTLE:-5}
GMP=${GMP:-1}
KAM_SHM_MB=${KAM_SHM_MB:-2048}
OPEN_TIMEOUT=${OPEN_TIMEOUT:-600}
SLUICE_FLAGS=${SLUICE_FLAGS:-}
SERVER_TTL=${SERVER_TTL:-3600}
PEERS=${PEERS:-$ROOT/../shared/peers}
OUT=${OUT:-${TMPDIR:-/tmp}/sluice-bench/idle-mem-$(date +%Y%m%d-%H%M%S)}
# loopback ports (free in the script's own namespace; change if NETNS=0)
BE1=18681 BE2=18682 SL_HTTP=18601 SL_HTTPS=18602 SL_ADMIN=18609 SL_SIP=18605 SL_SIPS=18606
NG_HTTP=18611 NG_HTTPS=18612 HA_HTTP=18621 HA_HTTPS=18622 KAM_TCP=8091 KAM_TLS=5091

log() { echo "[$(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
isnum() { [[ $1 =~ ^[0-9]+$ ]]; }
for k in PARALLEL SETTLE GMP KAM_SHM_MB OPEN_TIMEOUT; do
    isnum "${!k}" && [ "${!k}" -ge 1 ] || die "$k=${!k}: want a positive integer"
done
for k in HTTP_NS HTTPS_NS SIP_NS; do
    for n in ${!k}; do isnum "$n" && [ "$n" -ge 1 ] && [ "$n" -le 1000000 ] || die "$k: $n is not a connection count 1..1000000"; done
done
for l in $LEGS; do case $l in http|https|sip|sip-tls) ;; *) die "unknown leg $l (want http, https, sip, sip-tls; usage: bench/idle-mem.sh -h)" ;; esac; done
for s in $HTTP_SYSTEMS; do case $s in sluice|sluice-fasthttp|nginx|haproxy) ;; *) die "HTTP_SYSTEMS: unknown system $s (want sluice, sluice-fasthttp, nginx, haproxy)" ;; esac; done
for s in $SIP_SYSTEMS; do case $s in sluice|kamailio) ;; *) die "SIP_SYSTEMS: unknown system $s (want sluice, kamailio)" ;; esac; done
need="openssl curl timeout ss go nginx"
case " $HTTP_SYSTEMS " in *" haproxy "*) need="$need haproxy" ;; esac
case " $LEGS " in *" sip "*|*" sip-tls "*) case " $SIP_SYSTEMS " in *" kamailio "*) need="$need kamailio" ;; esac ;; esac
for b in $need; do command -v "$b" >/dev/null || die "$b not installed (scripts/install-test-deps.sh)"; done
[ -f "$PEERS/conf/nginx-backend.conf" ] || die "no $PEERS/conf/nginx-backend.conf (PEERS=$PEERS)"

# Descriptors: one per connection in the client and in the balancer (plus
# its listeners, backends, store): a point needs N + FD_SPARE.
FD_SPARE=1000
ulimit -n "$(ulimit -Hn)" 2>/dev/null
FDS=$(ulimit -n); [ "$FDS" = unlimited ] && FDS=1048576
# fits SYSTEM N: HAProxy reserves two descriptors per connection of its
# maxconn (a client's and a server's) and refuses to start when its maxconn
# does not fit the limit that way, so it holds at most (limit - spare) / 2.
fits() {
    local per=1
    [ "$1" = haproxy ] && per=2
    [ $((per * $2 + FD_SPARE)) -le "$FDS" ]
}

mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd -P) || die "OUT=$OUT: cannot make the directory"
RES=$OUT/results.tsv
: > "$RES"
res() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >> "$RES"; log "  $1 $2 n=$3 $4 = $5"; }

# ---------------------------------------------------------------- processes
STARTED=()
LASTPID=
# start NAME CMD...: in the background (log OUT/NAME.log) under `timeout`;
# sets LASTPID.
start() {
    local name=$1; shift
    ( cd "$OUT" && exec timeout -k 5 "$SERVER_TTL" "$@" ) > "$OUT/$name.log" 2>&1 &
    LASTPID=$!
    STARTED+=("$LASTPID")
    log "started $name pid=$LASTPID"
}
descendants() {
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v root="$1" '
        { p = index($0, ") "); split(substr($0, p + 2), a, " "); kids[a[2]] = kids[a[2]] " " $1 }
        END { q[1] = root; n = 1; for (i = 1; i <= n; i++) { print q[i]; m = split(kids[q[i]], k, " ");
              for (j = 1; j <= m; j++) q[++n] = k[j] } }'
}
stop() {
    local pid=$1 d tree p keep=()
    tree=$(descendants "$pid")
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    for d in $tree; do kill -0 "$d" 2>/dev/null && kill -KILL "$d" 2>/dev/null; done
    wait "$pid" 2>/dev/null
    for p in "${STARTED[@]}"; do [ "$p" != "$pid" ] && keep+=("$p"); done
    STARTED=("${keep[@]}")
}
cleanup() {
    local i
    for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do stop "${STARTED[i]}"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

busy_tcp() { ss -Hltn "sport = :$1" | grep -q .; }
wait_tcp() { for _ in $(seq 150); do busy_tcp "$1" && return 0; sleep 0.1; done; die "nothing listening on tcp $1 (see $OUT/*.log)"; }
for p in $BE1 $BE2 $SL_HTTP $SL_HTTPS $SL_ADMIN $SL_SIP $SL_SIPS $NG_HTTP $NG_HTTPS $HA_HTTP $HA_HTTPS $KAM_TCP $KAM_TLS; do
    busy_tcp "$p" && die "tcp port $p already in use"
done

# mem PID: "PSS_KB RSS_KB PROCS" summed over the process tree of PID, the
# `timeout` wrapper left out.
mem() {
    local p
    for p in $(descendants "$1"); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = timeout ] && continue
        cat "/proc/$p/smaps_rollup" 2>/dev/null
    done | awk '$1 == "Pss:" { p += $2; n++ } $1 == "Rss:" { r += $2 } END { printf "%d %d %d\n", p, r, n }'
}
# gostats: "HEAP_INUSE_BYTES GOROUTINES" of sluice, from its /metrics.
gostats() {
    curl -s --max-time 5 "http://127.0.0.1:$SL_ADMIN/metrics" |
        awk '$1 == "go_memstats_heap_inuse_bytes" { h = $2 } $1 == "go_goroutines" { g = $2 } END { printf "%.0f %d\n", h, g }'
}

# ---------------------------------------------------------------- set up
BIN=${SLUICE_BIN:-$OUT/sluice}
if [ -z "${SLUICE_BIN:-}" ]; then
    log "building sluice into $BIN"
    go build -o "$BIN" ./cmd/sluice || die "build failed"
fi
go build -o "$OUT/idleconn" ./bench/idleconn || die "idleconn build failed"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 -subj /CN=localhost \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout "$OUT/key.pem" -out "$OUT/cert.pem" 2>"$OUT/openssl.log" ||
    die "openssl could not make a certificate (see $OUT/openssl.log)"
cat "$OUT/cert.pem" "$OUT/key.pem" > "$OUT/both.pem"
CERT=$OUT/both.pem

# The backends: the peers' nginx-backend.conf on this script's ports.
mkdir -p "$OUT/nginx-backend/logs" "$OUT/nginx-backend/tmp"
sed -e "s/18081/$BE1/; s/18082/$BE2/" "$PEERS/conf/nginx-backend.conf" > "$OUT/nginx-backend/nginx-backend.conf"
start nginx-backend nginx -p "$OUT/nginx-backend" -c "$OUT/nginx-backend/nginx-backend.conf" \
    -e "$OUT/nginx-backend/logs/error.log" -g 'daemon off; master_process on;'
wait_tcp "$BE1"; wait_tcp "$BE2"

# conf_nginx N: nginx, one worker, plain and TLS listeners.
conf_nginx() {
    local d=$OUT/nginx-lb
    mkdir -p "$d/logs" "$d/tmp"
    cat > "$d/nginx.conf" <<EOF
worker_processes 1;
worker_rlimit_nofile $FDS;
pid nginx.pid;
error_log logs/error.log warn;
events { worker_connections $((FDS - 100)); use epoll; multi_accept on; }
http {
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 1h;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_prefer_server_ciphers on;
    ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256;
    ssl_session_cache off;
    ssl_session_tickets on;
    upstream backends {
        server 127.0.0.1:$BE1;
        server 127.0.0.1:$BE2;
        keepalive 512;
        keepalive_requests 10000000;
    }
    server {
        listen 127.0.0.1:$NG_HTTP backlog=4096;
        listen 127.0.0.1:$NG_HTTPS ssl backlog=4096;
        ssl_certificate     $CERT;
        ssl_certificate_key $CERT;
        location / {
            proxy_pass http://backends;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
    start nginx-lb nginx -p "$d" -c "$d/nginx.conf" -e "$d/logs/error.log" -g 'daemon off; master_process on;'
}
conf_haproxy() {
    cat > "$OUT/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn $(((FDS - 200) / 2))
    tune.ssl.cachesize 0
    ssl-default-bind-options ssl-min-ver TLSv1.2
    ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256
defaults
    mode http
    maxconn $(((FDS - 200) / 2))
    timeout connect 2s
    timeout client 1h
    timeout server 30s
    timeout http-keep-alive 1h
frontend fe
    bind 127.0.0.1:$HA_HTTP backlog 4096
    bind 127.0.0.1:$HA_HTTPS ssl crt $CERT alpn http/1.1 backlog 4096
    default_backend be
backend be
    balance roundrobin
    cookie SRV insert indirect nocache
    server b1 127.0.0.1:$BE1 cookie b1
    server b2 127.0.0.1:$BE2 cookie b2
EOF
    start haproxy haproxy -db -f "$OUT/haproxy.cfg"
}

# start_http SYSTEM: sets SYS_PID, SYS_HTTP, SYS_HTTPS.
start_http() {
    local engine=loop
    case $1 in
    sluice|sluice-fasthttp)
        [ "$1" = sluice-fasthttp ] && engine=fasthttp
        rm -rf "$OUT/sluice-data"; mkdir -p "$OUT/sluice-data"
        # shellcheck disable=SC2086
        start "$1" env GOMAXPROCS="$GMP" "$BIN" run -http-engine "$engine" \
            -http-listen "127.0.0.1:$SL_HTTP" -https-listen "127.0.0.1:$SL_HTTPS" -tls-cert "$CERT" \
            -http-backend "127.0.0.1:$BE1" -http-backend "127.0.0.1:$BE2" -admin-listen "127.0.0.1:$SL_ADMIN" \
            -http-max-conns $((FDS - 200)) -http-max-conns-per-source $((FDS - 200)) -http-client-idle 1h \
            -tls-handshake-rate 0 -tls-handshakes-max 4096 \
            -data-dir "$OUT/sluice-data" -affinity-key-file "$OUT/affinity.key" -log-level warn -drain-timeout 1s $SLUICE_FLAGS
        SYS_PID=$LASTPID SYS_HTTP=$SL_HTTP SYS_HTTPS=$SL_HTTPS ;;
    nginx) conf_nginx; SYS_PID=$LASTPID SYS_HTTP=$NG_HTTP SYS_HTTPS=$NG_HTTPS ;;
    haproxy) conf_haproxy; SYS_PID=$LASTPID SYS_HTTP=$HA_HTTP SYS_HTTPS=$HA_HTTPS ;;
    esac
    wait_tcp "$SYS_HTTP"; wait_tcp "$SYS_HTTPS"
    curl -s --max-time 5 -o /dev/null "http://127.0.0.1:$SYS_HTTP/" && curl -sk --max-time 5 -o /dev/null "https://127.0.0.1:$SYS_HTTPS/" ||
        die "$1 does not answer through to the backends (see $OUT/*.log)"
}
# start_sip SYSTEM: sets SYS_PID, SYS_SIP (TCP), SYS_SIPS (TLS).
start_sip() {
    case $1 in
    sluice)
        rm -rf "$OUT/sluice-data"; mkdir -p "$OUT/sluice-data"
        # shellcheck disable=SC2086
        start sluice-sip env GOMAXPROCS="$GMP" "$BIN" sip -sip-listen "127.0.0.1:$SL_SIP" \
            -sip-tls-listen "127.0.0.1:$SL_SIPS" -tls-cert "$OUT/cert.pem,key=$OUT/key.pem" \
            -tls-handshake-rate 0 -tls-handshakes-max 4096 \
            -sip-backend "127.0.0.1:5071" -sip-health-interval 0 -admin-listen "127.0.0.1:$SL_ADMIN" \
            -sip-tcp-max-conns $((FDS - 200)) -sip-tcp-max-conns-per-source $((FDS - 200)) -sip-tcp-idle-timeout 1h \
            -data-dir "$OUT/sluice-data" -affinity-key-file "$OUT/affinity.key" -log-level warn $SLUICE_FLAGS
        SYS_PID=$LASTPID SYS_SIP=$SL_SIP SYS_SIPS=$SL_SIPS ;;
    kamailio)
        mkdir -p "$OUT/kamailio-run"
        printf '1 sip:127.0.0.1:5071\n' > "$OUT/dispatcher.list"
        printf '[server:default]\nmethod = TLSv1.2+\nverify_certificate = no\nrequire_certificate = no\nprivate_key = %s\ncertificate = %s\n' \
            "$OUT/key.pem" "$OUT/cert.pem" > "$OUT/kamailio-tls.cfg"
        start kamailio kamailio -f "$ROOT/bench/conf/kamailio-edge.cfg" -DD -E -m "$KAM_SHM_MB" -M 16 \
            -Y "$OUT/kamailio-run" -A "DSLIST=\"$OUT/dispatcher.list\"" -A "TLSCFG=\"$OUT/kamailio-tls.cfg\""
        SYS_PID=$LASTPID SYS_SIP=$KAM_TCP SYS_SIPS=$KAM_TLS ;;
    esac
    wait_tcp "$SYS_SIP"; wait_tcp "$SYS_SIPS"
}

# point LEG SYSTEM N PROTO PORT: memory before and after N idle connections.
point() {
    local leg=$1 sys=$2 n=$3 proto=$4 port=$5 pb rb kb pa ra ka hb gb ha ga open t=0 c log
    sleep "$SETTLE"
    read -r pb rb kb <<< "$(mem "$SYS_PID")"
    case $sys in sluice*) read -r hb gb <<< "$(gostats)" ;; esac
    log="idleconn-$leg-$sys-$n"
    start "$log" "$OUT/idleconn" -addr "127.0.0.1:$port" -proto "$proto" -conns "$n" -sources "$SOURCES" \
        -parallel "$PARALLEL" -hold 1h
    c=$LASTPID
    until grep -q '^ready' "$OUT/$log.log"; do
        sleep 1; t=$((t + 1))
        kill -0 "$c" 2>/dev/null || die "idleconn ended before it was ready (see $OUT/$log.log)"
        [ "$t" -gt "$OPEN_TIMEOUT" ] && die "idleconn: not ready after ${t}s (see $OUT/$log.log)"
    done
    open=$(sed -n 's/^ready open=\([0-9]*\).*/\1/p' "$OUT/$log.log")
    sleep "$SETTLE"
    read -r pa ra ka <<< "$(mem "$SYS_PID")"
    case $sys in sluice*) read -r ha ga <<< "$(gostats)" ;; esac
    stop "$c"
    res "$sys" "$leg" "$n" open "$open"
    res "$sys" "$leg" "$n" open_secs "$(sed -n 's/^ready .*secs=\([0-9.]*\).*/\1/p' "$OUT/$log.log")"
    res "$sys" "$leg" "$n" closed_by_peer "$(sed -n 's/^done .*closed_by_peer=\([0-9]*\).*/\1/p' "$OUT/$log.log" | grep . || echo '?')"
    res "$sys" "$leg" "$n" spoke "$(sed -n 's/^done .*spoke=\([0-9]*\).*/\1/p' "$OUT/$log.log" | grep . || echo '?')"
    res "$sys" "$leg" "$n" processes "$ka"
    res "$sys" "$leg" "$n" pss_kb "$pb $pa"
    res "$sys" "$leg" "$n" rss_kb "$rb $ra"
    per() { awk -v a="$1" -v b="$2" -v n="${open:-0}" -v k="$3" 'BEGIN { if (n > 0) printf "%.0f", (a - b) * k / n; else print "n/a" }'; }
    res "$sys" "$leg" "$n" bytes_pss "$(per "$pa" "$pb" 1024)"
    res "$sys" "$leg" "$n" bytes_rss "$(per "$ra" "$rb" 1024)"
    case $sys in sluice*)
        res "$sys" "$leg" "$n" heap_inuse "$hb $ha"
        res "$sys" "$leg" "$n" bytes_heap "$(per "$ha" "$hb" 1)"
        res "$sys" "$leg" "$n" goroutines "$gb $ga" ;;
    esac
}

skip() { res "$1" "$2" "$3" skipped "descriptor limit $FDS (ulimit -Hn) too low"; }

for leg in $LEGS; do
    case $leg in
    http|https)
        ns=$HTTP_NS; [ "$leg" = https ] && ns=$HTTPS_NS
        for sys in $HTTP_SYSTEMS; do
            for n in $ns; do
                fits "$sys" "$n" || { skip "$sys" "$leg" "$n"; continue; }
                log "== $leg $sys N=$n"
                start_http "$sys"
                port=$SYS_HTTP; [ "$leg" = https ] && port=$SYS_HTTPS
                point "$leg" "$sys" "$n" "$leg" "$port"
                stop "$SYS_PID"
            done
        done ;;
    sip|sip-tls)
        name=sip-tcp proto=sip; [ "$leg" = sip-tls ] && name=sip-tls proto=sips
        for sys in $SIP_SYSTEMS; do
            for n in $SIP_NS; do
                fits "$sys" "$n" || { skip "$sys" "$name" "$n"; continue; }
                log "== $name $sys N=$n"
                start_sip "$sys"
                port=$SYS_SIP; [ "$leg" = sip-tls ] && port=$SYS_SIPS
                point "$name" "$sys" "$n" "$proto" "$port"
                stop "$SYS_PID"
            done
        done ;;
    esac
done

# ---------------------------------------------------------------- table
get() { awk -F'\t' -v s="$1" -v l="$2" -v n="$3" -v m="$4" '$1 == s && $2 == l && $3 == n && $4 == m { v = $5 } END { print (v == "" ? "-" : v) }' "$RES"; }
awk -F'\t' '$4 == "bytes_pss" && $5 != "n/a" { print $2 "/" $1 "\t" $3 "\t" $5 }' "$RES" > "$OUT/idle-mem.tsv"
echo
echo "Idle connections, $(date -u +%Y-%m-%d), $(nproc) cores, descriptor limit $FDS, $(nginx -v 2>&1 | sed 's/.*: //'), $(haproxy -v 2>/dev/null | head -1 | awk '{ print "HAProxy " $3 }'), $(command -v kamailio >/dev/null && kamailio -v | head -1 | awk '{ print $2, $3 }'), $(go version | awk '{ print $3 }'), GOMAXPROCS=$GMP"
echo
echo "| leg | system | N (open) | bytes per idle connection, PSS | RSS | PSS before → after (kB) | processes | sluice: Go heap in use per connection | goroutines before → after |"
echo "|---|---|---|---|---|---|---|---|---|"
awk -F'\t' '{ print $2 "\t" $1 "\t" $3 }' "$RES" | awk '!seen[$0]++' | while IFS=$'\t' read -r leg sys n; do
    sk=$(get "$sys" "$leg" "$n" skipped)
    if [ "$sk" != - ]; then echo "| $leg | $sys | $n | skipped: $sk | | | | | |"; continue; fi
    closed=$(get "$sys" "$leg" "$n" closed_by_peer); spoke=$(get "$sys" "$leg" "$n" spoke); note=""
    [ "$closed" = 0 ] && [ "$spoke" = 0 ] || note=" (INVALID: $closed closed by the server, $spoke written to)"
    echo "| $leg | $sys | $n ($(get "$sys" "$leg" "$n" open)) | **$(get "$sys" "$leg" "$n" bytes_pss)**$note | $(get "$sys" "$leg" "$n" bytes_rss) | $(get "$sys" "$leg" "$n" pss_kb | sed 's/ / → /') | $(get "$sys" "$leg" "$n" processes) | $(get "$sys" "$leg" "$n" bytes_heap) | $(get "$sys" "$leg" "$n" goroutines | sed 's/ / → /') |"
done
echo
log "results in $RES, logs in $OUT"
