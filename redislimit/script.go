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

// claimsLua is what reserveLua and leaveLua know of claims. A process that
// paces a host holds a claim on a share of it, a:ID = "deadline s": the
// moment by which it calls again if it still wants the host, and the
// share 1/s it paces at in process while it cannot reach Redis (0: none).
// The shares held add up to the pace at most (ts is their sum). A claim whose deadline has passed
// is away: its process may be pacing its share in process, cut off from
// Redis while the others still reach it, so the others leave that share
// alone for awayFor more. A process that stops wanting a host gives its
// claim back (leaveLua), and costs the others nothing.
var claimsLua = strings.NewReplacer(
	"AWAY", fmt.Sprint(us(awayFor)),
	"MAXLEASE", fmt.Sprint(us(maxLease)),
).Replace(`
local function claim(v)
  if not v then return nil end
  local d, c = string.match(v, '^(%d+) (%d+)$')
  if not d then return nil end
  return tonumber(d), tonumber(c)
end
-- recount counts the claims, me's being (d, cn), drops those dead or
-- corrupt, and sets n, the share ks of those away, the next moment kt one
-- of them changes state and the latest deadline hb. It returns the ids,
-- sorted: ids start with their process's start time, so places go by
-- joining, and after a loss of Redis's data the processes take back their
-- places as they come.
local function recount(me, d, cn)
  local all = redis.call('HGETALL', key)
  local ids, ks, ts, kt, hb = {}, 0, 0, nil, nil
  local function count(f, cd, c)
    ids[#ids + 1] = string.sub(f, 3)
    local part = 0
    if c and c > 0 then part = 1 / c end
    if f ~= me then ts = ts + part end
    local at = cd
    if cd < now then
      ks = ks + part
      at = cd + AWAY
    end
    if not kt or at < kt then kt = at end
    if not hb or cd > hb then hb = cd end
  end
  for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, 2) == 'a:' and f ~= me then
      local cd, c = claim(all[i + 1])
      if cd and cd + AWAY > now and cd <= now + MAXLEASE then
        count(f, cd, c)
      else
        redis.call('HDEL', key, f)
      end
    end
  end
  if me and d then count(me, d, cn) end
  table.sort(ids)
  if #ids == 0 then
    set('n', nil); set('ks', nil); set('kt', nil); set('hb', nil); set('ts', nil)
  else
    set('n', #ids); set('kt', kt); set('hb', hb)
    if ks > 0 then set('ks', ks) else set('ks', nil) end
  end
  return ids, ts
end
-- shareOf returns the share, as 1/s, that a process may pace at in
-- process, others being the shares the other claims hold: 1/n, or what
-- they leave when less. A process joining takes what the others do not
-- hold yet: their count grows as they call, and with it what is left. s
-- is 0 when nothing is left.
local function shareOf(others)
  local fs = math.min(1 / math.max(S.n or 1, 1), 1 - others)
  if fs <= 0.000001 then return 0 end
  return math.min(math.ceil(1 / fs - 0.000000001), 1000000)
end
`)

// epochLua knows the server's epoch marker: the Redis time its data began
// (e), and until when keys new to the scripts wait (rec). A marker missing
// means the data is new: a first start, or a restart or flush that lost
// it. A process that knew another epoch has seen the loss: it opens a
// window of a probe interval and two timeouts (win) in which a key new to
// the reserve script waits unless its caller brings what it knew of it,
// so that the processes holding a parking of it put it back first.
const epochLua = `
local function epochOf(mk, known, win)
  local m = redis.call('HMGET', mk, 'e', 'rec')
  local e, rec = tonumber(m[1]), tonumber(m[2])
  if not e then
    e = now
    redis.call('HSET', mk, 'e', num(e))
  end
  if known and known ~= e and (not rec or rec < now + win) then
    rec = now + win
    redis.call('HSET', mk, 'rec', num(rec))
  end
  return e, rec or 0
end
`

