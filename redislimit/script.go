package redislimit

import (
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
)

// Each host is one Redis hash, KEYS[1] = prefix + host. Its fields:
//
//	t    the GCRA theoretical arrival time: the moment, in microseconds of
//	     the Redis server's clock, at which the host's bucket is full again
//	p    the moment, same clock, until which the host is parked
//	gs, gc, gp
//	     slots granted, in two one-second bins (start, current, previous):
//	     what the host got in the last second, for learning
//	a:ID the last heartbeat of the process ID; hb the latest of them, and
//	     n how many processes were alive then
//	rt   while set and ahead: processes come back from an outage, and each
//	     paces its own share in process until then (see reserveLua)
//	r, an, q, ra, st, rf, hu, nr, bc, gr, b, lr, fs, fc, fp, w, sd
//	     the learned pace and what it was learned from: see learnLua
//
// One key per host keeps every script on one slot in Redis Cluster. The key
// expires when nothing in it matters any more: the bucket full, the parking
// over, no heartbeat alive, nothing learned. Such a host is
// indistinguishable from one never seen, so idle hosts vanish.
//
// Every script reads the clock with TIME inside the script, so every
// process is measured against one clock, the server's: a process whose
// clock is off by a second neither takes slots early nor parks hosts for
// longer. What crosses the wire is durations (the wait until a slot, the
// rest of a parking), which each process applies to its own clock. Scripts
// that call TIME and then write are replicated by their effects; Redis 5
// and later do that by default, and redis.replicate_commands asks for it on
// 3.2 and 4.
//
// Lua numbers are doubles: microseconds since 1970 (about 1.8e15) are exact
// in them, and num() writes them back without the %.14g rounding that Redis
// applies to a bare number. Redis turns a number a script returns into an
// integer by truncating it, so rates cross the wire in millionths.

// Constants of the scripts. The learning ones are those of the core's
// learn.go, which keeps them unexported: the shared learner follows the
// same rules.
const (
	// aliveFor is how long a process's heartbeat counts it among a host's
	// live processes; it beats at most once per heartbeatEvery per host.
	aliveFor       = 3 * time.Second
	heartbeatEvery = time.Second
	// aheadFloor and aheadSlots bound how far ahead a slot is handed out:
	// the larger of 10 s and 64 slots. A later slot is not taken; the
	// caller asks again (Reservation.AskAgain). A bucket further ahead
	// than twice that plus a burst is beyond what any caller could have
	// taken: it is corrupt (a failover to a node whose clock is behind)
	// and is reset.
	aheadFloor = 10 * time.Second
	aheadSlots = 64
	// parkSlack: a parking longer than retryhttp.MaxParking by more than
	// this is corrupt and is dropped.
	parkSlack = time.Minute

	learnBeta      = 0.9
	learnHold      = time.Second
	learnGrowEvery = time.Second
	learnStep      = 0.1
	learnNear      = 0.95
	learnNoise     = 0.1
	learnMinRate   = 0.5
	learnMaxRate   = 1_000_000
	learnTTL       = 60 * time.Second
	learnWatch     = 10 * time.Second
	learnHorizon   = 250 * time.Millisecond
	learnPlateau   = 2 * time.Second
	learnMaxWindow = 24 * time.Hour
	learnMaxAhead  = 10 * time.Second
)

func us(d time.Duration) int64 { return int64(d / time.Microsecond) }

