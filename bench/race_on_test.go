//go:build race

package bench

// raceEnabled reports a build with the race detector (go test -race).
const raceEnabled = true
