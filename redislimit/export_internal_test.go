package redislimit

// PacedInProcess reports whether host is paced in process just now: its
// server (a Cluster's hash slot, a Ring's shard) failed and has not
// answered since. For the tests of the redislimit_test package.
func (l *Limiter) PacedInProcess(host string) bool {
	return l.rdb == nil || l.serverFor(host).down.Load()
}

// KeySlot is the Redis Cluster hash slot of key.
func KeySlot(key string) int { return keySlot(key) }