// preludeLua is the start of every script: the clock, the host's state in
// S, and helpers that write back only what changed.
var preludeLua = strings.NewReplacer(
	"ALIVE", fmt.Sprint(us(aliveFor)),
	"MAXPARK", fmt.Sprint(us(retryhttp.MaxParking+parkSlack)),
	"HOLD", fmt.Sprint(us(learnHold)),
	"LTTL", fmt.Sprint(us(learnTTL)),
	"MAXRATE", fmt.Sprint(learnMaxRate),
).Replace(`
if redis.replicate_commands then pcall(redis.replicate_commands) end
local key = KEYS[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local S, dirty = {}, {}
local function load(F)
  local raw = redis.call('HMGET', key, unpack(F))
  for i = 1, #F do
    local x = tonumber(raw[i])
    if x and (x ~= x or x == math.huge or x == -math.huge) then x = nil; dirty[F[i]] = true end
    S[F[i]] = x
  end
end
-- The fields of what was learned are read only for a host that learned
-- something (st set): a host that never refused costs one short read.
load({'t','p','st','rt','gs','gc','gp','hb','n'})
if S.st then load({'r','an','q','ra','rf','hu','nr','bc','gr','b','lr','fs','fc','fp','w','sd'}) end
local function set(f, x) S[f] = x; dirty[f] = true end
local function num(x)
  if x == math.floor(x) and math.abs(x) < 9e15 then return string.format('%d', x) end
  return string.format('%.17g', x)
end
local LEARN = {'r','an','q','ra','st','rf','hu','nr','bc','gr','b','lr','fs','fc','fp','w','sd'}
local function forget()
  for _, f in ipairs(LEARN) do if S[f] then set(f, nil) end end
end
-- What no process on this clock can have written is dropped: moments of
-- the past that lie ahead (a failover to a node whose clock is behind),
-- a parking beyond the longest there is, rates out of range.
if S.p and S.p > now + MAXPARK then set('p', nil) end
if S.rt and S.rt > now + 60000000 then set('rt', nil) end
if (S.gs and S.gs > now + 1000000) or (S.gc and S.gc < 0) or (S.gp and S.gp < 0) then
  set('gs', nil); set('gc', nil); set('gp', nil)
end
if S.hb and S.hb > now + 1000000 then set('hb', nil) end
if S.st then
  for _, f in ipairs({'nr','gr','b','lr','fs'}) do
    if S[f] and S[f] > now + 1000000 then set(f, nil) end
  end
  if S.hu and S.hu > now + HOLD + 1000000 then set('hu', nil) end
  if (S.r and (S.r < 0 or S.r > MAXRATE)) or (S.an and (S.an < 0 or S.an > MAXRATE)) or S.st <= 0 or
     (S.fc and S.fc < 0) or (S.fp and S.fp < 0) then
    forget()
  end
end
-- save writes back what changed and sets the key to expire when nothing
-- in it matters any more.
local function save()
  local hs, hd = {}, {}
  for f in pairs(dirty) do
    if S[f] then hs[#hs + 1] = f; hs[#hs + 1] = num(S[f]) else hd[#hd + 1] = f end
  end
  if #hd == 0 and #hs == 0 then return end
  if #hd > 0 then redis.call('HDEL', key, unpack(hd)) end
  if #hs > 0 then redis.call('HSET', key, unpack(hs)) end
  local last = now
  if S.t and S.t > last then last = S.t end
  if S.p and S.p > last then last = S.p end
  if S.hb and S.hb + ALIVE > last then last = S.hb + ALIVE end
  if S.rt and S.rt > last then last = S.rt end
  if S.st and now + LTTL > last then last = now + LTTL end
  if last <= now then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, math.floor((last - now) / 1000) + 1)
  end
end
-- Two one-second bins, start sf, current cf, previous pf: count over the
-- last second, and add to it.
local function last(sf, cf, pf)
  local s = S[sf]
  if not s then return 0 end
  local d = now - s
  local c, p = S[cf] or 0, S[pf] or 0
  if d < 0 or d >= 2000000 then return 0 end
  if d >= 1000000 then p, c, d = c, 0, d - 1000000 end
  return c + p * (1 - d / 1000000)
end
local function add(sf, cf, pf, k)
  local s = S[sf]
  local d = -1
  if s then d = now - s end
  if d < 0 or d >= 2000000 then set(sf, now); set(cf, k); set(pf, 0); return end
  if d >= 1000000 then set(sf, s + 1000000); set(pf, S[cf] or 0); set(cf, k); return end
  set(cf, (S[cf] or 0) + k)
end
`)

// learnCommonLua holds what both reserveLua and learnLua need of the
// learned pace.
var learnCommonLua = strings.NewReplacer(
	"MAXIV", fmt.Sprint(us(maxInterval)),
	"MAXBURST", fmt.Sprint(maxBurst),
	"NEAR", fmt.Sprint(learnNear),
).Replace(`
-- learned: the interval in microseconds and the burst of the learned pace,
-- 0, 0 when none (the core's capacity.pace).
local function learned()
  local r = S.r or 0
  if r <= 0 then return 0, 0 end
  local iv = math.ceil(1000000 / r)
  if iv > MAXIV then iv = MAXIV end
  local b = 1
  if not S.rf and (S.q or 0) > 1 then b = math.min(S.q, MAXBURST) end
  return iv, b
end
-- ceiling: the fastest the learned pace may grow (capacity.ceiling).
local function ceiling()
  local an = S.an or 0
  if an == 0 then return math.huge end
  if (S.ra or 0) > 0 then return math.min(an, NEAR * S.ra) end
  return an
end
`)

