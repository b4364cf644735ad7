"""Lua scripts of RedisQueue: each queue operation is one atomic script on the server.

KEYS (the same eight for every script, all in one hash slot):
  1-3  streams of rollout, validate, explore requests (consumer group `workers`)
  4    hash  request id -> 'open' | 'done' | 'cancelled' | 'dead:<dead-letter entry id>'
  5    hash  request id -> '<kind>|<stream entry id>|<iteration>' for open requests only
  6    hash  request id -> result key, for done requests
  7    stream of dead letters (fields id, body, attempts)
  8    hash  counters ('cancelled')

Leases of any length on one XAUTOCLAIM threshold: every entry a worker holds gets its idle
time set to HORIZON - lease (XCLAIM ... IDLE, JUSTID so the delivery count is unchanged),
so `XAUTOCLAIM min-idle = HORIZON` finds exactly the entries whose lease ran out. A
heartbeat sets the idle time again; a release sets it to HORIZON (expired now).
"""

from __future__ import annotations

_COMMON = """
local GROUP = 'workers'
local function stream_of(kind)
  if kind == 'rollout' then return KEYS[1] elseif kind == 'validate' then return KEYS[2] end
  return KEYS[3]
end
local function parse_open(value)
  return string.match(value, '^([^|]+)|([^|]+)|(%d+)$')
end
local function field(fields, name)
  for i = 1, #fields, 2 do if fields[i] == name then return fields[i + 1] end end
end
local function pel_row(stream, entry)  -- {entry id, consumer, idle ms, deliveries} or nil
  local rows = redis.call('XPENDING', stream, GROUP, entry, entry, 1)
  return rows[1]
end
local function drop_entry(stream, entry)
  redis.call('XACK', stream, GROUP, entry)
  redis.call('XDEL', stream, entry)
end
"""

PUT = _COMMON + """
-- ARGV: groups of (request id, kind, iteration, body)
local added = 0
for i = 1, #ARGV, 4 do
  local id, kind = ARGV[i], ARGV[i + 1]
  if redis.call('HSETNX', KEYS[4], id, 'open') == 1 then
    local entry = redis.call('XADD', stream_of(kind), '*', 'id', id, 'body', ARGV[i + 3])
    redis.call('HSET', KEYS[5], id, kind .. '|' .. entry .. '|' .. ARGV[i + 2])
    added = added + 1
  end
end
return added
"""

CLAIM = _COMMON + """
-- ARGV: consumer, lease ms, horizon ms, max deliveries -> {entry id, body, deliveries} or nil
local consumer, lease_ms = ARGV[1], tonumber(ARGV[2])
local horizon, max_deliveries = tonumber(ARGV[3]), tonumber(ARGV[4])
local function hold(stream, entry)
  redis.call('XCLAIM', stream, GROUP, consumer, 0, entry, 'IDLE', horizon - lease_ms, 'JUSTID')
end
local function bury(stream, entry, fields, attempts)
  local id = field(fields, 'id')
  drop_entry(stream, entry)
  local dead = redis.call('XADD', KEYS[7], '*', 'id', id, 'body', field(fields, 'body'), 'attempts', attempts)
  redis.call('HSET', KEYS[4], id, 'dead:' .. dead)
  redis.call('HDEL', KEYS[5], id)
end
for s = 1, 3 do
  local stream = KEYS[s]
  -- Expired leases first: they are older than any new entry of the same priority.
  local cursor = '0-0'
  repeat
    local found = redis.call('XAUTOCLAIM', stream, GROUP, consumer, horizon, cursor, 'COUNT', 1)
    cursor = found[1]
    for _, e in ipairs(found[2]) do
      if type(e) == 'table' and type(e[2]) == 'table' then
        local deliveries = pel_row(stream, e[1])[4]  -- XAUTOCLAIM counted this delivery already
        if deliveries > max_deliveries then
          bury(stream, e[1], e[2], deliveries - 1)
        else
          hold(stream, e[1])
          return {e[1], field(e[2], 'body'), deliveries}
        end
      end
    end
  until cursor == '0-0'
  local fresh = redis.call('XREADGROUP', 'GROUP', GROUP, consumer, 'COUNT', 1, 'STREAMS', stream, '>')
  if fresh then
    local e = fresh[1][2][1]
    hold(stream, e[1])
    return {e[1], field(e[2], 'body'), 1}
  end
end
return nil
"""

EXTEND = _COMMON + """
-- ARGV: kind, entry id, consumer, deliveries of the lease, lease ms, horizon ms -> 1 if still ours
local stream = stream_of(ARGV[1])
local row = pel_row(stream, ARGV[2])
if not row or row[2] ~= ARGV[3] or row[4] ~= tonumber(ARGV[4]) then return 0 end
redis.call('XCLAIM', stream, GROUP, ARGV[3], 0, ARGV[2], 'IDLE', tonumber(ARGV[6]) - tonumber(ARGV[5]), 'JUSTID')
return 1
"""

ACK = _COMMON + """
-- ARGV: request id, result key -> 1 if this call completed the request
local id = ARGV[1]
local state = redis.call('HGET', KEYS[4], id)
if not state or state == 'done' or state == 'cancelled' then return 0 end
if state == 'open' then
  local kind, entry = parse_open(redis.call('HGET', KEYS[5], id))
  drop_entry(stream_of(kind), entry)
  redis.call('HDEL', KEYS[5], id)
else
  redis.call('XDEL', KEYS[7], string.sub(state, 6))  -- 'dead:<entry>': a late result still counts
end
redis.call('HSET', KEYS[4], id, 'done')
redis.call('HSET', KEYS[6], id, ARGV[2])
return 1
"""

CANCEL = _COMMON + """
-- ARGV: iteration, kind or '' -> number cancelled
local n = 0
local open = redis.call('HGETALL', KEYS[5])
for i = 1, #open, 2 do
  local kind, entry, iteration = parse_open(open[i + 1])
  if iteration == ARGV[1] and (ARGV[2] == '' or ARGV[2] == kind) then
    drop_entry(stream_of(kind), entry)
    redis.call('HDEL', KEYS[5], open[i])
    redis.call('HSET', KEYS[4], open[i], 'cancelled')
    n = n + 1
  end
end
redis.call('HINCRBY', KEYS[8], 'cancelled', n)
return n
"""

STATS = _COMMON + """
-- ARGV: horizon ms -> {pending, leased, done, dead, cancelled}
local held, expired = 0, 0
for s = 1, 3 do
  local summary = redis.call('XPENDING', KEYS[s], GROUP)
  if summary[1] > 0 then
    held = held + summary[1]
    expired = expired + #redis.call('XPENDING', KEYS[s], GROUP, 'IDLE', ARGV[1], '-', '+', summary[1])
  end
end
local leased = held - expired
local cancelled = tonumber(redis.call('HGET', KEYS[8], 'cancelled') or '0')
return {redis.call('HLEN', KEYS[5]) - leased, leased, redis.call('HLEN', KEYS[6]), redis.call('XLEN', KEYS[7]), cancelled}
"""

STATES = _COMMON + """
-- ARGV: horizon ms, request ids... -> one state per id
local horizon = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local state = redis.call('HGET', KEYS[4], ARGV[i])
  if not state then
    state = 'unknown'
  elseif state == 'open' then
    local kind, entry = parse_open(redis.call('HGET', KEYS[5], ARGV[i]))
    local row = pel_row(stream_of(kind), entry)
    if row and row[3] < horizon then state = 'leased' else state = 'pending' end
  elseif string.sub(state, 1, 5) == 'dead:' then
    state = 'dead'
  end
  out[#out + 1] = state
end
return out
"""
