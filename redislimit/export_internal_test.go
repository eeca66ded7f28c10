package redislimit

import "time"

// PacedInProcess reports whether host is paced in process just now: its
// server (a Cluster's hash slot, a Ring's shard) failed and has not
// answered since. For the tests of the redislimit_test package.
func (l *Limiter) PacedInProcess(host string) bool {
	return l.rdb == nil || l.serverFor(host).down.Load()
}

// KeySlot is the Redis Cluster hash slot of key.
func KeySlot(key string) int { return keySlot(key) }

// Subscribed reports whether the parking subscription is known to deliver
// just now.
func (l *Limiter) Subscribed() bool { return l.sub.Load() > 0 }

// ParkingHeard reports whether the Limiter holds a parking of host in
// process just now (set by itself, or heard through the subscription),
// one that Reserve answers without a call.
func (l *Limiter) ParkingHeard(host string) bool {
	_, ok := l.mem.parkedUntil(host, time.Now())
	return ok
}