// reserveLua takes one slot for a host, unless it is parked or the slot
// would come too late. The pace is the one the caller configured, or the
// learned one when slower.
//
//	ARGV[1]  the configured interval between slots in microseconds; 0: no
//	         pace configured
//	ARGV[2]  the configured burst
//	ARGV[3]  the longest wait accepted, in microseconds; empty: no bound
//	ARGV[4]  how far ahead, in microseconds, the caller's in-process
//	         pacer has handed out slots: the bucket is taken to be at
//	         least that full; empty: nothing to add
//	ARGV[5]  "" to take a slot; "c" to check the parking only; "r" to take
//	         a slot as a process just back from an outage
//	ARGV[6]  the caller's process id, to count it among the host's live
//	         processes; empty: not this time
//	ARGV[7]  after an outage, how long to give the other processes to come
//	         back, in microseconds
//
// It returns {code, wait, tat, lead, n, rank, rate, burst, interval}: code 0 when a
// slot was taken wait microseconds from now, tat being the bucket's state
// after it (for cancelScript); 1 when the slot would come after the bound
// (nothing taken); 2 when the host is parked for wait more microseconds; 3
// when the slot lies beyond the horizon and the caller should ask again in
// wait microseconds; 4 when processes are coming back from an outage and
// the caller paces its share in process for wait more microseconds. lead is
// how far ahead the bucket is (t - now), n the live processes at the last
// heartbeat of any, rank the caller's place among them when it beat (else
// -1), rate and burst the
// learned pace (rate in millionths a second, 0 for none), interval the
// pace's interval in microseconds (for cancelScript).
var reserveLua = preludeLua + learnCommonLua + strings.NewReplacer(
	"LHORIZON", fmt.Sprint(us(learnHorizon)),
	"AHEADFLOOR", fmt.Sprint(us(aheadFloor)),
	"AHEADSLOTS", fmt.Sprint(aheadSlots),
	"ALIVE", fmt.Sprint(us(aliveFor)),
	"GROWEVERY", fmt.Sprint(us(learnGrowEvery)),
	"PLATEAU", fmt.Sprint(us(learnPlateau)),
	"WATCH", fmt.Sprint(us(learnWatch)),
	"STEP", fmt.Sprint(learnStep),
	"NEAR", fmt.Sprint(learnNear),
).Replace(`
local ci, cb = tonumber(ARGV[1]), tonumber(ARGV[2])
local bound, ahead = tonumber(ARGV[3]), tonumber(ARGV[4])
local mode, id, win = ARGV[5], ARGV[6], tonumber(ARGV[7]) or 0
local eff, rank = 0, -1
local function answer(code, wait, tat)
  save()
  local lead = 0
  if S.t and S.t > now then lead = S.t - now end
  local _, lb = learned()
  return {code, wait, tat or 0, lead, S.n or 0, rank, math.floor((S.r or 0) * 1000000), lb, eff}
end
if S.p and S.p > now then return answer(2, S.p - now) end
if mode == 'c' then return answer(0, 0) end
-- The learned pace grows while requests queue for it, and is dropped when
-- it holds nothing back (the core's paceOf and grow).
if S.st then
  local r = S.r or 0
  if r == 0 and now - (S.lr or 0) >= WATCH then
    forget()
  elseif r > 0 and now >= (S.hu or 0) and now - (S.gr or 0) >= GROWEVERY then
    -- Requests queued lately: within a second, or within two slots and
    -- the horizon for a pace slower than that, whose callers ask less
    -- often than once a second.
    if now - (S.b or 0) < math.max(GROWEVERY, 2 * 1000000 / r + LHORIZON) then
      local step = S.st
      local nxt = r * (1 + step)
      local near = NEAR * (S.ra or 0)
      local grow = true
      if r < near and nxt >= near then
        nxt = near; set('st', STEP / 2); set('nr', now)
      elseif S.nr and now - S.nr < PLATEAU then
        grow = false
      else
        set('st', math.min(3 * step, 1))
      end
      if grow then set('r', math.min(nxt, ceiling())) end
    elseif (S.an or 0) == 0 and last('gs', 'gc', 'gp') < r / 2 and now - (S.lr or 0) >= WATCH then
      set('r', nil)
    end
    set('gr', now)
  end
end
local li, lb = learned()
local interval, burst, horizon = ci, cb, 0
if li > 0 then
  if ci <= 0 then
    interval, burst = li, lb
  else
    interval, burst = math.max(ci, li), math.min(cb, lb)
  end
  -- A learned pace may grow while requests wait: its slots are handed out
  -- no further ahead than a short horizon, so that those waiting get the
  -- faster pace when it comes.
  if interval ~= ci or burst ~= cb then horizon = LHORIZON end
end
eff = interval
if interval <= 0 then
  if S.st then add('gs', 'gc', 'gp', 1) end
  return answer(0, 0)
end
if id ~= '' then
  -- Places go by id, and an id starts with its process's start time: a
  -- process joining does not move the others, and after a restart of
  -- Redis the processes take back their places as they beat again.
  redis.call('HSET', key, 'a:' .. id, num(now))
  set('hb', now)
  local all = redis.call('HGETALL', key)
  local ids = {}
  for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, 2) == 'a:' then
      local at = tonumber(all[i + 1])
      if at and at > now - ALIVE and at <= now + 1000000 then
        ids[#ids + 1] = string.sub(f, 3)
      else
        redis.call('HDEL', key, f)
      end
    end
  end
  table.sort(ids)
  for i = 1, #ids do if ids[i] == id then rank = i - 1 end end
  set('n', #ids)
end
-- Coming back from an outage: the processes still pacing in process do so
-- until the moment rt, and so does every process until then; at rt they
-- all go back to the shared bucket, each telling it how far ahead it has
-- handed out slots (ahead).
if mode == 'r' and not (S.rt and S.rt > now) then set('rt', now + win + (S.n or 1) * interval) end
if S.rt then
  if S.rt > now then return answer(4, S.rt - now) end
  set('rt', nil)
end
local far = math.max(AHEADFLOOR, AHEADSLOTS * interval)
if horizon == 0 then horizon = far end
local tat = S.t
if tat and tat > now + 2 * far + burst * interval then tat = nil end
if not tat or tat < now then tat = now end
if ahead and tat < now + ahead then tat = now + ahead end
local wait = tat - (burst - 1) * interval - now
if wait < 0 then wait = 0 end
if S.st and wait >= interval then set('b', now) end
if wait > horizon and (not bound or wait <= bound) then return answer(3, wait - horizon) end
if bound and wait > bound then return answer(1, wait) end
tat = tat + interval
set('t', tat)
add('gs', 'gc', 'gp', 1)
return answer(0, wait, tat)
`)

