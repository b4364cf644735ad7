"""The Redis Functions library of RedisQueue: each queue operation is one atomic function on the server.

The coordinator loads LIBRARY (`FUNCTION LOAD REPLACE`, an admin command); every client then calls the
functions by name (`FCALL spotlight_claim 13 KEYS... ARGS...`). No client sends Lua of its own: a worker's
ACL user may FCALL the worker's functions and nothing else that runs code (resources/queue/redis_acl.py), and
Redis checks every command a function runs against the caller's ACL, so a function is no way around it.

KEYS (the same thirteen for every function, all in one hash slot; `queue_keys` lists them):
  1-3   streams of rollout, validate, explore requests (consumer group `workers`)
  4     hash  request id -> 'open' | 'done' | 'cancelled' | 'dead:<dead-letter entry id>'
  5     hash  request id -> '<kind>|<stream entry id>|<iteration>' for open requests only
  6     hash  request id -> result key, for done requests
  7     stream of dead letters (fields id, body, attempts, iteration)
  8     hash  counters ('cancelled')
  9-11  sorted sets of the leases of each kind: request id, scored by the lease's end (server ms)
  12    hash  request id -> token of the ack that completed it (a retried ack is recognised)
  13    sorted set of done request ids, scored by iteration (what `purge_finished` forgets)

One clock judges every lease: the server's (`TIME` inside the scripts), so worker clocks
may disagree by any amount. The stream's pending list keeps who holds an entry and its
delivery count; the lease sets say when each lease ends. A claim takes the lease that ran
out first (one sorted-set lookup), else the next new entry (XREADGROUP `>`), highest
priority first: its cost does not grow with the queue or the number of leases out. A
heartbeat moves the lease's end; a release sets it to now (claimable at once).
"""

from __future__ import annotations

from resources.queue.records import KINDS_BY_PRIORITY as KINDS

_COMMON = """
local GROUP = 'workers'
local function index_of(kind)
  if kind == 'rollout' then return 1 elseif kind == 'validate' then return 2 end
  return 3
end
local function stream_of(kind) return KEYS[index_of(kind)] end
local function leases_of(kind) return KEYS[8 + index_of(kind)] end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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

PUT = """
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

CLAIM = """
-- ARGV: consumer, lease ms, max deliveries -> {entry id, body, deliveries} or nil
local consumer, lease_ms, max_deliveries = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local function bury(s, id, entry, fields, attempts, iteration)
  drop_entry(KEYS[s], entry)
  redis.call('ZREM', KEYS[8 + s], id)
  local dead = redis.call('XADD', KEYS[7], '*', 'id', id, 'body', field(fields, 'body'), 'attempts', attempts,
                          'iteration', iteration)
  redis.call('HSET', KEYS[4], id, 'dead:' .. dead)
  redis.call('HDEL', KEYS[5], id)
end
for s = 1, 3 do
  local stream, leases = KEYS[s], KEYS[8 + s]
  -- Expired leases first (the one that ran out first): they are older than any new entry of the same priority.
  while true do
    local due = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, 1)[1]
    if not due then break end
    local open = redis.call('HGET', KEYS[5], due)
    local claimed = {}
    local kind, entry, iteration
    if open then
      kind, entry, iteration = parse_open(open)
      claimed = redis.call('XCLAIM', stream, GROUP, consumer, 0, entry)  -- counts one more delivery
    end
    local e = claimed[1]
    if type(e) ~= 'table' or type(e[2]) ~= 'table' then
      redis.call('ZREM', leases, due)  -- no longer open: nothing to hand out
    else
      local deliveries = pel_row(stream, entry)[4]
      if deliveries > max_deliveries then
        bury(s, due, entry, e[2], deliveries - 1, iteration)
      else
        redis.call('ZADD', leases, now + lease_ms, due)
        return {entry, field(e[2], 'body'), deliveries}
      end
    end
  end
  local fresh = redis.call('XREADGROUP', 'GROUP', GROUP, consumer, 'COUNT', 1, 'STREAMS', stream, '>')
  if fresh then
    local e = fresh[1][2][1]
    redis.call('ZADD', leases, now + lease_ms, field(e[2], 'id'))
    return {e[1], field(e[2], 'body'), 1}
  end
end
return nil
"""

EXTEND = """
-- ARGV: kind, entry id, consumer, deliveries of the lease, lease ms, request id -> 1 if still ours
local stream = stream_of(ARGV[1])
local row = pel_row(stream, ARGV[2])
if not row or row[2] ~= ARGV[3] or row[4] ~= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', leases_of(ARGV[1]), now_ms() + tonumber(ARGV[5]), ARGV[6])
return 1
"""

ACK = """
-- ARGV: request id, result key, this call's token -> 1 if this call (perhaps retried) completed it
local id = ARGV[1]
local state = redis.call('HGET', KEYS[4], id)
if state == 'done' then
  if ARGV[3] ~= '' and redis.call('HGET', KEYS[12], id) == ARGV[3] then return 1 end  -- our ack, sent again
  return 0
end
if not state or state == 'cancelled' then return 0 end
local iteration
if state == 'open' then
  local kind, entry, it = parse_open(redis.call('HGET', KEYS[5], id))
  drop_entry(stream_of(kind), entry)
  redis.call('ZREM', leases_of(kind), id)
  redis.call('HDEL', KEYS[5], id)
  iteration = it
else
  local dead = string.sub(state, 6)  -- 'dead:<entry>': a late result still counts
  local rows = redis.call('XRANGE', KEYS[7], dead, dead)
  iteration = rows[1] and field(rows[1][2], 'iteration') or '0'
  redis.call('XDEL', KEYS[7], dead)
end
redis.call('HSET', KEYS[4], id, 'done')
redis.call('HSET', KEYS[6], id, ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[12], id, ARGV[3]) end
redis.call('ZADD', KEYS[13], tonumber(iteration), id)
return 1
"""

