package redislimit

import (
	"fmt"
	"strings"
)

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
