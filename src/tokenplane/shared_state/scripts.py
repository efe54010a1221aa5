"""The Lua scripts the Redis backend runs: each is one atomic step, so two replicas never race.

Time is Redis's own (``TIME``), so the replicas' clocks need not agree. A rate limit's window is one
hash per key: a field per slot, its running total ``t`` and its latest slot ``l``, rolled forward
exactly as :class:`~tokenplane.shared_state.quotas.SlidingWindow` does (a single Redis, not a
cluster: every key of one tenant would need one hash slot there).

ACQUIRE   KEYS: lease set, tenant rpm, tenant tpm, key rpm, key tpm (bases)
          ARGV: concurrency limit, lease ttl s, rpm, tpm, key rpm, key tpm, window s, member, tokens
          (what changes per request last, so the rest is encoded once per tenant and key)
          -> {code, wait_ms}: code 0 admitted (charged: one request, ``tokens``, a lease), else the
          1-based index of the check that refused (concurrency, tenant rpm, tenant tpm, key rpm,
          key tpm) and the wait in ms until it would pass.
RELEASE   KEYS: lease set, tenant tpm, key tpm (bases; an empty name skips)
          ARGV: window s, member, completion tokens
RENEW     KEYS: lease sets; ARGV: ttl s, then one member per key: push each lease's expiry out.
"""

from __future__ import annotations

from tokenplane.shared_state.quotas import SLOTS

_WINDOW = (
    f"local SLOTS = {SLOTS}\n"
    + """
local function roll(key, cur)
  local h = redis.call('HMGET', key, 't', 'l')
  local total = tonumber(h[1]) or 0
  local last = tonumber(h[2])
  if last == nil or cur - last > SLOTS then
    if last ~= nil then redis.call('DEL', key) end
    return 0
  end
  if cur > last then
    for i = last - SLOTS, cur - SLOTS - 1 do
      local v = redis.call('HGET', key, i)
      if v then
        total = total - tonumber(v)
        redis.call('HDEL', key, i)
      end
    end
    redis.call('HSET', key, 't', total, 'l', cur)
  end
  return total
end
local function add(key, cur, inc, keep_ms)
  redis.call('HINCRBY', key, cur, inc)
  redis.call('HINCRBY', key, 't', inc)
  redis.call('HSETNX', key, 'l', cur)
  redis.call('PEXPIRE', key, keep_ms)
end
"""
)

ACQUIRE = (
    _WINDOW
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local climit = tonumber(ARGV[1])
if climit > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= climit then
    return {1, 1000}
  end
end
local w = tonumber(ARGV[7])
local slot = w / SLOTS
local cur = math.floor(now / slot)
local tokens = tonumber(ARGV[9])
for i = 2, 5 do
  local limit = tonumber(ARGV[i + 1])
  if limit > 0 then
    local used = roll(KEYS[i], cur)
    local rpm = (i == 2 or i == 4)
    if (rpm and used + 1 > limit) or ((not rpm) and used >= limit) then
      local need = used - limit + 1
      local freed = 0
      local wait = (cur + SLOTS + 1) * slot - now
      for j = cur - SLOTS, cur do
        freed = freed + (tonumber(redis.call('HGET', KEYS[i], j)) or 0)
        if freed >= need then
          wait = (j + SLOTS + 1) * slot - now
          break
        end
      end
      return {i, math.ceil(math.max(wait, 0) * 1000)}
    end
  end
end
local keep = math.ceil((w + 2 * slot) * 1000)
for i = 2, 5 do
  if tonumber(ARGV[i + 1]) > 0 then
    local inc = 1
    if i == 3 or i == 5 then inc = tokens end
    if inc > 0 then add(KEYS[i], cur, inc, keep) end
  end
end
if climit > 0 then
  local lease = tonumber(ARGV[2])
  redis.call('ZADD', KEYS[1], now + lease, ARGV[8])
  redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 2000))
end
return {0, 0}
"""
)

RELEASE = (
    _WINDOW
    + """
if KEYS[1] ~= '' then redis.call('ZREM', KEYS[1], ARGV[2]) end
local tokens = tonumber(ARGV[3])
if tokens > 0 then
  local t = redis.call('TIME')
  local w = tonumber(ARGV[1])
  local slot = w / SLOTS
  local cur = math.floor((tonumber(t[1]) + tonumber(t[2]) / 1000000) / slot)
  local keep = math.ceil((w + 2 * slot) * 1000)
  for i = 2, 3 do
    if KEYS[i] ~= '' then
      roll(KEYS[i], cur)
      add(KEYS[i], cur, tokens, keep)
    end
  end
