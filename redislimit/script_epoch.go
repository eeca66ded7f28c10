package redislimit

// epochLua knows the server's epoch marker: the Redis time its data began
// (e), and until when keys new to the scripts wait (rec). A marker missing
// means the data is new: a first start, or a restart or flush that lost
// it. A process that knew another epoch has seen the loss: it opens a
// window of two probe intervals and two timeouts (win) in which a key new to
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

// epochCheckLua reads the epoch of the server whose marker is KEYS[1],
// for a process that made no other call to it lately: ARGV[1] the epoch
// it knew (empty: none), ARGV[2] the window to open if it changed. It
// returns {epoch, rec, now}.
var epochCheckLua = clockLua + epochLua + `
local e, rec = epochOf(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]) or 0)
return {e, rec, now}
`