// learnLua records what an answer from a host says of its capacity, as
// the core's localLimiter.Learn does, in the host's hash where every
// process sees it, and returns the learned pace.
//
//	ARGV[1]  "q" to only read the learned pace; "l" to learn
//	ARGV[2]  "1" when the answer refused (429, or 503 naming no wait)
//	ARGV[3]  the status
//	ARGV[4]  the wait a 429 named, in microseconds; 0: none
//	ARGV[5]  the announced quota; 0: none
//	ARGV[6]  the announced window, microseconds; 0: none
//	ARGV[7]  the time until the quota is whole again, microseconds; -1: not said
//	ARGV[8]  what remains of the quota; -1: not said
//	ARGV[9]  what the process sent in the last second, to every host, with
//	         its first refusal from the host; else 0
//
// It returns {rate, burst}, rate in millionths a second, 0 for none.
//
// A refusal cuts the shared pace once per hold period whichever process
// it reaches (hu guards it), to 0.9 of what Redis granted the host in the
// last second less what it refused: the count is of every process, not
// one process's Signal.Sent (which only seeds it for a host never counted).
var learnLua = preludeLua + learnCommonLua + strings.NewReplacer(
	"MAXWINDOW", fmt.Sprint(us(learnMaxWindow)),
	"MAXRATE", fmt.Sprint(learnMaxRate),
	"MINRATE", fmt.Sprint(learnMinRate),
	"MAXAHEAD", fmt.Sprint(us(learnMaxAhead)),
	"NEAR", fmt.Sprint(learnNear),
	"NOISE", fmt.Sprint(learnNoise),
	"BETA", fmt.Sprint(learnBeta),
	"STEP", fmt.Sprint(learnStep),
	"HOLD", fmt.Sprint(us(learnHold)),
).Replace(`
local function result()
  save()
  local _, lb = learned()
  return {math.floor((S.r or 0) * 1000000), lb}
end
if ARGV[1] ~= 'l' then return result() end
local refused, status, waitus = ARGV[2] == '1', tonumber(ARGV[3]), tonumber(ARGV[4])
local limit, window, reset = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local remaining, sent = tonumber(ARGV[8]), tonumber(ARGV[9])
if not S.st then set('st', STEP) end
-- What the host got before it was counted: at most what the processes
-- sent to every host, each telling it with its first refusal. A paced
-- host was counted all along.
if sent > 0 and (not S.gs or S.sd) then
  add('gs', 'gc', 'gp', sent)
  set('sd', 1)
end
if limit > 0 then
  -- The rate the host announces (the core's learnQuota).
  if window <= 0 and reset > 0 then
    local w = math.max(S.w or 0, math.floor(reset / 1000000 + 0.5) * 1000000, 1000000)
    set('w', w)
    window = w
  end
  local r = 0
  if window > 0 and window <= MAXWINDOW then r = limit / (window / 1000000) end
  if r > 0 and r <= MAXRATE then
    set('an', math.max(r, MINRATE))
    set('q', limit)
    local cur = S.r or 0
    if cur == 0 or cur > ceiling() then set('r', ceiling()) end
    if remaining >= 0 and (S.r or 0) > 0 then
      -- The bucket holds what remains at most.
      local iv, b = learned()
      local tol = (b - 1) * iv
      local lead = (b - math.min(remaining, b)) * iv
      if reset > 0 then lead = math.min(lead, reset + tol) end
      lead = math.min(lead, MAXAHEAD + tol)
      if (S.t or 0) < now + lead then set('t', now + lead) end
    end
  end
end
if refused then
  add('fs', 'fc', 'fp', 1)
  set('lr', now)
  -- The core's learnRefusal, on the counts of every process.
  local got, nref = last('gs', 'gc', 'gp'), last('fs', 'fc', 'fp')
  local r = S.r or 0
  local probing = r > 0 and r > NEAR * (S.ra or 0)
  local overload = waitus > 0 or status == 429 or ((nref >= 2 or probing) and nref >= NOISE * got)
  if overload then
    local accepted = math.max(got - nref, 0)
    if waitus > 0 then accepted = math.max(accepted, 1000000 / waitus) end
    accepted = math.max(accepted, MINRATE)
    local target = math.min(BETA * accepted, ceiling())
    if now < (S.hu or 0) then
      -- The refusals of the burst that made the cut, arriving after it,
      -- say more of what was accepted; so do the other processes' counts
      -- of what they sent, which may arrive after some of their
      -- refusals. The estimate follows either way (the core's, counting
      -- one process, only lowers it).
      if S.bc == 1 then
        set('ra', accepted)
        set('r', math.max(target, math.min(MINRATE, ceiling())))
      end
    else
      local bc = 0
      if r == 0 then bc = 1 end
      set('bc', bc); set('ra', accepted); set('rf', 1)
      if r > 0 then
        target = math.min(target, BETA * r)
        if (S.an or 0) > 0 then set('ra', r) end
      end
      set('st', STEP); set('hu', now + HOLD); set('gr', now); set('nr', nil)
      if bc == 1 and (S.t or 0) < now + HOLD then set('t', now + HOLD) end
      set('r', math.max(target, math.min(MINRATE, ceiling())))
    end
  end
end
return result()
`)

// cancelLua gives back a slot that reserveLua took, when no slot was taken
// after it: the bucket is then exactly as that reservation left it,
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

// parkLua parks a host for ARGV[1] more microseconds, unless it is already
// parked at least that long, and tells the processes listening on the
// channel ARGV[2] (none when empty) "rest host", host being ARGV[3]. It
// returns {1} when it extended the parking and {0} when an existing one
// already covered it.
var parkLua = preludeLua + `
local rest = tonumber(ARGV[1])
local untilp = now + rest
if S.p and S.p >= untilp then
  save()
  return {0}
end
set('p', untilp)
save()
if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[1] .. ' ' .. ARGV[3]) end
return {1}
`

var (
	reserveScript = redis.NewScript(reserveLua)
	parkScript    = redis.NewScript(parkLua)
	cancelScript  = redis.NewScript(cancelLua)
	learnScript   = redis.NewScript(learnLua)
)

// Script results, the first element of reserveScript's answer.
const (
	codeTaken    = 0
	codeLate     = 1
	codeParked   = 2
	codeAskAgain = 3
	codeLane     = 4
)