end
return 0
"""
)

RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local lease = tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', now + lease, ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], math.ceil(lease * 2000))
end
return #KEYS
"""

SYNC = """
local t = redis.call('TIME')
local now = tonumber(t[1])
local me = ARGV[1]
local window = tonumber(ARGV[2])
local ttl = math.ceil((window + 2) * 1000)
local span = math.ceil(window)
local out = {}
for i = 1, #KEYS do
  local delta = tonumber(ARGV[i + 2])
  if delta ~= 0 then
    local k = KEYS[i] .. ':' .. now
    redis.call('HINCRBYFLOAT', k, me, delta)
    redis.call('PEXPIRE', k, ttl)
  end
  local others = 0
  for b = now - span + 1, now do
    local fields = redis.call('HGETALL', KEYS[i] .. ':' .. b)
    for j = 1, #fields, 2 do
      if fields[j] ~= me then others = others + tonumber(fields[j + 1]) end
    end
  end
  out[i] = tostring(others)
end
return out
"""
"""SYNC      KEYS: counter bases; ARGV: replica id, window s, then this replica's delta per key
          since its last sync -> per key, the other replicas' sum over the last ``window`` whole
          seconds (one hash per key and second, a field per replica)."""

WORKING_SET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV, 3 do
  local task = ARGV[i]
  local step = tonumber(ARGV[i + 1])
  local cur = redis.call('HGET', KEYS[1], task)
  if not cur or step >= tonumber(string.match(cur, '^(%-?%d+)')) then
    redis.call('HSET', KEYS[1], task, step .. ' ' .. ARGV[i + 2])
    redis.call('ZADD', KEYS[2], now + ttl, task)
  end
end
local idle = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, task in ipairs(idle) do redis.call('HDEL', KEYS[1], task) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local keep = math.ceil(ttl * 1000) + 1000
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
return redis.call('HGETALL', KEYS[1])
"""
"""WORKING_SET  KEYS: a model's tasks (hash of "step peak"), their expiries (sorted set)
             ARGV: idle ttl s, then (task, step, projected peak) triples this replica saw since
             its last sync (a negative peak: the task left at that step, kept as a tombstone) ->
             every task and tombstone (flat list), after dropping what no replica has seen for
             ``idle ttl`` (Redis's clock). A write older than the task's step is ignored: a
             step reported late by one replica does not bring back a task another saw end."""

IN_FLIGHT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[1])
local base = ARGV[2]
local me = ARGV[3]
redis.call('DEL', KEYS[2])
for i = 4, #ARGV, 3 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1] .. ' ' .. ARGV[i + 2])
end
redis.call('PEXPIRE', KEYS[2], math.ceil(ttl * 1000))
redis.call('ZADD', KEYS[1], now + ttl, me)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl * 1000) + 1000)
local sums = {}
local order = {}
for _, replica in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if replica ~= me then
    local flat = redis.call('HGETALL', base .. replica)
    for j = 1, #flat, 2 do
      local n, tok = string.match(flat[j + 1], '^(%d+) (%d+)$')
      local s = sums[flat[j]]
      if not s then
        s = {0, 0}
        sums[flat[j]] = s
        order[#order + 1] = flat[j]
      end
      s[1] = s[1] + tonumber(n)
      s[2] = s[2] + tonumber(tok)
    end
  end
end
local out = {}
for _, instance in ipairs(order) do
  out[#out + 1] = instance
  out[#out + 1] = sums[instance][1]
  out[#out + 1] = sums[instance][2]
end
return out
"""
"""IN_FLIGHT  KEYS: the live replicas (sorted set by expiry), this replica's snapshot (hash of
           "requests tokens" per instance)
           ARGV: ttl s, the snapshots' key base (``base .. replica id``: read by name, as a single
           Redis allows), this replica's id, then (instance, requests, tokens) triples of its
           in-flight work now -> the other live replicas' sums, flat (instance, requests, tokens).
           The snapshot replaces the last one (never a delta: nothing accumulates) and expires after
           ``ttl`` with the replica's entry in the set (Redis's clock), so a dead replica's share
           leaves the others' sums within ``ttl``."""
