package redislimit

import (
	"fmt"
	"strings"
)

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
