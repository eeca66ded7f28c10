package redislimit

import (
	"fmt"
	"strings"
)

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
