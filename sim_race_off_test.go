//go:build !race

package retryhttp

// simRace reports a build with the race detector: the simulator runs
// fewer draws under it (see simDraws).
const simRace = false