CANCEL = """
-- ARGV: iteration, kind or '' -> number cancelled
local n = 0
local open = redis.call('HGETALL', KEYS[5])
for i = 1, #open, 2 do
  local kind, entry, iteration = parse_open(open[i + 1])
  if iteration == ARGV[1] and (ARGV[2] == '' or ARGV[2] == kind) then
    drop_entry(stream_of(kind), entry)
    redis.call('ZREM', leases_of(kind), open[i])
    redis.call('HDEL', KEYS[5], open[i])
    redis.call('HSET', KEYS[4], open[i], 'cancelled')
    n = n + 1
  end
end
redis.call('HINCRBY', KEYS[8], 'cancelled', n)
return n
"""

STATS = """
-- ARGV: none -> {pending, leased, done, dead, cancelled}
local now = now_ms()
local leased = 0
for s = 1, 3 do leased = leased + redis.call('ZCOUNT', KEYS[8 + s], '(' .. now, '+inf') end
local cancelled = tonumber(redis.call('HGET', KEYS[8], 'cancelled') or '0')
return {redis.call('HLEN', KEYS[5]) - leased, leased, redis.call('HLEN', KEYS[6]), redis.call('XLEN', KEYS[7]),
        cancelled}
"""

STATES = """
-- ARGV: request ids... -> one state per id
local now = now_ms()
local out = {}
for i = 1, #ARGV do
  local state = redis.call('HGET', KEYS[4], ARGV[i])
  if not state then
    state = 'unknown'
  elseif state == 'open' then
    local kind = parse_open(redis.call('HGET', KEYS[5], ARGV[i]))
    local ends = redis.call('ZSCORE', leases_of(kind), ARGV[i])
    if ends and tonumber(ends) > now then state = 'leased' else state = 'pending' end
  elseif string.sub(state, 1, 5) == 'dead:' then
    state = 'dead'
  end
  out[#out + 1] = state
end
return out
"""

PURGE = """
-- ARGV: before iteration, at most this many -> how many done requests were forgotten
local ids = redis.call('ZRANGEBYSCORE', KEYS[13], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('HDEL', KEYS[4], id)
  redis.call('HDEL', KEYS[6], id)
  redis.call('HDEL', KEYS[12], id)
  redis.call('ZREM', KEYS[13], id)
end
return #ids
"""

ADOPT = """
-- Leases held by a version of this queue without lease sets (idle-time leases): give each a lease
-- set entry that has run out, so a claim can hand the request out again. -> how many adopted
local n = 0
for s = 1, 3 do
  local rows = redis.call('XPENDING', KEYS[s], GROUP, '-', '+', 10000)
  for _, row in ipairs(rows) do
    local entry = redis.call('XRANGE', KEYS[s], row[1], row[1])[1]
    local id = entry and field(entry[2], 'id')
    if id and redis.call('ZSCORE', KEYS[8 + s], id) == false then
      redis.call('ZADD', KEYS[8 + s], 0, id)
      n = n + 1
    end
  end
end
return n
"""

_BODIES = {
    "put": PUT,
    "claim": CLAIM,
    "extend": EXTEND,
    "ack": ACK,
    "cancel": CANCEL,
    "stats": STATS,
    "states": STATES,
    "purge": PURGE,
    "adopt": ADOPT,
}
READ_ONLY = ("stats", "states", "version")
"""Functions that write nothing (flag `no-writes`: FCALL_RO may call them, on a replica too)."""
PREFIX = "spotlight:{queue}"
"""Every key of the queue starts so; one hash tag, so all keys share one slot (the functions run on a cluster too)."""


def queue_keys() -> list[str]:
    """The thirteen KEYS every function takes, in the order the module docstring lists them."""
    return (
        [f"{PREFIX}:stream:{kind}" for kind in KINDS]
        + [f"{PREFIX}:{name}" for name in ("state", "open", "results", "dead", "counts")]
        + [f"{PREFIX}:leases:{kind}" for kind in KINDS]
        + [f"{PREFIX}:{name}" for name in ("acks", "done")]
    )


def function_name(op: str) -> str:
    """The server-side name of a queue operation's function ('claim' -> 'spotlight_claim')."""
    return f"spotlight_{op}"


def _library() -> tuple[str, str]:
    """(the library's code, its version: a hash of that code) for FUNCTION LOAD."""
    import hashlib

    # The functions run one at a time (Redis is single-threaded), so each call sets the library's KEYS and ARGV
    # upvalues that the bodies and _COMMON's helpers read, as EVAL's globals were.
    code = "local KEYS, ARGV\n" + _COMMON
    for op, body in _BODIES.items():
        code += f"local function {op}_body()\n{body}\nend\n"
    version = hashlib.sha256(code.encode()).hexdigest()[:16]
    code += f"local function version_body() return '{version}' end\n"
    for op in (*_BODIES, "version"):
        flags = "{'no-writes'}" if op in READ_ONLY else "{}"
        code += (
            f"redis.register_function{{function_name='{function_name(op)}', flags={flags}, "
            f"callback=function(keys, args) KEYS, ARGV = keys, args; return {op}_body() end}}\n"
        )
    return "#!lua name=spotlight_queue\n" + code, version


LIBRARY, VERSION = _library()
"""The library the coordinator loads, and its version (what `spotlight_version` answers)."""
