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
//	a:ID the claim of the process ID on a share of the host: "deadline s",
//	     the moment by which ID calls again if it still wants the host,
//	     and its share, 1/s, while it cannot reach Redis (see claimsLua)
//	n, ks, ts, kt, hb
//	     the claims counted: how many, the shares of those away and of
//	     all, the next moment one of them changes state, the latest
//	     deadline
//	rt   while set and ahead: processes come back from an outage that
//	     lost their claims, and each paces its own share in process until
//	     then (see reserveLua)
//	r, an, q, ra, st, rf, hu, nr, bc, gr, b, lr, fs, fc, fp, w, sd, ua
//	     the learned pace and what it was learned from: see learnLua
//	dn, dp
//	     the moment until which the host is down for every process (a
//	     process's host model found it down, and tells it again with each
//	     failed probe), and the next probe's: one probe every probeEvery
//	     among all the processes (see reserveLua and learnLua)
//
// Beside the hosts, each server holds one marker, prefix + "\x00epoch"
// (not with a Cluster, where a script reaches one slot only): when its
// data began, and until when keys new to the scripts wait for what the
// processes held of them to be put back (see epochLua).
//
// One key per host keeps every script on one slot in Redis Cluster. The key
// expires when nothing in it matters any more: the bucket full, the parking
// over, no claim held, nothing learned. Such a host is indistinguishable
// from one never seen, so idle hosts vanish.
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
	// downMark is how long a host a process's model found down stays down
	// for every process without word from it: that process probes it
	// every probeEvery and tells of each probe that fails, so a mark that
	// nobody renews (the host back, or its process gone) lapses within
	// two seconds.
	downMark = 2 * time.Second
	// probeEvery is the core's: one probe of a down host every half
	// second, among all the processes.
	probeEvery = 500 * time.Millisecond
	// awayFor is how long a claim outlives its deadline: a process that
	// stopped calling may be cut off from Redis and pacing its share in
	// process, so its share is kept for it this long. A process that
	// merely stopped wanting the host gives its claim back at once.
	awayFor = 30 * time.Second
	// heartbeatEvery is how often at least a process recounts the claims
	// of a host it calls, to learn its place among them (the rank of its
	// slots in process).
	heartbeatEvery = time.Second
	// presenceFloor is the least a claim's deadline lies ahead of a call,
	// and presenceMax the most, before the bucket's lead is added: twice
	// the process's gap between calls, within these bounds.
	presenceFloor = 100 * time.Millisecond
	presenceMax   = 3 * time.Second
	// presenceLate: a call that reaches Redis later than this after it was
	// sent (or the timeout, when shorter) does not renew its claim. Its
	// process may have given up on it and be pacing in process by now,
	// and must know how long the others may still count it as present.
	presenceLate = 50 * time.Millisecond
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

// maxLease bounds how far ahead a claim's deadline can lie.
const maxLease = 2*presenceMax + aheadFloor

func us(d time.Duration) int64 { return int64(d / time.Microsecond) }

// clockLua starts every script: the server's clock, and a writer of
// numbers.
const clockLua = `
if redis.replicate_commands then pcall(redis.replicate_commands) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local function num(x)
  if x == math.floor(x) and math.abs(x) < 9e15 then return string.format('%d', x) end
  return string.format('%.17g', x)
end
`

// preludeLua is the start of every script on a host: the clock, the host's
// state in S, and helpers that write back only what changed.
var preludeLua = clockLua + strings.NewReplacer(
	"AWAY", fmt.Sprint(us(awayFor)),
	"MAXLEASE", fmt.Sprint(us(maxLease)),
	"LANEKEEP", fmt.Sprint(us(aheadFloor)),
	"MAXPARK", fmt.Sprint(us(retryhttp.MaxParking+parkSlack)),
	"HOLD", fmt.Sprint(us(learnHold)),
	"LTTL", fmt.Sprint(us(learnTTL)),
	"MAXRATE", fmt.Sprint(learnMaxRate),
	"DOWNMARK", fmt.Sprint(us(downMark)),
	"PROBE", fmt.Sprint(us(probeEvery)),
).Replace(`
local key = KEYS[1]
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
load({'t','p','st','rt','gs','gc','gp','hb','n','ks','kt','ts','dn','dp'})
if S.st then load({'r','an','q','ra','rf','hu','nr','bc','gr','b','lr','fs','fc','fp','w','sd','ua'}) end
local function set(f, x) S[f] = x; dirty[f] = true end
local LEARN = {'r','an','q','ra','st','rf','hu','nr','bc','gr','b','lr','fs','fc','fp','w','sd','ua'}
local function forget()
  for _, f in ipairs(LEARN) do if S[f] then set(f, nil) end end
end
-- What no process on this clock can have written is dropped: moments of
-- the past that lie ahead (a failover to a node whose clock is behind),
-- a parking beyond the longest there is, rates out of range.
if S.p and S.p > now + MAXPARK then set('p', nil) end
if S.dn and S.dn > now + DOWNMARK + 1000000 then set('dn', nil) end
if S.dp and S.dp > now + PROBE + 1000000 then set('dp', nil) end
if S.rt and S.rt > now + 60000000 then set('rt', nil) end
if (S.gs and S.gs > now + 1000000) or (S.gc and S.gc < 0) or (S.gp and S.gp < 0) then
  set('gs', nil); set('gc', nil); set('gp', nil)
end
if (S.hb and S.hb > now + MAXLEASE + 1000000) or (S.kt and S.kt > now + MAXLEASE + AWAY + 1000000) or
   (S.ks and (S.ks < 0 or S.ks > (S.n or 0))) or (S.ts and (S.ts < 0 or S.ts > (S.n or 0))) then
  set('hb', nil); set('kt', nil); set('ks', nil); set('ts', nil) -- the claims are counted afresh
end
if S.st then
  for _, f in ipairs({'nr','gr','b','lr','fs','ua'}) do
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
    local x = S[f]
    if type(x) == 'string' then
      hs[#hs + 1] = f; hs[#hs + 1] = x
    elseif x then
      hs[#hs + 1] = f; hs[#hs + 1] = num(x)
    else
      hd[#hd + 1] = f
    end
  end
  if #hd == 0 and #hs == 0 then return end
  if #hd > 0 then redis.call('HDEL', key, unpack(hd)) end
  if #hs > 0 then redis.call('HSET', key, unpack(hs)) end
  local last = now
  if S.t and S.t > last then last = S.t end
  if S.p and S.p > last then last = S.p end
  if S.dn and S.dn > last then last = S.dn end
  if S.hb and S.hb + AWAY > last then last = S.hb + AWAY end
  -- A lane held stays a while as a sign of it, that no process waiting
  -- opens another as it ends.
  if S.rt and S.rt + LANEKEEP > last then last = S.rt + LANEKEEP end
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

var (
	reserveScript = redis.NewScript(reserveLua)
	parkScript    = redis.NewScript(parkLua)
	cancelScript  = redis.NewScript(cancelLua)
	learnScript   = redis.NewScript(learnLua)
	leaveScript   = redis.NewScript(leaveLua)
	epochScript   = redis.NewScript(epochCheckLua)
)

// Script results, the first element of reserveScript's answer.
const (
	codeTaken    = 0
	codeLate     = 1
	codeParked   = 2
	codeAskAgain = 3
	codeLane     = 4
	codeStale    = 5
	codeProbed   = 6
	codeDown     = 7
)
