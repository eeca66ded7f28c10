package redislimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// listenIdle is how long the listener waits for news before it pings the
// subscription; a ping not answered by the next wait marks the
// subscription as not delivering, so that checks go to Redis again.
const listenIdle = 5 * time.Second

// listen subscribes to the channel parkings are published on and records
// each in process, so that a request that waited for its slot learns of a
// parking set meanwhile by another process without asking Redis. While the
// subscription is known to deliver, l.sub holds its generation; anything
// that may have lost news (an error, a ping not answered) clears it, and a
// new subscription or an answer after it makes a new generation, so that
// hosts heard of under the old one are checked in Redis again. It runs
// until Close.
func (l *Limiter) listen() {
	var gen int64
	for {
		sub, err := l.subscriber()
		if err != nil {
			if !l.sleep(l.probe) {
				return
			}
			continue
		}
		l.psMu.Lock()
		if l.closed.Load() {
			l.psMu.Unlock()
			return
		}
		ps := sub.Subscribe(l.ctx, l.channel)
		l.ps = ps
		l.psMu.Unlock()
		stop := l.receive(ps, &gen)
		l.sub.Store(0)
		ps.Close()
		if stop || !l.sleep(l.probe) {
			return
		}
	}
}

// subscriber is the client to subscribe with: the Limiter's, or on a Ring
// the shard the Limiter places the channel on, which is where it
// publishes. (A Ring's own Subscribe would pick a shard of its own, and
// panics when it sees none up.)
func (l *Limiter) subscriber() (interface {
	Subscribe(context.Context, ...string) *redis.PubSub
}, error) {
	if !l.publish {
		return l.rdb, nil
	}
	c, err := l.client(l.serverFor(l.channel))
	if err != nil {
		return nil, err
	}
	return c.(*redis.Client), nil
}

// receive reads the subscription ps until it stops delivering, and reports
// whether to stop listening altogether. A subscription made afresh after
// one that delivered may follow a restart of the server that lost its
// parkings: those this process holds are put back.
func (l *Limiter) receive(ps *redis.PubSub, gen *int64) bool {
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(l.ctx, listenIdle)
		if l.ctx.Err() != nil {
			return true
		}
		if err != nil {
			if errorsIsTimeout(err) {
				if pinged {
					return false // no pong: subscribe afresh
				}
				pinged = true
				if ps.Ping(l.ctx) == nil {
					continue
				}
			}
			l.sub.Store(0)
			if permanent(err) {
				// A user without the channel in its ACL: checks go to
				// Redis, as with a Ring.
				if l.logger != nil {
					l.logger.LogAttrs(context.Background(), slog.LevelWarn,
						"redislimit: cannot subscribe to parkings; checking them in Redis instead",
						slog.String("channel", l.channel), slog.String("error", err.Error()))
				}
				return true
			}
			// go-redis dials again on the next receive; not in a loop
			// while Redis is away.
			if !l.sleep(l.probe) {
				return true
			}
			continue
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				*gen++
				l.sub.Store(*gen)
				if *gen > 1 {
					l.putBack(l.serverFor(l.channel))
				}
			}
		case *redis.Message:
			rest, host, ok := strings.Cut(m.Payload, " ")
			n, err := strconv.ParseInt(rest, 10, 64)
			if ok && err == nil && n > 0 {
				l.mem.park(host, time.Now().Add(time.Duration(n)*time.Microsecond))
			}
		}
	}
}

// sleep waits for d, and reports false if Close came first.
func (l *Limiter) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// checkPolicy logs a warning when Redis may evict the Limiter's keys. A
// Redis that does not let the Limiter read its configuration is not
// warned about.
func (l *Limiter) checkPolicy() {
	ctx, cancel := context.WithTimeout(l.ctx, max(l.timeout, time.Second))
	defer cancel()
	if err := l.policy(ctx); err != nil && l.logger != nil && errors.Is(err, ErrEvictionPolicy) {
		l.logger.LogAttrs(context.Background(), slog.LevelWarn,
			"redislimit: Redis may evict live parkings and buckets; set maxmemory-policy noeviction",
			slog.String("error", err.Error()))
	}
}

