package cluster

import "github.com/redis/go-redis/v9"

// leaseScript grants a slice of a rule's budget over the sliding window of
// six sub-intervals. KEYS[1] is the rule's hash (field: sub-interval number
// by Redis TIME; value: tokens counted in it), KEYS[2] its "lost" marker
// (same hash tag). ARGV: limit, want,
// sub-interval in µs, node count, sub-interval of a return, tokens returned,
// tokens to count without a limit check (seed, after a rejoin), and the
// calling node's own counts of the window as "K:N,K:N" (optional).
//
// A sub-interval never holds fewer tokens than the caller alone counted in
// it (granted, less what it gave back): a lower count was lost (FLUSHALL,
// DEL, a lowered field) and is raised back to the caller's own, before
// anything is granted; what was restored is in the reply. Each node so
// restores its own counts at its next lease, and for a window after a loss
// (while KEYS[2], the rule's "lost" key, exists; it lives at most a
// window) every node keeps to its share, limit ÷ nodes, of the window, as
// under the fail policy "local": the others' counts may still be missing.
//
// Redis is not trusted to hold only what this script wrote (see the
// package README, "Trust"): a field counts only when its name is a
// sub-interval number, written as this script writes it, not after the
// current one, and its value a whole number of tokens from 0 to 2^53. Any
// other field (not a number, negative, fractional, NaN, a sub-interval in
// the future) is deleted and counted in the reply, so a forged field can
// neither lend the cluster budget nor break the script.
//
// A key of another type is deleted (and counted). It sums the live
// sub-intervals (deleting expired and invalid fields),
// subtracts the return (only from a sub-interval still in the window, never
// below zero), and grants g = min(want, max(1, free ÷ (2 × nodes))) when
// free > 0, counting g in the current sub-interval. Reply: g, the window's
// sum after the grant, the current sub-interval, µs until it ends, µs until
// the oldest counted sub-interval leaves the window (a Retry-After hint),
// the number of invalid fields deleted, and the tokens restored.
var leaseScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit, want, sub = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local nodes, rk, rn, seed = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local k = math.floor(now / sub)
local cur = string.format('%d', k)
local function whole(s)
  local v = tonumber(s)
  if v == nil or v ~= v or v < 0 or v > 9007199254740992 or v ~= math.floor(v) or string.format('%d', v) ~= s then
    return nil
  end
  return v
end
local sum, oldest, bad = 0, k, 0
local ty = redis.call('TYPE', KEYS[1])
ty = ty.ok or ty
if ty ~= 'hash' and ty ~= 'none' then
  redis.call('DEL', KEYS[1])
  bad = 1
end
local vals = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #vals, 2 do
  local f, v = whole(vals[i]), whole(vals[i + 1])
  if f == nil or v == nil or f > k then
    redis.call('HDEL', KEYS[1], vals[i])
    bad = bad + 1
  elseif f <= k - 6 then
    redis.call('HDEL', KEYS[1], vals[i])
  else
    live[f] = v
    sum = sum + v
  end
end
local restored, mine = 0, 0
for kk, nn in string.gmatch(ARGV[8] or '', '(%d+):(%d+)') do
  local f, n = tonumber(kk), tonumber(nn)
  if f > k - 6 and f <= k then
    mine = mine + n
    if n > (live[f] or 0) then
      restored = restored + n - (live[f] or 0)
      sum = sum + n - (live[f] or 0)
      live[f] = n
      redis.call('HSET', KEYS[1], string.format('%d', f), string.format('%d', n))
    end
  end
end
local window = math.floor(sub * 6 / 1000) + 1
if restored > 0 then
  redis.call('DEL', KEYS[2])
  redis.call('SET', KEYS[2], '1', 'PX', window)
end
local lost = redis.call('EXISTS', KEYS[2]) == 1
if lost and redis.call('PTTL', KEYS[2]) > window then
  redis.call('PEXPIRE', KEYS[2], window)
  bad = bad + 1
end
if rn > 0 and rk > k - 6 and rk <= k and (live[rk] or 0) > 0 then
  local r = math.min(live[rk], rn)
  redis.call('HINCRBY', KEYS[1], string.format('%d', rk), -r)
  live[rk] = live[rk] - r
  sum = sum - r
  mine = mine - r
end
for f, v in pairs(live) do
  if v > 0 and f < oldest then oldest = f end
end
if seed > 0 then
  redis.call('HINCRBY', KEYS[1], cur, seed)
  sum = sum + seed
