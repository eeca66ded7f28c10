package redislimit

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