// reserveLua takes one slot for a host, unless it is parked or the slot
// would come too late. The pace is the one the caller configured, or the
// learned one when slower, of which the processes that reach Redis take
// the share not claimed by those away.
//
//	KEYS[2]  the server's epoch marker; absent with a Cluster
//	ARGV[1]  the configured interval between slots in microseconds; 0: no
//	         pace configured
//	ARGV[2]  the configured burst
//	ARGV[3]  the longest wait accepted, in microseconds; empty: no bound
//	ARGV[4]  how far ahead, in microseconds, the caller knows the bucket
//	         to be full, as Redis last told it (lost since, if Redis lost
//	         its data); empty: nothing to add
//	ARGV[5]  "" to take a slot; "c" to check the parking only; "p" for a
//	         probe from a process pacing in process: its claim is neither
//	         renewed nor made, and it takes no slot
//	ARGV[6]  the caller's process id; empty: it holds no claim (a check)
//	ARGV[7]  after a loss of Redis's data, how long to give the other
//	         processes to come back, in microseconds
//	ARGV[8]  "1" to recount the claims (the caller's place among them)
//	ARGV[9]  how long, in microseconds, until the caller calls again if it
//	         still wants the host: its claim's deadline from now
//	ARGV[10] the caller's bound on this call, on Redis's clock: a call
//	         that runs later is refused, its caller having given up on it;
//	         empty: none
//	ARGV[11] the bound after which the call does not renew the caller's
//	         claim; empty: none
//	ARGV[12] the epoch the caller knew for this server; empty: none
//	ARGV[13] "h" when the caller paced the host in process on its claim
//	         since its last answer, or held a claim that Redis lost; "k"
//	         when it holds a claim, as far as it knows; "w" when it waited
//	         for this server, holding no claim on the host; else empty
//	ARGV[14] the share the caller paces at in process, 1/ARGV[14] of the
//	         pace; 0: none
//
// It returns {code, wait, tat, lead, n, rank, rate, burst, interval,
// deadline, epoch, now, sd}: code 0 when a slot was taken wait microseconds
// from now, tat being the bucket's state after it (for cancelScript); 1
// when the slot would come after the bound (nothing taken); 2 when the
// host is parked for wait more microseconds; 3 when the caller should ask
// again in wait microseconds (the slot lies beyond the horizon, the
// processes away claim the whole pace, or the key is new while a loss of
// data is recovered, or processes are coming back from an outage and the
// caller had no share to pace); 4 when processes are coming back from a
// loss of their claims and the caller paces its share in process for wait
// more microseconds; 5 when the call came past its bound, and did nothing;
// 6 when a probe was answered (nothing taken); 7 when the host is down
// for wait more microseconds and another process has the probe (nothing
// taken).
// lead is how far ahead the bucket is (t - now), n the claims counted (0
// when the call did not look at them),
// rank the caller's place among them when it recounted (else -1), rate
// and burst the learned pace (rate in millionths a second, 0 for none),
// interval the interval of the slot taken in microseconds (for
// cancelScript), deadline the caller's claim's deadline on the server's
// clock, exactly as held (-1: none, -2: not looked at), epoch the server's, now the server's clock,
// and sd the caller's share of the pace in process, 1/sd (0: none).
var reserveLua = preludeLua + learnCommonLua + claimsLua + epochLua + strings.NewReplacer(
	"LHORIZON", fmt.Sprint(us(learnHorizon)),
	"AHEADFLOOR", fmt.Sprint(us(aheadFloor)),
	"AHEADSLOTS", fmt.Sprint(aheadSlots),
	"GROWEVERY", fmt.Sprint(us(learnGrowEvery)),
	"PLATEAU", fmt.Sprint(us(learnPlateau)),
	"WATCH", fmt.Sprint(us(learnWatch)),
	"STEP", fmt.Sprint(learnStep),
	"NEAR", fmt.Sprint(learnNear),
	"MAXIV", fmt.Sprint(us(maxInterval)),
	"AWAY", fmt.Sprint(us(awayFor)),
	"PROBE", fmt.Sprint(us(probeEvery)),
).Replace(`
local ci, cb = tonumber(ARGV[1]), tonumber(ARGV[2])
local bound, ahead = tonumber(ARGV[3]), tonumber(ARGV[4])
local mode, id, win = ARGV[5], ARGV[6], tonumber(ARGV[7]) or 0
local recnt, dl = ARGV[8] == '1', tonumber(ARGV[9]) or 0
local by, pby, known = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local had, waited = ARGV[13] == 'h', ARGV[13] == 'w'
local knew = had or ARGV[13] == 'k'
local held = tonumber(ARGV[14]) or 0
local eff, rank, mine, looked, epoch, rec, lane, sd = 0, -1, nil, false, 0, 0, nil, 0
local function answer(code, wait, tat)
  save()
  local lead = 0
  if S.t and S.t > now then lead = S.t - now end
  local _, lb = learned()
  local dl = -2
  if looked then dl = -1 end
  if mine then dl = mine end
  -- The count is told only by a call that looked at it: a check, answered
  -- before, knows nothing of processes coming back from an outage.
  local n = 0
  if looked then n = S.n or 0 end
  return {code, wait, tat or 0, lead, n, rank, math.floor((S.r or 0) * 1000000), lb, eff, dl, epoch, now, sd}
end
-- A call that comes after its caller gave up on it (a frozen server
-- waking, a link delivering late) would take a slot nobody uses, or tell
-- of a presence that has ended.
if by and now > by then return {5, 0, 0, 0, 0, -1, 0, 0, 0, -2, 0, now, 0} end
if KEYS[2] then epoch, rec = epochOf(KEYS[2], known, win) end
if S.p and S.p > now then return answer(2, S.p - now) end
if mode == 'c' then return answer(0, 0) end
-- A host some process holds down is handed back to every process, but for
-- one probe every PROBE among them all, until an answer gets through. A
-- probe due within a tenth of PROBE goes: the process whose probe set the
-- moment asks again a PROBE later by its own clock, and a call that
-- reaches Redis sooner than the last did would find it a moment early,
-- and lose its turn to a process that already lost its own.
if mode == '' and S.dn and S.dn > now then
  if S.dp and S.dp - now > PROBE / 10 then return answer(7, S.dn - now) end
  set('dp', now + PROBE)
end
-- A key new to the scripts just after a loss of Redis's data may be one
-- that was lost: its parking is being put back by those that hold it.
if rec > now and not (S.t or S.p or S.n or S.hb or S.st or S.dn) and not (ahead and ahead > 0) and not knew then
  return answer(3, rec - now)
end
-- The learned pace grows while requests queue for it, and is dropped when
-- it holds nothing back: demand far below it for a whole second of use.
-- A quiet spell is no such sign, and what was learned is kept through it
-- until the key expires, a minute after the last use.
if S.st then
  if last('gs', 'gc', 'gp') == 0 then set('ua', now) end
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
    elseif (S.an or 0) == 0 and now - (S.ua or now) >= GROWEVERY and last('gs', 'gc', 'gp') + 1 < r / 2 and
           now - (S.lr or 0) >= WATCH then
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
local share = 1
if id ~= '' then
  looked = true
  local me = 'a:' .. id
  local od, on = claim(redis.call('HGET', key, me))
  -- Coming back from an outage that lost the claims (a restart): the
  -- processes still pacing in process do so until the moment rt, and so
  -- does every process until then, at the share it had; at rt they all go
  -- back to the shared bucket, each once its slots in process have
  -- passed. The caller knows of such a loss when its own claim is gone,
  -- or when it waited out the outage with none and finds no claim at all,
  -- nor the sign of a lane held since the data began (rt stays, past).
  if not od and not (S.rt and S.rt > now) and (had or (waited and not S.n and not S.rt)) then
    set('rt', now + win + (S.n or 1) * interval)
  end
  -- So too while a loss of the server's data is recovered: until every
  -- process has come back and counted itself again, each paces the share
  -- it had, and one that had none waits.
  lane = math.max(S.rt or 0, rec)
  if lane <= now then lane = nil end
  local d, cn = od, on
  -- A probe may not get its answer in time; a call that came late may be
  -- one its caller gave up on: neither tells that the caller is here.
  local grow = false
  if mode ~= 'p' and not (pby and now > pby) and (od or knew or not lane) then
    d = now + dl
    if od and od > d then d = od end
    cn = nil
    if lane then
      -- In a lane the caller paces in process: away, holding the share
      -- it paces at, so that the first back on the bucket takes only its
      -- own when the lane ends.
      d = now - 1
      if held > 0 then cn = held end
    end
  elseif d and d + AWAY <= now then
    d = nil -- ended: recount drops it
  else
    -- The share of a claim not renewed may still grow: the others then
    -- leave more for a process that paces less, or not at all.
    grow = mode ~= 'p' and not lane
  end
  local others
  if recnt or (d and (not od or od < now)) or not S.n or not S.kt or now >= S.kt or not S.ts then
    local ids
    ids, others = recount(me, d, cn)
    if d then
      for i = 1, #ids do if ids[i] == id then rank = i - 1 end end
    end
  else
    others = (S.ts or 0)
    if on and on > 0 then others = others - 1 / on end
    if d and d > (S.hb or 0) then set('hb', d) end
  end
  if d then
    -- A renewed claim takes the share the others leave; one not renewed
    -- keeps its own, or a larger one.
    if not cn then
      cn = shareOf(others)
    elseif grow then
      local g = shareOf(others)
      if g > 0 and (cn == 0 or g < cn) then cn = g end
    end
    S[me] = string.format('%d %d', d, cn)
    dirty[me] = true
    mine, sd = d, cn
    local part = 0
    if cn > 0 then part = 1 / cn end
    set('ts', math.max(others, 0) + part)
  end
  -- The caller's own share, if it is away, is its to take.
  local own = 0
  if d and d < now and cn and cn > 0 then own = 1 / cn end
  share = 1 - ((S.ks or 0) - own)
end
if lane then
  if mine or knew then
    -- The slot the caller takes in process now, in its place in a round
    -- of the processes' slots, stays in the bucket: whoever takes the
    -- next slot in Redis when the lane ends comes after it. (A caller
    -- asks again only once its slots in process have passed.)
    local t = now + (S.n or 1) * interval
    if not S.t or S.t < t then set('t', t) end
    return answer(4, lane - now)
  end
  if bound and lane - now > bound then return answer(1, lane - now) end
  return answer(3, lane - now)
end
-- A probe answered says that Redis is back, and takes no slot: its caller
-- has slots of its own in process still to come, and asks again as a
-- process that is back once they have passed.
if mode == 'p' then return answer(6, 0) end
if share < 1 then
  if share <= 0.000001 then
    -- Those away claim the whole pace: wait for one to come back, or for
    -- the next claim to end.
    local w = math.max(math.min((S.kt or now) - now, 1000000), 1000)
    if bound and w > bound then return answer(1, w) end
    return answer(3, w)
  end
  interval = math.min(math.ceil(interval / share), MAXIV)
  burst = math.max(1, math.floor(burst * share))
  eff = interval
  -- The share grows back as those away come back: slots are handed out
  -- no further ahead than a short horizon, so that waiting requests get
  -- the whole pace when it comes.
  horizon = LHORIZON
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

// leaveLua gives back the claim of process ARGV[1] on a host it no longer
// wants, unless the process renewed it since it last set deadline ARGV[2]
// (a call crossed the goodbye). It returns {1} when it gave it back, else
// {0, deadline}, the deadline the claim holds (-1: none).
var leaveLua = preludeLua + claimsLua + `
local me = 'a:' .. ARGV[1]
local d = claim(redis.call('HGET', key, me))
if not d then return {0, -1} end
if d ~= tonumber(ARGV[2]) then return {0, d} end
redis.call('HDEL', key, me)
local _, ts = recount(nil, nil, nil)
if S.n then set('ts', ts) end
save()
return {1}
`

// epochCheckLua reads the epoch of the server whose marker is KEYS[1],
// for a process that made no other call to it lately: ARGV[1] the epoch
// it knew (empty: none), ARGV[2] the window to open if it changed. It
// returns {epoch, rec, now}.
var epochCheckLua = clockLua + epochLua + `
local e, rec = epochOf(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]) or 0)
return {e, rec, now}
`

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
//	ARGV[10] "d" when the process's host model holds the host down (dn:
//	         down for every process until DOWNMARK from now); "u" when an
//	         answer got through after it was (dn cleared); else empty
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
	"DOWNMARK", fmt.Sprint(us(downMark)),
).Replace(`
local function result()
  save()
  local _, lb = learned()
  return {math.floor((S.r or 0) * 1000000), lb}
end
-- A process's own host model holds the host down (d), or an answer got
-- through after it was (u).
if ARGV[10] == 'd' then
  set('dn', now + DOWNMARK)
elseif ARGV[10] == 'u' and S.dn then
  set('dn', nil); set('dp', nil)
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