// policy reads Redis's maxmemory and maxmemory-policy from INFO memory and
// returns a *ConfigError when keys with a TTL may be evicted: maxmemory set
// and a policy other than noeviction. Every key of the Limiter has a TTL,
// so the volatile-* policies evict them as readily as the allkeys-* ones.
func (l *Limiter) policy(ctx context.Context) error {
	info, err := l.rdb.Info(ctx, "memory").Result()
	if err != nil {
		return err
	}
	var maxmemory, policy string
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "maxmemory":
			maxmemory = v
		case "maxmemory_policy":
			policy = v
		}
	}
	if maxmemory == "" || maxmemory == "0" || policy == "" || policy == "noeviction" {
		return nil
	}
	return &ConfigError{Setting: "maxmemory-policy", Value: policy,
		Want: "noeviction (or maxmemory 0): its keys all have a TTL and may otherwise be evicted while they matter"}
}

// checkHost is the host the Check calls use: no Transport names a host so.
const checkHost = "\x00check"

// Check runs each of the Limiter's scripts once against Redis and reads its
// configuration, and returns what it finds wrong, joined: a *RefusedError
// (ErrRedisRefused) for a missing ACL permission, wrong credentials or a
// command Redis refuses; a *ConfigError (ErrEvictionPolicy) for an eviction
// policy that may drop live keys; or Redis's error when it does not answer.
// It is meant for start-up, where a misconfiguration should stop a
// deployment rather than show as requests failing later. It writes one
// short-lived key, prefix + "\x00check". A nil rdb passes.
func (l *Limiter) Check(ctx context.Context) error {
	if l.closed.Load() {
		return ErrClosed
	}
	if l.rdb == nil {
		return nil
	}
	key := l.prefix + checkHost
	srv := l.serverFor(checkHost)
	wrap := func(op string, err error) error {
		if permanent(err) {
			return &RefusedError{Op: op, Key: key, Err: err}
		}
		return fmt.Errorf("redislimit: check: %s: %w", op, err)
	}
	var errs []error
	if _, err := l.run(ctx, srv, reserveScript, l.keys(srv, checkHost), 1, 1, "", "", "", l.id, 0, "1", 1, "", "", "", "", 0); err != nil {
		errs = append(errs, wrap("reserve", err))
		if !permanent(err) {
			return errors.Join(errs...) // Redis is away: nothing more to learn
		}
	}
	channel := l.channel
	if l.publish {
		channel = ""
	}
	one := []string{key}
	if _, err := l.run(ctx, srv, parkScript, one, 1, channel, checkHost); err != nil {
		errs = append(errs, wrap("park", err))
	}
	if _, err := l.run(ctx, srv, learnScript, one, "q", "0", 0, 0, 0, 0, -1, -1, "0"); err != nil {
		errs = append(errs, wrap("learn", err))
	}
	if _, err := l.run(ctx, srv, cancelScript, one, 0, 1); err != nil {
		errs = append(errs, wrap("cancel", err))
	}
	if _, err := l.run(ctx, srv, leaveScript, one, l.id, 0); err != nil {
		errs = append(errs, wrap("leave", err))
	}
	if srv.marker != "" {
		if _, err := l.run(ctx, srv, epochScript, []string{srv.marker}, "", 0); err != nil {
			errs = append(errs, wrap("epoch", err))
		}
	}
	if l.channel != "" {
		sub, err := l.subscriber()
		if err != nil {
			return errors.Join(append(errs, wrap("subscribe", err))...)
		}
		ps := sub.Subscribe(ctx, l.channel)
		sctx, cancel := context.WithTimeout(ctx, max(l.timeout, time.Second))
		_, err = ps.Receive(sctx)
		cancel()
		ps.Close()
		if err != nil {
			errs = append(errs, wrap("subscribe", err))
		}
	}
	pctx, cancel := context.WithTimeout(ctx, max(l.timeout, time.Second))
	defer cancel()
	if err := l.policy(pctx); errors.Is(err, ErrEvictionPolicy) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
