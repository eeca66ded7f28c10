package redislimit

import "github.com/redis/go-redis/v9"

// Each host is one Redis hash, KEYS[1] = prefix + host, with two fields:
//
//	t  the GCRA theoretical arrival time: the moment, in microseconds of
//	   the Redis server's clock, at which the host's bucket is full again
//	p  the moment, same clock, until which the host is parked
//
// One key per host keeps both scripts on one slot in Redis Cluster. The key
// expires when the bucket is full again and the parking is over: such a host
// is indistinguishable from one never seen, so idle hosts vanish.
//
// Both scripts read the clock with TIME inside the script, so every process
// is measured against one clock, the server's: a process whose clock is off
// by a second neither takes slots early nor parks hosts for longer. What
// crosses the wire is durations (the wait until a slot, the rest of a
// parking), which each process applies to its own clock. Scripts that call
// TIME and then write are replicated by their effects; Redis 5 and later do
// that by default, and redis.replicate_commands asks for it on 3.2 and 4.
//
// Lua numbers are doubles: microseconds since 1970 (about 1.8e15) are exact
// in them, and string.format('%d') writes them back without the %.14g
// rounding that Redis applies to a bare number.

// reserveScript takes one slot for a host, unless it is parked or the slot
// would come too late.
//
//	ARGV[1]  the interval between slots in microseconds; 0: no pace, only
//	         the parking is checked and nothing is written
//	ARGV[2]  the burst
//	ARGV[3]  the longest wait accepted, in microseconds; empty: no bound
//	ARGV[4]  how far ahead, in microseconds, the caller's in-process
//	         pacer has handed out slots while Redis was away: the bucket
//	         is taken to be at least that full; empty: nothing to add
//
// It returns {0, wait, tat} when a slot was taken wait microseconds from
// now, tat being the bucket's state after it (for cancelScript), {1, wait}
// when the slot would come after the bound (nothing taken), and {2, rest}
// when the host is parked for rest more microseconds (nothing taken).
const reserveLua = `
if redis.replicate_commands then pcall(redis.replicate_commands) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local st = redis.call('HMGET', KEYS[1], 't', 'p')
local parked = tonumber(st[2])
if parked and parked > now then
  return {2, parked - now}
end
local interval = tonumber(ARGV[1])
if interval <= 0 then
  return {0, 0, 0}
end
local burst = tonumber(ARGV[2])
local bound = tonumber(ARGV[3])
local tat = tonumber(st[1])
if not tat or tat < now then
  tat = now
end
local ahead = tonumber(ARGV[4])
if ahead and tat < now + ahead then
  tat = now + ahead
end
local wait = tat - (burst - 1) * interval - now
if wait < 0 then
  wait = 0
end
if bound and wait > bound then
  return {1, wait}
end
tat = tat + interval
redis.call('HSET', KEYS[1], 't', string.format('%d', tat))
redis.call('PEXPIRE', KEYS[1], math.floor((tat - now) / 1000) + 1)
return {0, wait, tat}
`

// cancelScript gives back a slot that reserveScript took, when no slot was
// taken after it: the bucket is then exactly as that reservation left it,
// ARGV[1], and goes back by one interval, ARGV[2]. A slot with others
// behind it stays taken: giving it back would let the next caller in before
// them. It returns {1} when the slot was given back, else {0}.
const cancelLua = `
local tat = tonumber(redis.call('HGET', KEYS[1], 't'))
if tat and tat == tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 't', string.format('%d', tat - tonumber(ARGV[2])))
  return {1}
end
return {0}
`

// parkScript parks a host for ARGV[1] more microseconds, unless it is
// already parked at least that long. It returns {1} when it extended the
// parking and {0} when an existing one already covered it.
const parkLua = `
if redis.replicate_commands then pcall(redis.replicate_commands) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local untilp = now + tonumber(ARGV[1])
local st = redis.call('HMGET', KEYS[1], 't', 'p')
local cur = tonumber(st[2])
if cur and cur >= untilp then
  return {0}
end
redis.call('HSET', KEYS[1], 'p', string.format('%d', untilp))
local last = untilp
local tat = tonumber(st[1])
if tat and tat > last then
  last = tat
end
redis.call('PEXPIRE', KEYS[1], math.floor((last - now) / 1000) + 1)
return {1}
`

var (
	reserveScript = redis.NewScript(reserveLua)
	parkScript    = redis.NewScript(parkLua)
	cancelScript  = redis.NewScript(cancelLua)
)

// Script results, the first element of reserveScript's answer.
const (
	codeTaken  = 0
	codeLate   = 1
	codeParked = 2
)