end
local g = 0
local free = limit - sum
if free > 0 and want > 0 then
  local cap = math.floor(free / (2 * nodes))
  if cap < 1 then cap = 1 end
  g = math.min(want, cap)
  if lost then
    -- Counts were lost within the window: the other nodes' may still be
    -- missing, so this node keeps to its share of the limit.
    g = math.max(0, math.min(g, math.floor(limit / nodes) - mine - seed))
  end
  if g > 0 then redis.call('HINCRBY', KEYS[1], cur, g) end
end
redis.call('PEXPIRE', KEYS[1], math.floor(sub * 7 / 1000) + 1000)
return {g, sum + g, k, (k + 1) * sub - now, (oldest + 6) * sub - now, bad, restored}
`)

// heartbeatScript records a node as alive until now + ttl in the members'
// sorted set (KEYS[1]), drops expired members and returns how many are
// alive. ARGV: node id, ttl in ms, 1 to leave instead, the longest ttl
// any node may give (ms). A key of another type is deleted, and members
// alive further ahead than the longest ttl, which no node wrote, are
// dropped. Reply: members alive, and how many invalid ones were dropped.
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local bad = 0
local ty = redis.call('TYPE', KEYS[1])
ty = ty.ok or ty
if ty ~= 'zset' and ty ~= 'none' then
  redis.call('DEL', KEYS[1])
  bad = 1
end
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
bad = bad + redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', now + tonumber(ARGV[4])), '+inf')
redis.call('PEXPIRE', KEYS[1], ttl * 10)
return {redis.call('ZCARD', KEYS[1]), bad}
`)

// mopSyncScript adds a node's admitted and refused new work for one backend
// to the cluster's totals, renews or takes the backend's learner lock, and
// stores the learner's state when the caller holds the lock. KEYS[1] is the
// backend's hash. ARGV: node id, lock ttl in ms, admitted delta, refused
// delta, state (JSON; "" to leave it), the longest a lock may last in ms,
// the largest state in bytes, and the expiry of the lock the caller last
// held (0: none). The lock is a field with an expiry time by Redis TIME,
// so a dead holder's lock is taken over once it expires; a lock the caller
// holds that another name took before it expired (no node does that) is
// taken back.
//
// What it reads is checked, as any Redis client may have written it: a key
// of another type is deleted; a total that is not a whole count from 0 to
// 2^53 restarts from 0; a lock whose expiry is not a number or lies further
// ahead than a lock can last, or whose holder is empty or longer than 256
// bytes, is taken over; a state larger than the largest is deleted without being
// read (HSTRLEN). Reply: admitted total, refused total, lock holder,
// state, how many totals, locks and states were found invalid, and the
// lock's expiry.
var mopSyncScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local maxlock, maxstate = tonumber(ARGV[6]), tonumber(ARGV[7])
local badc, badl, bads = 0, 0, 0
local ty = redis.call('TYPE', KEYS[1])
ty = ty.ok or ty
if ty ~= 'hash' and ty ~= 'none' then
  redis.call('DEL', KEYS[1])
  badc = badc + 1
end
local function add(f, d)
  local s = redis.call('HGET', KEYS[1], f)
  if s then
    local v = tonumber(s)
    if v == nil or v ~= v or v < 0 or v > 9007199254740992 - math.abs(d) or v ~= math.floor(v) or string.format('%d', v) ~= s then
      redis.call('HSET', KEYS[1], f, 0)
      badc = badc + 1
    end
  end
  return redis.call('HINCRBY', KEYS[1], f, d)
end
local a = add('admitted', tonumber(ARGV[3]))
local r = add('refused', tonumber(ARGV[4]))
local holder = redis.call('HGET', KEYS[1], 'learner')
local untl = tonumber(redis.call('HGET', KEYS[1], 'learner_until') or '0')
if untl == nil or untl ~= untl or untl > now + maxlock or holder == '' or (holder and redis.call('HSTRLEN', KEYS[1], 'learner') > 256) then
  untl = 0
  badl = 1
end
local mine = tonumber(ARGV[8] or '0') or 0
if holder ~= ARGV[1] and mine > now and mine <= now + maxlock then
  untl = 0
  badl = 1
end
if holder == ARGV[1] or not holder or untl < now then
  holder = ARGV[1]
  untl = now + tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'learner', holder, 'learner_until', untl)
end
if holder == ARGV[1] and ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'state', ARGV[5])
end
local st = ''
if redis.call('HSTRLEN', KEYS[1], 'state') > maxstate then
  redis.call('HDEL', KEYS[1], 'state')
  bads = 1
else
  st = redis.call('HGET', KEYS[1], 'state') or ''
end
redis.call('PEXPIRE', KEYS[1], 7 * 24 * 3600 * 1000)
return {a, r, holder, st, badc, badl, bads, untl}
`)
